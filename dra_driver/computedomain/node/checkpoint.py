"""The compute-domain plugin's checkpoint: which claims it prepared, and how far.

``<state_dir>/checkpoint.json``, version 1, compact JSON, mode 0600::

    {"version": 1, "bootID": "<kernel boot id>",
     "claims": {"<claim uid>": {
         "namespace": "...", "name": "...",
         "kind": "channel" | "daemon", "domainID": "<ComputeDomain uid>",
         "allocationMode": "Single" | "All",          # channels only
         "state": "PrepareStarted" | "PrepareCompleted",
         "devices": [{"request": "...", "device": "channel-0", "cdiIDs": ["..."]}]}}}

An entry is written *before* the first side effect of a prepare (the node label, a
host directory, a CDI spec), so every side effect a SIGKILL can leave behind belongs
to an entry: a retried prepare redoes each step (all idempotent), an unprepare undoes
each one, and the plugin lists it as prepared for the stale-claim cleanup. The entry
goes only after its last side effect is undone. ``devices`` is set with
``PrepareCompleted``; nothing else is stored that a prepare can recompute.

Compatibility: readers accept version 1 and refuse anything newer by name; a new
field must be optional, so older plugins (which ignore fields they do not know) still
read what newer ones write. A file from another boot (``bootID`` differs) describes
CDI specs under ``/var/run/cdi`` that the reboot removed: its claims are dropped, and
the kubelet prepares the running pods' claims again. A corrupt file is never
overwritten (:class:`CheckpointCorruptError`): it is the only record of what to undo.

Writes go through the spare file and an exchange under the ``checkpoint`` lock
(:func:`~dra_driver.gpu.host.files.write_via_spare`): readers and a SIGKILL see the
old or the new content, never a mix.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from dra_driver.errors import DriverError
from dra_driver.gpu.host.files import NodeLocks, read_whole, write_via_spare

VERSION = 1
FILE_NAME = "checkpoint.json"
SPARE_NAME = "checkpoint.json.spare"
STARTED: Final = "PrepareStarted"
COMPLETED: Final = "PrepareCompleted"
Kind = Literal["channel", "daemon"]


class CheckpointError(DriverError):
    """The checkpoint cannot be read or written."""


class CheckpointCorruptError(CheckpointError):
    """The file exists but is not a checkpoint this plugin can read."""


@dataclass(frozen=True)
class Device:
    request: str
    device: str
    cdi_ids: tuple[str, ...]


@dataclass
class Entry:
    namespace: str
    name: str
    kind: Kind
    domain_id: str
    allocation_mode: str = "Single"
    state: str = STARTED
    devices: tuple[Device, ...] = ()

    @property
    def completed(self) -> bool:
        return self.state == COMPLETED


@dataclass
class Checkpoint:
    boot_id: str
    claims: dict[str, Entry] = field(default_factory=dict)

    def domain_claims(self, kind: Kind, domain_id: str, *, besides: str = "") -> list[str]:
        """UIDs of this node's claims of one kind for one domain, other than ``besides``."""
        return [
            uid for uid, e in self.claims.items()
            if e.kind == kind and e.domain_id == domain_id and uid != besides
        ]  # fmt: skip


def encode(cp: Checkpoint) -> bytes:
    claims: dict[str, Any] = {}
    for uid, e in sorted(cp.claims.items()):
        out: dict[str, Any] = {"namespace": e.namespace, "name": e.name, "kind": e.kind,
                               "domainID": e.domain_id, "state": e.state}  # fmt: skip
        if e.kind == "channel":
            out["allocationMode"] = e.allocation_mode
        if e.devices:
            out["devices"] = [{"request": d.request, "device": d.device,
                               "cdiIDs": list(d.cdi_ids)} for d in e.devices]  # fmt: skip
        claims[uid] = out
    body = {"version": VERSION, "bootID": cp.boot_id, "claims": claims}
    return (json.dumps(body, separators=(",", ":")) + "\n").encode()


def decode(data: bytes, where: str) -> Checkpoint:
    """Raises :class:`CheckpointCorruptError` naming the file and the field."""
    try:
        body = json.loads(data)
        if not isinstance(body, dict):
            raise ValueError("not a JSON object")
        version = body.get("version")
        if version != VERSION:
            raise ValueError(f"version {version!r}; this plugin reads version {VERSION}")
        claims: dict[str, Entry] = {}
        for uid, raw in (body.get("claims") or {}).items():
            if raw.get("kind") not in ("channel", "daemon"):
                raise ValueError(f"claims.{uid}.kind: {raw.get('kind')!r}")
            if raw.get("state") not in (STARTED, COMPLETED):
                raise ValueError(f"claims.{uid}.state: {raw.get('state')!r}")
            claims[uid] = Entry(
                namespace=str(raw["namespace"]),
                name=str(raw["name"]),
                kind=raw["kind"],
                domain_id=str(raw["domainID"]),
                allocation_mode=str(raw.get("allocationMode", "Single")),
                state=raw["state"],
                devices=tuple(
                    Device(str(d["request"]), str(d["device"]), tuple(map(str, d["cdiIDs"])))
                    for d in raw.get("devices") or ()
                ),
            )
        return Checkpoint(boot_id=str(body["bootID"]), claims=claims)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointCorruptError(
            f"{where} is corrupt ({exc!r}); it records what must be undone, so it is not "
            "replaced: stop the plugin, move it aside, start the plugin"
        ) from exc


class CheckpointStore:
    """Read-modify-write of the file under one lock (shared with a second instance)."""

    def __init__(self, *, state_dir: Path, boot_id_file: Path, lock_timeout_s: float = 10.0):
        self.path = state_dir / FILE_NAME
        self._spare = state_dir / SPARE_NAME
        self._state_dir = state_dir
        self._boot_id_file = boot_id_file
        self._locks = NodeLocks(state_dir)
        self._timeout_s = lock_timeout_s

    def close(self) -> None:
        self._locks.close()

    def boot_id(self) -> str:
        try:
            return read_whole(self._boot_id_file).decode(errors="replace").strip()
        except OSError as exc:
            raise CheckpointError(f"read boot ID {self._boot_id_file}: {exc.strerror}") from exc

    def read(self) -> tuple[Checkpoint, list[str]]:
        """The checkpoint, and the UIDs of claims dropped because they were prepared
        before the last reboot (their CDI specs may still need removing)."""
        boot = self.boot_id()
        try:
            data = read_whole(self.path)
        except FileNotFoundError:
            return Checkpoint(boot_id=boot), []
        except OSError as exc:
            raise CheckpointError(f"read {self.path}: {exc.strerror}") from exc
        cp = decode(data, str(self.path))
        if cp.boot_id != boot:
            return Checkpoint(boot_id=boot), sorted(cp.claims)
        return cp, []

    def write(self, cp: Checkpoint) -> None:
        write_via_spare(self.path, self._spare, encode(cp), mode=0o600)

    @contextmanager
    def transaction(self) -> Iterator[Checkpoint]:
        """Hold the lock; yields the checkpoint; :meth:`write` saves changes."""
        try:
            self._state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise CheckpointError(f"create {self._state_dir}: {exc.strerror}") from exc
        with self._locks.hold(["checkpoint"], timeout_s=self._timeout_s):
            cp, _ = self.read()
            yield cp
