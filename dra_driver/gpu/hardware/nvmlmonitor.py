"""NVML calls for watching GPUs while they run: events, recovery, ECC, NVLink, fabric, usage.

A mixin of :class:`~dra_driver.gpu.hardware.nvml.Nvml` (kept apart from discovery's
identity and MIG queries): the health monitor, the usage sampler and the
NVLink/fabric part of discovery use these. Same rules as the rest of the
adapter: plain values out, :class:`NvmlError` for every failure.
"""

from __future__ import annotations

import ctypes
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeVar

from dra_driver.gpu.hardware.nvmlerrors import (
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_TIMEOUT,
    NvmlError,
)

T = TypeVar("T")
Handle = Any
"""An opaque NVML handle (device, MIG device, GPU instance, compute instance or event set)."""
CallObserver = Callable[[str, float, "int | None"], None]
"""``(NVML function, seconds, error code or None)``, called after every NVML call."""

# nvmlEventType* bits the health monitor listens for (nvml.h).
EVENT_SINGLE_BIT_ECC = 0x1
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_XID_CRITICAL = 0x8
EVENT_GPU_UNAVAILABLE = 0x4000
EVENT_RECOVERY_ACTION = 0x8000
NO_INSTANCE = 0xFFFFFFFF
"""GPU/compute instance ID NVML reports when an event or process is not on a MIG device."""
FI_DEV_GET_GPU_RECOVERY_ACTION = 230
NVLINK_DEVICE_TYPE_GPU, NVLINK_DEVICE_TYPE_SWITCH = 0, 2
FABRIC_STATE_COMPLETED = 3
_MAX_NVLINKS = 36  # NVML_NVLINK_MAX_LINKS


@dataclass(frozen=True)
class Event:
    """One NVML event of a GPU's event set: what, and the MIG instance when it names one."""

    event_type: int
    data: int
    """The Xid for Xid events, the recovery action for recovery-action events."""
    gi_id: int | None
    ci_id: int | None


@dataclass(frozen=True)
class NvLink:
    """One active NVLink: the remote end's PCI address and whether it is a GPU or a switch."""

    link: int
    remote_bus_id: str
    remote_is_gpu: bool


@dataclass(frozen=True)
class FabricInfo:
    cluster_uuid: str
    clique_id: int
    state: int
    status: int


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    used_bytes: int | None
    gi_id: int | None
    ci_id: int | None


@dataclass(frozen=True)
class ProcessSample:
    pid: int
    timestamp_us: int
    sm_util: int
    mem_util: int


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class MonitoringCalls:
    """Calls of a running GPU; needs ``_call``/``_int_call`` of :class:`Nvml`."""

    _nv: ModuleType

    def _call(self, name: str, fn: Callable[..., T], *args: Any) -> T:
        raise NotImplementedError

    def _int_call(self, name: str, fn: Callable[..., Any], *args: Any) -> int:
        raise NotImplementedError

    # ---- health: events, recovery action, ECC ----
    def event_set_create(self) -> Handle:
        return self._call("nvmlEventSetCreate", self._nv.nvmlEventSetCreate)

    def event_set_free(self, event_set: Handle) -> None:
        self._call("nvmlEventSetFree", self._nv.nvmlEventSetFree, event_set)

    def supported_event_types(self, handle: Handle) -> int:
        fn = self._nv.nvmlDeviceGetSupportedEventTypes
        return self._int_call("nvmlDeviceGetSupportedEventTypes", fn, handle)

    def register_events(self, handle: Handle, mask: int, event_set: Handle) -> None:
        fn = self._nv.nvmlDeviceRegisterEvents
        self._call("nvmlDeviceRegisterEvents", fn, handle, mask, event_set)

    def event_set_wait(self, event_set: Handle, timeout_ms: int) -> Event | None:
        """The next event, or None when none came within ``timeout_ms``."""
        try:
            data = self._call(
                "nvmlEventSetWait", self._nv.nvmlEventSetWait_v2, event_set, timeout_ms
            )
        except NvmlError as exc:
            if exc.code == NVML_ERROR_TIMEOUT:
                return None
            raise
        gi, ci = int(data.gpuInstanceId), int(data.computeInstanceId)
        return Event(  # the device is not queried: after Xid 79 it no longer answers
            event_type=int(data.eventType),
            data=int(data.eventData),
            gi_id=None if gi == NO_INSTANCE else gi,
            ci_id=None if ci == NO_INSTANCE else ci,
        )

    def recovery_action(self, handle: Handle) -> int:
        """``NVML_GPU_RECOVERY_ACTION_*`` the driver asks for (0: none); NvmlError if unknown."""
        values = self._call(
            "nvmlDeviceGetFieldValues",
            self._nv.nvmlDeviceGetFieldValues,
            handle,
            [FI_DEV_GET_GPU_RECOVERY_ACTION],
        )
        field = values[0]
        if field.nvmlReturn != 0:
            raise NvmlError("nvmlDeviceGetFieldValues", int(field.nvmlReturn), "recovery action")
        return int(field.value.uiVal)

    def uncorrected_ecc_errors(self, handle: Handle) -> int:
        """Volatile (since the last driver load or reset) uncorrected ECC errors."""
        fn = self._nv.nvmlDeviceGetTotalEccErrors
        return self._int_call("nvmlDeviceGetTotalEccErrors", fn, handle, 1, 0)

    # ---- NVLink and fabric ----
    def nvlinks(self, handle: Handle) -> list[NvLink]:
        """Active links; empty on boards without NVLink."""
        links: list[NvLink] = []
        for link in range(_MAX_NVLINKS):
            try:
                active = self._int_call(
                    "nvmlDeviceGetNvLinkState", self._nv.nvmlDeviceGetNvLinkState, handle, link
                )
            except NvmlError as exc:
                if exc.not_supported or exc.code == NVML_ERROR_INVALID_ARGUMENT:
                    break  # no NVLink, or past the board's last port
                raise
            if not active:
                continue
            fn = self._nv.nvmlDeviceGetNvLinkRemotePciInfo
            pci = self._call("nvmlDeviceGetNvLinkRemotePciInfo", fn, handle, link)
            kind = self._int_call(
                "nvmlDeviceGetNvLinkRemoteDeviceType",
                self._nv.nvmlDeviceGetNvLinkRemoteDeviceType,
                handle,
                link,
            )
            links.append(NvLink(link, _text(pci.busId), kind == NVLINK_DEVICE_TYPE_GPU))
        return links

    def fabric_info(self, handle: Handle) -> FabricInfo:
        info = self._nv.c_nvmlGpuFabricInfo_v2_t()
        fn = self._nv.nvmlDeviceGetGpuFabricInfoV
        self._call("nvmlDeviceGetGpuFabricInfoV", fn, handle, ctypes.byref(info))
        return FabricInfo(
            cluster_uuid=str(uuidlib.UUID(bytes=bytes(info.clusterUuid))),
            clique_id=int(info.cliqueId),
            state=int(info.state),
            status=int(info.status),
        )

    # ---- usage ----
    def memory_used(self, handle: Handle) -> int:
        info = self._call("nvmlDeviceGetMemoryInfo", self._nv.nvmlDeviceGetMemoryInfo, handle)
        return int(info.used)

    def running_processes(self, handle: Handle) -> list[ProcessInfo]:
        fn = self._nv.nvmlDeviceGetComputeRunningProcesses_v3
        procs = self._call("nvmlDeviceGetComputeRunningProcesses", fn, handle)
        return [
            ProcessInfo(
                pid=int(p.pid),
                used_bytes=None if p.usedGpuMemory is None else int(p.usedGpuMemory),
                gi_id=None if p.gpuInstanceId in (None, NO_INSTANCE) else int(p.gpuInstanceId),
                ci_id=None
                if p.computeInstanceId in (None, NO_INSTANCE)
                else int(p.computeInstanceId),
            )
            for p in procs
        ]

    def process_utilization(self, handle: Handle, since_us: int) -> list[ProcessSample]:
        """Per-process samples newer than ``since_us``; empty when there are none."""
        fn = self._nv.nvmlDeviceGetProcessUtilization
        try:
            samples = self._call("nvmlDeviceGetProcessUtilization", fn, handle, since_us)
        except NvmlError as exc:
            if exc.code == NVML_ERROR_NOT_FOUND:
                return []
            raise
        return [
            ProcessSample(int(s.pid), int(s.timeStamp), int(s.smUtil), int(s.memUtil))
            for s in samples
        ]

    def utilization(self, handle: Handle) -> tuple[int, int]:
        """``(gpu %, memory %)`` over the driver's last sample period."""
        fn = self._nv.nvmlDeviceGetUtilizationRates
        rates = self._call("nvmlDeviceGetUtilizationRates", fn, handle)
        return int(rates.gpu), int(rates.memory)
