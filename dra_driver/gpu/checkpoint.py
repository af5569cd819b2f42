"""The prepared-claims checkpoint: typed entries, the JSON format, the v1 migration.

Format (``<state_dir>/checkpoint.json``, version 2)::

    {"version": 2,
     "nodeBootID": "<contents of /proc/sys/kernel/random/boot_id>",
     "claims": {"<claim uid>": {
        "state": "Preparing" | "Prepared" | "Unpreparing",
        "namespace": "...", "name": "...",
        "devices": [{"request": "gpu" | "gpu/sub", "pool": "...", "device": "gpu-0",
                     "adminAccess": false, "shareID": "..."?, "consumedCapacity": {...},
                     "cdiDeviceIDs": ["k8s.gpu.nvidia.com/claim=<uid>-gpu-0"]}],
        "units": [{"strategy": "MPS", "devices": ["gpu-0"], "gpus": ["GPU-..."],
                   "shared": [], "record": {...strategy's own...}}],
        "error": "<why the last teardown did not finish>"?}},
     "shared": {"gpu-0/mps": {"strategy": "...", "state": "Acquiring" | "Ready" |
                              "Releasing", "record": {...}}}}

States, each written before the step it announces: ``Preparing`` (devices and
every unit recorded, nothing applied yet, or some of it), ``Prepared`` (every
unit applied; the CDI spec is written right after, and a claim counts as
prepared only while its spec exists, so ``Prepared`` without a spec is an
interrupted prepare), ``Unpreparing`` (teardown started, or a rollback that did
not finish: never reported as prepared; its devices stay reserved until the
teardown completes). A claim without units has nothing to undo but its spec:
it is recorded ``Prepared`` at once and dropped after its spec is removed.

Entries are frozen: a change is a new entry put in the checkpoint's dict. That
lets a transaction start from a shallow copy of the last checkpoint read or
saved, and lets :class:`Encoder` reuse the JSON of every entry it wrote before,
so a transaction costs O(changed entries), not O(claims on the node), in
Python (the file itself is still rewritten whole).

Compatibility: unknown fields at any level are kept and written back, so a
newer plugin's additions survive a rewrite by this one. Version 1 files (plugin
0.1, ``PrepareStarted``/``PrepareCompleted`` and an ``applied`` summary) are
migrated on read (:func:`migrate_v1`); a higher version is refused, never
misread. A malformed entry makes the whole file :class:`CheckpointCorruptError`
with the path of the bad field: it is the only record of what must be undone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from dra_driver.errors import DriverError

VERSION = 2
ClaimState = Literal["Preparing", "Prepared", "Unpreparing"]
PREPARING: ClaimState = "Preparing"
PREPARED: ClaimState = "Prepared"
UNPREPARING: ClaimState = "Unpreparing"
SharedState = Literal["Acquiring", "Ready", "Releasing"]
ACQUIRING: SharedState = "Acquiring"
READY: SharedState = "Ready"
RELEASING: SharedState = "Releasing"
_E = TypeVar("_E")
_UID = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True)
class Unit:
    """What one strategy does for some devices of one claim; JSON in the checkpoint."""

    strategy: str
    """Name of the strategy that planned it (selects the strategy for undo)."""
    devices: tuple[str, ...]
    """Names of the claim's devices whose CDI edits it changes."""
    gpus: tuple[str, ...] = ()
    """UUIDs of GPUs whose settings it changes; two units never change one GPU."""
    record: Mapping[str, Any] = field(default_factory=dict)
    """Everything the strategy's ``undo`` needs, JSON-serialisable."""
    shared: tuple[str, ...] = ()
    """Per-node shared resources it uses, ``<GPU name>/<what>`` of a claim's (locked) GPU."""


class CheckpointError(DriverError):
    """The checkpoint cannot be locked, read or written."""


class CheckpointCorruptError(CheckpointError):
    """The file exists but is not a checkpoint we can trust."""


@dataclass(frozen=True)
class DeviceRecord:
    """One allocated device of a claim and what the kubelet got for it."""

    request: str
    pool: str
    device: str
    admin_access: bool = False
    share_id: str | None = None
    consumed_capacity: Mapping[str, str] = field(default_factory=dict)
    cdi_device_ids: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ClaimEntry:
    """Frozen, and so are its parts (mappings are never changed in place): change
    one with :func:`dataclasses.replace` and put the result in the checkpoint."""

    state: ClaimState
    namespace: str
    name: str
    devices: tuple[DeviceRecord, ...]
    units: tuple[Unit, ...]
    error: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)
    unit_extras: tuple[Mapping[str, Any], ...] = ()
    """Unknown fields of each unit, kept for the rewrite."""

    def shared_keys(self) -> set[str]:
        return {key for unit in self.units for key in unit.shared}


@dataclass(frozen=True)
class SharedEntry:
    """A per-node resource used by the units of one or more claims."""

    strategy: str
    state: SharedState
    record: Mapping[str, Any] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class Checkpoint:
    """Its dicts are the caller's to change (entries are replaced, never changed)."""

    boot_id: str
    claims: dict[str, ClaimEntry] = field(default_factory=dict)
    shared: dict[str, SharedEntry] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)

    def users_of(self, key: str) -> list[str]:
        """UIDs of the claims whose units use shared resource ``key``."""
        return [uid for uid, e in self.claims.items() if key in e.shared_keys()]

    def copy(self) -> Checkpoint:
        """New dicts, the same (frozen) entries: what a transaction may change."""
        return Checkpoint(self.boot_id, dict(self.claims), dict(self.shared), self.extra)


# -- decoding -------------------------------------------------------------------------


class _Reader:
    """Typed access to one JSON object; every failure names the field's path."""

    def __init__(self, raw: object, path: str, known: tuple[str, ...]) -> None:
        if not isinstance(raw, dict):
            raise CheckpointCorruptError(f"{path}: expected an object, got {_show(raw)}")
        self.raw, self.path = raw, path
        self.extra = {k: v for k, v in raw.items() if k not in known}

    def get(self, key: str, kind: type, default: Any = ...) -> Any:
        value = self.raw.get(key, default)
        bad = value is ... or not isinstance(value, kind)
        if bad or (isinstance(value, bool) and kind is not bool):
            if value is None and default is None:
                return None
            raise CheckpointCorruptError(
                f"{self.path}.{key}: expected {kind.__name__}, got {_show(value)}"
            )
        return value

    def strings(self, key: str) -> tuple[str, ...]:
        values = self.get(key, list, [])
        if not all(isinstance(v, str) for v in values):
            raise CheckpointCorruptError(f"{self.path}.{key}: expected a list of strings")
        return tuple(values)


def _show(value: object) -> str:
    return "nothing" if value is ... else repr(value)[:60]


def _state(value: str, path: str, allowed: tuple[str, ...]) -> Any:
    if value not in allowed:
        raise CheckpointCorruptError(f"{path}: {value!r}; expected one of {', '.join(allowed)}")
    return value


def _device(raw: object, path: str) -> DeviceRecord:
    known = ("request", "pool", "device", "adminAccess", "shareID", "consumedCapacity",
             "cdiDeviceIDs")  # fmt: skip
    r = _Reader(raw, path, known)
    capacity = r.get("consumedCapacity", dict, {})
    return DeviceRecord(
        request=r.get("request", str),
        pool=r.get("pool", str),
        device=r.get("device", str),
        admin_access=r.get("adminAccess", bool, False),
        share_id=r.get("shareID", str, None),
        consumed_capacity={str(k): str(v) for k, v in capacity.items()},
        cdi_device_ids=r.strings("cdiDeviceIDs"),
        extra=r.extra,
    )


def _unit(raw: object, path: str) -> tuple[Unit, dict[str, Any]]:
    r = _Reader(raw, path, ("strategy", "devices", "gpus", "shared", "record"))
    unit = Unit(
        strategy=r.get("strategy", str),
        devices=r.strings("devices"),
        gpus=r.strings("gpus"),
        shared=r.strings("shared"),
        record=r.get("record", dict, {}),
    )
    return unit, r.extra


def _claim(raw: object, path: str) -> ClaimEntry:
    known = ("state", "namespace", "name", "devices", "units", "error")
    r = _Reader(raw, path, known)
    units = [_unit(u, f"{path}.units[{i}]") for i, u in enumerate(r.get("units", list, []))]
    return ClaimEntry(
        state=_state(r.get("state", str), f"{path}.state", (PREPARING, PREPARED, UNPREPARING)),
        namespace=r.get("namespace", str, ""),
        name=r.get("name", str, ""),
        devices=tuple(
            _device(d, f"{path}.devices[{i}]") for i, d in enumerate(r.get("devices", list))
        ),
        units=tuple(u for u, _ in units),
        error=r.get("error", str, ""),
        extra=r.extra,
        unit_extras=tuple(x for _, x in units),
    )


def _shared(raw: object, path: str) -> SharedEntry:
    r = _Reader(raw, path, ("strategy", "state", "record"))
    return SharedEntry(
        strategy=r.get("strategy", str),
        state=_state(r.get("state", str), f"{path}.state", (ACQUIRING, READY, RELEASING)),
        record=r.get("record", dict, {}),
        extra=r.extra,
    )


def decode(raw: object) -> Checkpoint:
    """A version 2 checkpoint (after :func:`migrate_v1` for version 1)."""
    r = _Reader(raw, "checkpoint", ("version", "nodeBootID", "claims", "shared"))
    claims = r.get("claims", dict, {})
    for uid in claims:
        if not _UID.match(uid):
            raise CheckpointCorruptError(f"checkpoint.claims: {uid!r} is not a claim UID")
    return Checkpoint(
        boot_id=r.get("nodeBootID", str, ""),
        claims={uid: _claim(e, f"claims.{uid}") for uid, e in claims.items()},
        shared={k: _shared(e, f"shared.{k}") for k, e in r.get("shared", dict, {}).items()},
        extra=r.extra,
    )


# -- encoding -------------------------------------------------------------------------


def _device_json(d: DeviceRecord) -> dict[str, Any]:
    out: dict[str, Any] = {
        **d.extra,
        "request": d.request,
        "pool": d.pool,
        "device": d.device,
        "adminAccess": d.admin_access,
        "cdiDeviceIDs": list(d.cdi_device_ids),
    }
    if d.share_id is not None:
        out["shareID"] = d.share_id
    if d.consumed_capacity:
        out["consumedCapacity"] = dict(d.consumed_capacity)
    return out


def _claim_json(e: ClaimEntry) -> dict[str, Any]:
    extras = [*e.unit_extras, *[{}] * (len(e.units) - len(e.unit_extras))]
    out: dict[str, Any] = {
        **e.extra,
        "state": e.state,
        "namespace": e.namespace,
        "name": e.name,
        "devices": [_device_json(d) for d in e.devices],
        "units": [
            {
                **x,
                "strategy": u.strategy,
                "devices": list(u.devices),
                "gpus": list(u.gpus),
                "shared": list(u.shared),
                "record": dict(u.record),
            }
            for u, x in zip(e.units, extras, strict=False)
        ],
    }
    if e.error:
        out["error"] = e.error
    return out


def _shared_json(s: SharedEntry) -> dict[str, Any]:
    return {**s.extra, "strategy": s.strategy, "state": s.state, "record": dict(s.record)}


def _dumps(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


class Encoder:
    """The file's bytes (the format above, compact JSON), re-encoding only entries it
    has not written before: an entry is frozen, so the same object has the same JSON.
    Keeps the last call's entries only; one caller at a time (the checkpoint lock)."""

    def __init__(self) -> None:
        self._claims: dict[str, tuple[ClaimEntry, str]] = {}
        self._shared: dict[str, tuple[SharedEntry, str]] = {}

    def dumps(self, cp: Checkpoint) -> bytes:
        claims = {
            uid: _member(uid, e, self._claims.get(uid), _claim_json) for uid, e in cp.claims.items()
        }
        shared = {k: _member(k, s, self._shared.get(k), _shared_json) for k, s in cp.shared.items()}
        self._claims, self._shared = claims, shared
        head = _dumps({**cp.extra, "version": VERSION, "nodeBootID": cp.boot_id})
        body = ",".join(text for _, text in claims.values())
        tail = ",".join(text for _, text in shared.values())
        return f'{head[:-1]},"claims":{{{body}}},"shared":{{{tail}}}}}\n'.encode()


def _member(
    key: str, entry: _E, seen: tuple[_E, str] | None, to_json: Callable[[_E], object]
) -> tuple[_E, str]:
    """``"key":{...}`` for an object member, reused when ``entry`` is the one seen."""
    if seen is not None and seen[0] is entry:
        return seen
    return entry, f"{_dumps(key)}:{_dumps(to_json(entry))}"


# -- version 1 --------------------------------------------------------------------------


def migrate_v1(raw: dict[str, Any]) -> dict[str, Any]:
    """A version 1 file as version 2 JSON; fields v2 does not know stay as extras.

    v1 stored a summary of what was applied: ``timeSlicing`` (GPU UUIDs),
    ``computeMode`` (UUIDs of those and of the GPUs MPS made exclusive) and ``mps``
    (daemon ids with their UUIDs). That becomes one TimeSlicing unit per GPU and one
    MPS unit per daemon; undo needs nothing else.
    """
    r = _Reader(raw, "checkpoint", ("version", "nodeBootID", "claims"))
    out: dict[str, Any] = {**r.extra, "version": VERSION, "nodeBootID": raw.get("nodeBootID")}
    claims: dict[str, Any] = {}
    for uid, entry in r.get("claims", dict, {}).items():
        path = f"claims.{uid}"
        e = _Reader(entry, path, ("state", "namespace", "name", "devices", "applied"))
        state = _state(e.get("state", str), f"{path}.state", ("PrepareStarted", "PrepareCompleted"))
        applied = _Reader(e.get("applied", dict, {}), f"{path}.applied", ())
        sliced = applied.strings("timeSlicing")
        mps = applied.get("mps", list, [])
        units: list[dict[str, Any]] = [
            {"strategy": "TimeSlicing", "devices": [], "gpus": [u], "shared": [],
             "record": {"gpu": u, "timeslice": None}}
            for u in sliced
        ]  # fmt: skip
        exclusive = [u for u in applied.strings("computeMode") if u not in sliced]
        for i, m in enumerate(mps):
            group = _Reader(m, f"{path}.applied.mps[{i}]", ("id", "uuids"))
            uuids = group.strings("uuids")
            mine = [u for u in exclusive if u in uuids]
            record = {"daemonId": group.get("id", str), "uuids": list(uuids), "exclusive": mine,
                      "activeThreadPercentage": None, "pinnedMemory": {}}  # fmt: skip
            units.append({"strategy": "MPS", "devices": [], "gpus": mine, "shared": [],
                          "record": record})  # fmt: skip
        devices = []
        for i, d in enumerate(e.get("devices", list, [])):
            dev = _Reader(d, f"{path}.devices[{i}]", ("requestNames", "poolName", "deviceName",
                          "cdiDeviceIds", "shareId", "adminAccess"))  # fmt: skip
            names = dev.strings("requestNames")
            item = {**dev.extra, "request": names[0] if names else "",
                    "pool": dev.get("poolName", str), "device": dev.get("deviceName", str),
                    "adminAccess": dev.get("adminAccess", bool, False),
                    "cdiDeviceIDs": list(dev.strings("cdiDeviceIds"))}  # fmt: skip
            if dev.get("shareId", str, None) is not None:
                item["shareID"] = dev.raw["shareId"]
            devices.append(item)
        claims[uid] = {
            **e.extra,
            "state": PREPARED if state == "PrepareCompleted" else PREPARING,
            "namespace": e.get("namespace", str, ""),
            "name": e.get("name", str, ""),
            "devices": devices,
            "units": units,
        }
    out["claims"] = claims
    return out
