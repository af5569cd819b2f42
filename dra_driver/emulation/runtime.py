"""What changes on an emulated GPU while it runs: faults, recovery, processes, pending events.

The profile describes the hardware; this module holds its *state*: whether the
GPU fell off the bus, which recovery action NVML asks for, its ECC counters,
the processes running on it, and the NVML events waiting in event sets.

State changes arrive as *control operations* (plain dicts, see
:func:`check_op`), either in-process or through an append-only JSON-lines file
in the emulated root (``emulation/control.jsonl``): a plugin running as another
process against the same root picks them up on its next NVML call, so a test
can inject a fatal Xid into the GPUs of a plugin it started as a subprocess.
Events are transient (delivered to the event sets registered when the
operation is applied); everything else is state and survives a plugin restart.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CONTROL_FILE = Path("emulation/control.jsonl")
"""Control operations for emulated GPUs, one JSON object per line (append only)."""

# nvmlEventType* bits (nvml.h).
EVENT_SINGLE_BIT_ECC = 0x1
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_XID_CRITICAL = 0x8
EVENT_GPU_UNAVAILABLE = 0x4000
EVENT_RECOVERY_ACTION = 0x8000
SUPPORTED_EVENTS = (
    EVENT_SINGLE_BIT_ECC
    | EVENT_DOUBLE_BIT_ECC
    | EVENT_XID_CRITICAL
    | EVENT_GPU_UNAVAILABLE
    | EVENT_RECOVERY_ACTION
)
NO_INSTANCE = 0xFFFFFFFF
"""GPU/compute instance ID in event data and process info when not on a MIG device."""

# NVML_GPU_RECOVERY_ACTION_* (nvml.h).
RECOVERY_ACTIONS = {"none": 0, "gpu-reset": 1, "node-reboot": 2, "drain-p2p": 3,
                    "drain-and-reset": 4}  # fmt: skip

_OPS: dict[str, set[str]] = {
    "xid": {"gpu", "xid", "gi", "ci"},
    "ecc": {"gpu"},
    "recovery": {"gpu", "action"},
    "lost": {"gpu", "lost"},
    "reset": {"gpu"},
    "processes": {"gpu", "processes"},
}


class ControlError(ValueError):
    """A control operation is malformed; the message names the field."""


@dataclass(frozen=True)
class EmulatedProcess:
    """A CUDA process on an emulated GPU, as NVML's process queries report it."""

    pid: int
    used_mib: int
    sm_util: int = 0
    """Percent of the GPU's SMs busy with this process over the last sample."""
    mem_util: int = 0
    """Percent of memory-controller time of this process over the last sample."""
    gi_id: int | None = None
    ci_id: int | None = None
    """GPU / compute instance it runs in (MIG), None on a full GPU."""


@dataclass
class GpuRuntime:
    lost: bool = False
    recovery_action: int = 0
    ecc_volatile_uncorrected: int = 0
    ecc_aggregate_uncorrected: int = 0
    processes: tuple[EmulatedProcess, ...] = ()


@dataclass(frozen=True)
class PendingEvent:
    slot: int
    event_type: int
    data: int
    gi_id: int = NO_INSTANCE
    ci_id: int = NO_INSTANCE


@dataclass
class EventSet:
    registered: dict[int, int] = field(default_factory=dict)
    """GPU slot -> event type mask."""
    pending: deque[PendingEvent] = field(default_factory=deque)


def _int(op: dict[str, Any], key: str, low: int = 0, high: int = 2**32 - 1) -> int:
    value = op.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ControlError(f"control op {op.get('op')!r}: {key} must be an integer {low}..{high}")
    return value


def process_from(data: Any) -> EmulatedProcess:
    if not isinstance(data, dict):
        raise ControlError("control op 'processes': each process must be a mapping")
    unknown = set(data) - {"pid", "usedMiB", "smUtil", "memUtil", "gi", "ci"}
    if unknown:
        raise ControlError(f"control op 'processes': unknown field(s) {sorted(unknown)}")
    return EmulatedProcess(
        pid=_int(data, "pid", 1),
        used_mib=_int(data, "usedMiB"),
        sm_util=_int(data, "smUtil", 0, 100) if "smUtil" in data else 0,
        mem_util=_int(data, "memUtil", 0, 100) if "memUtil" in data else 0,
        gi_id=_int(data, "gi") if data.get("gi") is not None else None,
        ci_id=_int(data, "ci") if data.get("ci") is not None else None,
    )


def check_op(op: Any, gpu_count: int) -> dict[str, Any]:
    """Validate one control operation; returns it unchanged or raises :class:`ControlError`.

    ``xid`` (``gpu``, ``xid``, optional ``gi``/``ci``: a MIG device), ``ecc`` (a
    double-bit error), ``recovery`` (``action``: NVML_GPU_RECOVERY_ACTION_*),
    ``lost`` (``lost``: bool, the GPU fell off the bus / came back), ``reset``
    (GPU reset: not lost, no action pending, volatile ECC counters and
    processes cleared) and ``processes`` (``processes``: the list now running).
    """
    if not isinstance(op, dict) or op.get("op") not in _OPS:
        raise ControlError(f"control op must be a mapping with op one of {sorted(_OPS)}: {op!r}")
    unknown = set(op) - _OPS[op["op"]] - {"op"}
    if unknown:
        raise ControlError(f"control op {op['op']!r}: unknown field(s) {sorted(unknown)}")
    _int(op, "gpu", 0, gpu_count - 1)
    kind = op["op"]
    if kind == "xid":
        _int(op, "xid", 1)
        if (op.get("gi") is None) != (op.get("ci") is None):
            raise ControlError("control op 'xid': give both gi and ci, or neither")
    elif kind == "recovery":
        _int(op, "action", 0, 7)
    elif kind == "lost" and not isinstance(op.get("lost"), bool):
        raise ControlError("control op 'lost': lost must be true or false")
    elif kind == "processes":
        if not isinstance(op.get("processes"), list):
            raise ControlError("control op 'processes': processes must be a list")
        for p in op["processes"]:
            process_from(p)
    return op


class ControlFeed:
    """Reads operations appended to the control file since the last read."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._offset = 0

    def read_new(self) -> list[dict[str, Any]]:
        if self.path is None:
            return []
        try:
            if self.path.stat().st_size <= self._offset:
                return []  # nothing new: the common case of a 20 ms poll
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1  # a line still being written is read next time
        self._offset += end
        return [json.loads(line) for line in data[:end].splitlines() if line.strip()]


def append_op(path: Path, op: dict[str, Any]) -> None:
    """Append one operation with a single write, so concurrent readers see whole lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(op, separators=(",", ":")) + "\n").encode()
    with path.open("ab") as f:
        f.write(line)
