"""The prepared-claims checkpoint: ``<state_dir>/checkpoint.json``.

Format (JSON object, version 1)::

    {"version": 1,
     "nodeBootID": "<contents of /proc/sys/kernel/random/boot_id>",
     "claims": {"<claim uid>": {
        "state": "PrepareStarted" | "PrepareCompleted",
        "namespace": "...", "name": "...",
        "devices": [{"requestNames": [...], "poolName": "...", "deviceName": "...",
                     "cdiDeviceIds": [...], "shareId": "..."?, "adminAccess": false}],
        "applied": {"cdiSpec": "<path>", "timeSlicing": [<uuid>...],
                    "computeMode": [<uuid>...], "mps": [{"id": "...", "uuids": [...]}]}}}}

Compatibility rules: readers ignore fields they do not know and *preserve* them
when they rewrite the file (entries are edited in place), so a newer plugin's
additions survive a downgrade and an upgrade never sees an "invalid" old file.
``version`` changes only for incompatible changes; a file with a higher version
is refused rather than misread. There is deliberately no checksum: a checksum
over re-serialised data breaks on every added field (NVIDIA #1080, #1119).

Two-phase prepare: an entry is written as ``PrepareStarted`` *with the plan*
(what will be applied) before anything is applied, and becomes
``PrepareCompleted`` with the result at the end. A process killed in between
leaves a ``PrepareStarted`` entry; the next prepare or unprepare of that claim
rolls the plan back first (every undo step is idempotent).

Reboots: ``nodeBootID`` differs after a reboot. Prepared state from before the
reboot is then stale (device state and daemons are gone, ``/var/run/cdi`` is
usually cleared); it is dropped, and the preparer removes leftover files but
never signals PIDs recorded in a previous boot.

Concurrency: every read-modify-write happens under an exclusive ``flock`` on
``checkpoint.lock`` (waits up to ``lock_timeout`` seconds), so two plugin
processes during an upgrade, or concurrent claims, never interleave. Writes
are atomic (temp file in the same dir, fsync, rename, fsync dir), mode 0600.

Corrupt file (not JSON, not an object, wrong types): every prepare and
unprepare fails with :class:`CheckpointCorruptError` naming the file; nothing
is overwritten automatically, because the file is the only record of what must
be undone. Recovery: stop the plugin, move the file aside (keep it for the bug
report), start the plugin. The kubelet then re-sends prepare for running pods
(recreating their state) and unprepare for finished ones; unprepare of a claim
the checkpoint does not know still removes that claim's CDI spec and MPS
directories, because their paths derive from the claim UID.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_driver.gpu.cdi import CdiError, temp_files_for, write_atomic
from dra_driver.plugin.backend import PreparedDevice

VERSION = 1
STARTED = "PrepareStarted"
COMPLETED = "PrepareCompleted"
FILE_NAME = "checkpoint.json"
LOCK_NAME = "checkpoint.lock"


class CheckpointError(Exception):
    """The checkpoint cannot be read, locked or written."""


class CheckpointCorruptError(CheckpointError):
    """The file exists but is not a checkpoint we can read; see the module docstring."""


@dataclass
class Checkpoint:
    """The decoded file; ``claims`` values are the raw entries, edited in place."""

    raw: dict[str, Any]
    stale: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Claims recorded in a previous boot, dropped from ``claims``; clean their files."""

    @property
    def claims(self) -> dict[str, dict[str, Any]]:
        claims: dict[str, dict[str, Any]] = self.raw.setdefault("claims", {})
        return claims


def devices_to_json(devices: list[PreparedDevice], admin: dict[str, bool]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for d in devices:
        entry: dict[str, Any] = {
            "requestNames": list(d.request_names),
            "poolName": d.pool_name,
            "deviceName": d.device_name,
            "cdiDeviceIds": list(d.cdi_device_ids),
            "adminAccess": admin.get(d.device_name, False),
        }
        if d.share_id is not None:
            entry["shareId"] = d.share_id
        out.append(entry)
    return out


def devices_from_json(entry: dict[str, Any]) -> list[PreparedDevice]:
    return [
        PreparedDevice(
            request_names=tuple(d.get("requestNames", ())),
            pool_name=d["poolName"],
            device_name=d["deviceName"],
            cdi_device_ids=tuple(d.get("cdiDeviceIds", ())),
            share_id=d.get("shareId"),
        )
        for d in entry.get("devices", ())
    ]


class CheckpointStore:
    def __init__(self, *, state_dir: Path, boot_id_path: Path, lock_timeout: float = 10.0) -> None:
        self.path = state_dir / FILE_NAME
        self._lock_path = state_dir / LOCK_NAME
        self._boot_id_path = boot_id_path
        self._lock_timeout = lock_timeout
        self._state_dir = state_dir

    def boot_id(self) -> str:
        try:
            return self._boot_id_path.read_text().strip()
        except OSError as exc:
            raise CheckpointError(f"read boot ID {self._boot_id_path}: {exc.strerror}") from exc

    @contextlib.contextmanager
    def locked(self) -> Iterator[Checkpoint]:
        """Hold the node-wide lock and yield the current checkpoint."""
        try:
            self._state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise CheckpointError(f"open lock {self._lock_path}: {exc.strerror}") from exc
        try:
            deadline = time.monotonic() + self._lock_timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise CheckpointError(
                            f"{self._lock_path} is held by another process for more than "
                            f"{self._lock_timeout:g}s; is a second plugin instance stuck?"
                        ) from None
                    time.sleep(0.01)
            for tmp in temp_files_for(self.path):
                tmp.unlink(missing_ok=True)
            yield self._load()
        finally:
            os.close(fd)  # closing the only descriptor releases the flock

    def _load(self) -> Checkpoint:
        boot_id = self.boot_id()
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return Checkpoint({"version": VERSION, "nodeBootID": boot_id, "claims": {}})
        except OSError as exc:
            raise CheckpointError(f"read {self.path}: {exc.strerror}") from exc
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise self._corrupt(f"not valid JSON ({exc})") from exc
        if not isinstance(raw, dict):
            raise self._corrupt("top level is not a JSON object")
        version = raw.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise self._corrupt(f"'version' is {version!r}, expected an integer >= 1")
        if version > VERSION:
            raise CheckpointError(
                f"{self.path} has version {version}, written by a newer incompatible plugin; "
                f"this plugin reads version {VERSION}. Roll forward, or move the file aside."
            )
        claims = raw.get("claims", {})
        if not isinstance(claims, dict) or not all(isinstance(v, dict) for v in claims.values()):
            raise self._corrupt("'claims' is not an object of objects")
        if raw.get("nodeBootID") != boot_id:
            raw["nodeBootID"] = boot_id
            raw["claims"] = {}
            return Checkpoint(raw, stale=claims)
        return Checkpoint(raw)

    def _corrupt(self, what: str) -> CheckpointCorruptError:
        return CheckpointCorruptError(
            f"checkpoint {self.path} is corrupt: {what}. Prepare and unprepare are refused so "
            "no state is lost; recovery: stop the plugin, move the file aside, start it again "
            "(see dra_driver.gpu.checkpoint)."
        )

    def save(self, checkpoint: Checkpoint) -> None:
        checkpoint.raw["version"] = max(VERSION, int(checkpoint.raw.get("version", VERSION)))
        data = (json.dumps(checkpoint.raw, indent=1, sort_keys=True) + "\n").encode()
        try:
            write_atomic(self.path, data, mode=0o600)
        except CdiError as exc:
            raise CheckpointError(str(exc)) from exc
