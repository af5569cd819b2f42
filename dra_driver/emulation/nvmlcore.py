"""Plumbing of the emulated NVML library: ctypes I/O, handles, dispatch and faults.

The C-function implementations live in :mod:`.nvmldevice` (system and device
queries) and :mod:`.nvmlmig` (MIG); :class:`~.library.EmulatedNvmlLibrary`
combines them. Functions are methods named ``_c_<C symbol>``; ``__getattr__``
hands them to ``pynvml`` wrapped like ctypes function pointers.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dra_driver.emulation.hardware import EmulatedGpu, EmulatedProfile
from dra_driver.emulation.migrules import (
    ERROR_IN_USE,
    ERROR_INSUFFICIENT_RESOURCES,
    GpuInstance,
    MigDevice,
)
from dra_driver.emulation.migstate import MigState
from dra_driver.emulation.runtime import (
    EVENT_DOUBLE_BIT_ECC,
    EVENT_RECOVERY_ACTION,
    EVENT_XID_CRITICAL,
    NO_INSTANCE,
    ControlError,
    ControlFeed,
    EventSet,
    GpuRuntime,
    PendingEvent,
    check_op,
    process_from,
)

# NVML return codes (nvml.h).
SUCCESS = 0
ERROR_UNINITIALIZED = 1
ERROR_DRIVER_NOT_LOADED = 9
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NOT_FOUND = 6
ERROR_INSUFFICIENT_SIZE = 7
ERROR_TIMEOUT = 10
ERROR_FUNCTION_NOT_FOUND = 13
ERROR_GPU_IS_LOST = 15
ERROR_NO_PERMISSION = 4
ERROR_ARGUMENT_VERSION_MISMATCH = 25
ERROR_UNKNOWN = 999

ERROR_STRINGS = {
    SUCCESS: "Success",
    ERROR_UNINITIALIZED: "Uninitialized",
    ERROR_INVALID_ARGUMENT: "Invalid Argument",
    ERROR_NOT_SUPPORTED: "Not Supported",
    ERROR_NOT_FOUND: "Not Found",
    ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
    ERROR_TIMEOUT: "Timeout",
    ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    ERROR_GPU_IS_LOST: "GPU is lost",
    ERROR_NO_PERMISSION: "Insufficient Permissions",
    ERROR_IN_USE: "In use by another client",
    ERROR_INSUFFICIENT_RESOURCES: "Insufficient resources",
    ERROR_ARGUMENT_VERSION_MISMATCH: "Argument version mismatch",
    ERROR_UNKNOWN: "Unknown Error",
}

BRAND_CODES = {"NVIDIA": 14, "TESLA": 2, "QUADRO": 1, "GEFORCE": 5, "TITAN": 6,
                "NVIDIA_RTX": 13, "QUADRO_RTX": 12}  # fmt: skip
ARCH_CODES = {"KEPLER": 2, "MAXWELL": 3, "PASCAL": 4, "VOLTA": 5, "TURING": 6, "AMPERE": 7,
               "ADA": 8, "HOPPER": 9, "BLACKWELL": 10}  # fmt: skip
# NVML_GPU_INSTANCE_PROFILE_<x> constants: the index nvmlDeviceGetGpuInstanceProfileInfo takes.
GI_PROFILE_INDEX = {"1_SLICE": 0, "2_SLICE": 1, "3_SLICE": 2, "4_SLICE": 3, "7_SLICE": 4,
                     "8_SLICE": 5, "6_SLICE": 6, "1_SLICE_REV1": 7, "2_SLICE_REV1": 8,
                     "1_SLICE_REV2": 9}  # fmt: skip
# Struct versions pynvml puts in the version field (nvml.h NVML_STRUCT_VERSION(...)).
MEMORY_V2 = 0x02000028
GI_PROFILE_INFO_V2 = 0x02000098
CI_PROFILE_INFO_V2 = 0x02000088

KIND_GPU, KIND_MIG, KIND_GI, KIND_CI, KIND_EVENT_SET = 1, 2, 3, 4, 5
_CONTROL_POLL_S = 0.01  # how stale another process's control operations may be
MIB = 1024 * 1024


class Return(Exception):
    """Carries an NVML return code out of an emulated function."""

    def __init__(self, code: int) -> None:
        self.code = code


def deref(arg: Any) -> Any:
    """The ctypes object behind a ``byref()`` argument (or the object itself)."""
    return getattr(arg, "_obj", arg)


def as_int(arg: Any) -> int:
    return int(arg.value) if hasattr(arg, "value") else int(arg)


def handle_value(handle: Any) -> int:
    if handle is None:
        return 0
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


def store_handle(target: Any, value: int) -> None:
    """Write a handle value into a ctypes pointer object in place."""
    holder = ctypes.c_void_p(value)
    ctypes.memmove(ctypes.addressof(target), ctypes.addressof(holder), ctypes.sizeof(holder))


def write_string(buffer: Any, length: Any, text: str) -> None:
    data = text.encode() + b"\0"
    if len(data) > as_int(length):
        raise Return(ERROR_INSUFFICIENT_SIZE)
    ctypes.memmove(buffer, data, len(data))


class CFunction:
    """One emulated C symbol; attributes like ``restype`` can be set as on a ctypes function."""

    def __init__(self, library: LibraryCore, name: str, impl: Callable[..., None]) -> None:
        self.library, self.name, self.impl = library, name, impl
        self.restype: Any = ctypes.c_int
        self.argtypes: Any = None

    def __call__(self, *args: Any) -> Any:
        return self.library._dispatch(self.name, self.impl, args)


class LibraryCore:
    """State, symbol lookup and handle decoding shared by the C-function mixins."""

    def __init__(
        self,
        profile: EmulatedProfile,
        mig: MigState | None = None,
        control_file: Path | None = None,
    ) -> None:
        self.profile = profile
        self.mig = mig or MigState(profile)
        """GPU and compute instances (shared through a file by every process of a node)."""
        self.delays: dict[str, float] = dict(profile.call_delays)
        """C function name -> seconds each call takes, as on hardware."""
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._runtime = {gpu.index: GpuRuntime() for gpu in profile.gpus}
        self._event_sets: dict[int, EventSet] = {}
        self._event_poller = False
        """Whether a waiting thread is re-reading the control file for the others."""
        self._next_event_set = 1
        self._control = ControlFeed(control_file)
        self._control_read_at = 0.0
        self._present: list[int] = list(range(len(profile.gpus)))
        self._faults: dict[tuple[int, str], int] = {
            (gpu.index, fn): code for gpu in profile.gpus for fn, code in gpu.faults.items()
        }
        self._init_count = 0
        self.calls: Counter[str] = Counter()
        """How often each C function was called (tests assert on caching, retries)."""

    # ---- test controls -------------------------------------------------------------------
    def inject_fault(
        self, gpu_index: int, function: str = "*", code: int = ERROR_GPU_IS_LOST
    ) -> None:
        """Make ``function`` (C name, or ``*``) fail with ``code`` for one GPU (profile index)."""
        with self._lock:
            self._faults[(gpu_index, function)] = code

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def remove_gpu(self, gpu_index: int) -> None:
        """The GPU (profile index) disappears: no longer counted, old handles are lost."""
        with self._lock:
            if gpu_index in self._present:
                self._present.remove(gpu_index)

    def apply(self, op: dict[str, Any]) -> None:
        """Apply one control operation (see :func:`~.runtime.check_op`) to the emulated GPUs."""
        check_op(op, len(self.profile.gpus))
        with self._cond:
            slot, kind = op["gpu"], op["op"]
            state = self._runtime[slot]
            if kind == "xid":
                gi = op.get("gi")
                self._emit(PendingEvent(slot, EVENT_XID_CRITICAL, op["xid"],
                                        NO_INSTANCE if gi is None else gi,
                                        NO_INSTANCE if gi is None else op["ci"]))  # fmt: skip
            elif kind == "ecc":
                state.ecc_volatile_uncorrected += 1
                state.ecc_aggregate_uncorrected += 1
                self._emit(PendingEvent(slot, EVENT_DOUBLE_BIT_ECC, 0))
            elif kind == "recovery":
                state.recovery_action = op["action"]
                self._emit(PendingEvent(slot, EVENT_RECOVERY_ACTION, op["action"]))
            elif kind == "lost":
                state.lost = op["lost"]
            elif kind == "reset":
                state.lost, state.recovery_action = False, 0
                state.ecc_volatile_uncorrected, state.processes = 0, ()
            elif kind == "processes":
                state.processes = tuple(process_from(p) for p in op["processes"])
            self._cond.notify_all()

    def _emit(self, event: PendingEvent) -> None:
        for es in self._event_sets.values():
            if es.registered.get(event.slot, 0) & event.event_type:
                es.pending.append(event)

    def _poll_control(self, *, force: bool = False) -> None:
        """Apply operations other processes appended to the control file (rate-limited)."""
        now = time.monotonic()
        if self._control.path is None or (
            not force and now - self._control_read_at < _CONTROL_POLL_S
        ):
            return
        self._control_read_at = now
        for op in self._control.read_new():
            try:
                self.apply(op)
            except ControlError:
                continue  # a bad line must not break the emulated driver; tests validate first

    def runtime(self, gpu_index: int) -> GpuRuntime:
        """Current state of one GPU (profile index), after pending control operations."""
        with self._lock:
            self._poll_control(force=True)
            return self._runtime[gpu_index]

    @property
    def present_gpus(self) -> tuple[EmulatedGpu, ...]:
        with self._lock:
            return tuple(self.profile.gpus[i] for i in self._present)

    # ---- symbol lookup, as ctypes.CDLL does ----------------------------------------------
    def __getattr__(self, name: str) -> CFunction:
        if not name.startswith("nvml"):
            raise AttributeError(name)
        impl = getattr(type(self), "_c_" + name, None)
        if impl is None:
            raise AttributeError(f"emulated NVML has no symbol {name}")
        return CFunction(self, name, impl.__get__(self))

    def _dispatch(self, name: str, impl: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        delay = self.delays.get(name)
        if delay:  # outside the lock: other callers go on while this one "runs"
            time.sleep(delay)
        with self._lock:
            self.calls[name] += 1
            self._poll_control()
            if name == "nvmlErrorString":
                return impl(*args)
            if self._init_count == 0 and not name.startswith(("nvmlInit", "nvmlShutdown")):
                return ERROR_UNINITIALIZED
            try:
                slot = self._subject(name, args)
                if slot is not None:
                    code = self._faults.get((slot, name)) or self._faults.get((slot, "*"))
                    if code:
                        return code
                impl(*args)
            except Return as ret:
                return ret.code
            return SUCCESS

    def _subject(self, name: str, args: tuple[Any, ...]) -> int | None:
        """The GPU slot a call is about, for fault injection."""
        if name == "nvmlDeviceGetHandleByIndex_v2":
            index = as_int(args[0])
            return self._present[index] if index < len(self._present) else None
        if name.startswith(("nvmlDevice", "nvmlGpuInstance", "nvmlComputeInstance")) and args:
            value = handle_value(args[0]) if not isinstance(args[0], int | bytes) else 0
            if value >> 16 in (KIND_GPU, KIND_MIG, KIND_GI, KIND_CI):
                return (value >> 8) & 0xFF
        return None

    # ---- handles ----------------------------------------------------------------------
    # A handle is ``kind << 16 | slot << 8 | instance``; for GI handles ``instance`` is the
    # GI ID, for CI and MIG-device handles ``gi_id << 3 | ci_id``, so a handle keeps naming
    # its instance while others come and go, and a destroyed one stops resolving.
    @staticmethod
    def _encode(kind: int, slot: int, instance: int = 0) -> int:
        return (kind << 16) | (slot << 8) | instance

    @staticmethod
    def ci_instance(gi_id: int, ci_id: int) -> int:
        return gi_id << 3 | ci_id

    def _decode(self, handle: Any, *kinds: int) -> tuple[int, EmulatedGpu, int]:
        value = handle_value(handle)
        kind, slot, instance = value >> 16, (value >> 8) & 0xFF, value & 0xFF
        if kind not in kinds or slot >= len(self.profile.gpus):
            raise Return(ERROR_INVALID_ARGUMENT)
        if slot not in self._present or self._runtime[slot].lost:
            raise Return(ERROR_GPU_IS_LOST)
        return kind, self.profile.gpus[slot], instance

    def _gpu(self, handle: Any) -> EmulatedGpu:
        return self._decode(handle, KIND_GPU)[1]

    def _gi(self, handle: Any) -> tuple[EmulatedGpu, GpuInstance]:
        _, gpu, gi_id = self._decode(handle, KIND_GI)
        gi = self.mig.gpu_instance(gpu.index, gi_id)
        if gi is None:
            raise Return(ERROR_INVALID_ARGUMENT)  # destroyed since the handle was handed out
        return gpu, gi

    def _mig_device(self, gpu: EmulatedGpu, instance: int) -> MigDevice:
        gi = self.mig.gpu_instance(gpu.index, instance >> 3)
        ci = gi.cis.get(instance & 0x7) if gi is not None else None
        if gi is None or ci is None:
            raise Return(ERROR_INVALID_ARGUMENT)
        return MigDevice(gpu, gi, ci)

    def _ci(self, handle: Any) -> MigDevice:
        _, gpu, instance = self._decode(handle, KIND_CI)
        return self._mig_device(gpu, instance)

    def _any(self, handle: Any) -> tuple[EmulatedGpu, MigDevice | None]:
        kind, gpu, instance = self._decode(handle, KIND_GPU, KIND_MIG)
        return gpu, self._mig_device(gpu, instance) if kind == KIND_MIG else None
