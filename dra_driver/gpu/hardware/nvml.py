"""A thin, typed adapter over ``pynvml``: plain Python values out, one exception type.

Discovery talks to NVML only through :class:`Nvml`. Each method is one NVML
call; bytes become ``str``, ctypes structs become small tuples/dataclasses, and
every ``pynvml.NVMLError`` becomes :class:`NvmlError` carrying the C function
name and return code, so callers can tell "not supported on this GPU" from
"this GPU is lost". ``pynvml`` is imported on first use, which keeps the CLI's
``--help`` fast and lets emulation install its library first.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeVar

from dra_driver.gpu.hardware.nvmlerrors import (
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_TIMEOUT,
    NVML_ERROR_UNKNOWN,
    NvmlError,
)
from dra_driver.gpu.hardware.nvmlmonitor import CallObserver, Handle, MonitoringCalls

NVML_GPU_INSTANCE_PROFILE_COUNT = 0x12
"""Number of GPU-instance profile indexes to probe (``NVML_GPU_INSTANCE_PROFILE_COUNT``)."""
_MAX_PLACEMENTS = 8  # one per memory slice

T = TypeVar("T")


@dataclass(frozen=True)
class GpuInstanceProfileInfo:
    id: int
    name: str
    """Without the ``MIG `` prefix NVML puts in front, e.g. ``1g.10gb``."""
    slice_count: int
    instance_count: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    memory_mib: int


@dataclass(frozen=True)
class MigDeviceAttributes:
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    gi_slices: int
    ci_slices: int
    memory_mib: int


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


__all__ = [
    "NVML_ERROR_FUNCTION_NOT_FOUND",
    "NVML_ERROR_GPU_IS_LOST",
    "NVML_ERROR_INVALID_ARGUMENT",
    "NVML_ERROR_NOT_FOUND",
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_TIMEOUT",
    "NVML_ERROR_UNKNOWN",
    "NVML_GPU_INSTANCE_PROFILE_COUNT",
    "GpuInstanceProfileInfo",
    "Handle",
    "MigDeviceAttributes",
    "Nvml",
    "NvmlError",
]


class Nvml(MonitoringCalls):
    """One NVML session's calls. Create, :meth:`init`, query, :meth:`shutdown`."""

    def __init__(self, observer: CallObserver | None = None) -> None:
        """``observer`` sees every call's duration and outcome (NVML metrics)."""
        import pynvml

        self._nv: ModuleType = pynvml
        self._observer = observer

    def _call(self, name: str, fn: Callable[..., T], *args: Any) -> T:
        started = time.perf_counter()
        code: int | None = None
        try:
            return fn(*args)
        except self._nv.NVMLError as exc:
            code = int(exc.value)
            raise NvmlError(name, code, str(exc)) from exc
        finally:
            if self._observer is not None and name != "nvmlEventSetWait":
                self._observer(name, time.perf_counter() - started, code)

    def _int_call(self, name: str, fn: Callable[..., Any], *args: Any) -> int:
        return int(self._call(name, fn, *args))

    # ---- session and system ----
    def init(self) -> None:
        self._call("nvmlInit", self._nv.nvmlInit)

    def shutdown(self) -> None:
        self._call("nvmlShutdown", self._nv.nvmlShutdown)

    def driver_version(self) -> str:
        return _text(self._call("nvmlSystemGetDriverVersion", self._nv.nvmlSystemGetDriverVersion))

    def cuda_driver_version(self) -> int:
        """``major * 1000 + minor * 10``, e.g. ``13000`` for CUDA 13.0."""
        return self._int_call(
            "nvmlSystemGetCudaDriverVersion", self._nv.nvmlSystemGetCudaDriverVersion
        )

    def device_count(self) -> int:
        return self._int_call("nvmlDeviceGetCount", self._nv.nvmlDeviceGetCount)

    # ---- full GPUs ----
    def handle_by_index(self, index: int) -> Handle:
        return self._call("nvmlDeviceGetHandleByIndex", self._nv.nvmlDeviceGetHandleByIndex, index)

    def handle_by_uuid(self, uuid: str) -> Handle:
        return self._call("nvmlDeviceGetHandleByUUID", self._nv.nvmlDeviceGetHandleByUUID, uuid)

    def name(self, handle: Handle) -> str:
        return _text(self._call("nvmlDeviceGetName", self._nv.nvmlDeviceGetName, handle))

    def uuid(self, handle: Handle) -> str:
        return _text(self._call("nvmlDeviceGetUUID", self._nv.nvmlDeviceGetUUID, handle))

    def minor_number(self, handle: Handle) -> int:
        return self._int_call("nvmlDeviceGetMinorNumber", self._nv.nvmlDeviceGetMinorNumber, handle)

    def brand(self, handle: Handle) -> int:
        return self._int_call("nvmlDeviceGetBrand", self._nv.nvmlDeviceGetBrand, handle)

    def architecture(self, handle: Handle) -> int:
        return self._int_call(
            "nvmlDeviceGetArchitecture", self._nv.nvmlDeviceGetArchitecture, handle
        )

    def compute_capability(self, handle: Handle) -> tuple[int, int]:
        major, minor = self._call(
            "nvmlDeviceGetCudaComputeCapability",
            self._nv.nvmlDeviceGetCudaComputeCapability,
            handle,
        )
        return int(major), int(minor)

    def memory_total(self, handle: Handle) -> int:
        info = self._call("nvmlDeviceGetMemoryInfo", self._nv.nvmlDeviceGetMemoryInfo, handle)
        return int(info.total)

    def num_gpu_cores(self, handle: Handle) -> int:
        return self._int_call("nvmlDeviceGetNumGpuCores", self._nv.nvmlDeviceGetNumGpuCores, handle)

    def pci_bus_id(self, handle: Handle) -> str:
        """As NVML prints it: ``00000000:07:00.0`` (8-digit domain, upper case)."""
        info = self._call("nvmlDeviceGetPciInfo", self._nv.nvmlDeviceGetPciInfo, handle)
        return _text(info.busId)

    def max_pcie_link_generation(self, handle: Handle) -> int:
        fn = self._nv.nvmlDeviceGetMaxPcieLinkGeneration
        return self._int_call("nvmlDeviceGetMaxPcieLinkGeneration", fn, handle)

    def max_pcie_link_width(self, handle: Handle) -> int:
        return self._int_call(
            "nvmlDeviceGetMaxPcieLinkWidth", self._nv.nvmlDeviceGetMaxPcieLinkWidth, handle
        )

    def ecc_mode(self, handle: Handle) -> tuple[int, int]:
        """``(current, pending)``, 1 = enabled."""
        current, pending = self._call("nvmlDeviceGetEccMode", self._nv.nvmlDeviceGetEccMode, handle)
        return int(current), int(pending)

    def compute_mode(self, handle: Handle) -> int:
        return self._int_call("nvmlDeviceGetComputeMode", self._nv.nvmlDeviceGetComputeMode, handle)

    def mig_mode(self, handle: Handle) -> tuple[int, int]:
        """``(current, pending)``, 1 = enabled; NOT_SUPPORTED on GPUs without MIG."""
        current, pending = self._call("nvmlDeviceGetMigMode", self._nv.nvmlDeviceGetMigMode, handle)
        return int(current), int(pending)

    # ---- MIG profiles ----
    def gpu_instance_profile_info(self, handle: Handle, index: int) -> GpuInstanceProfileInfo:
        """Profile info for ``NVML_GPU_INSTANCE_PROFILE_<x>`` index ``index`` (v2, with name)."""
        info = self._call(
            "nvmlDeviceGetGpuInstanceProfileInfo",
            self._nv.nvmlDeviceGetGpuInstanceProfileInfo,
            handle,
            index,
            2,
        )
        return GpuInstanceProfileInfo(
            id=info.id,
            name=_text(info.name).removeprefix("MIG "),
            slice_count=info.sliceCount,
            instance_count=info.instanceCount,
            multiprocessors=info.multiprocessorCount,
            copy_engines=info.copyEngineCount,
            decoders=info.decoderCount,
            encoders=info.encoderCount,
            jpeg_engines=info.jpegCount,
            ofa_engines=info.ofaCount,
            memory_mib=info.memorySizeMB,
        )

    def gpu_instance_possible_placements(
        self, handle: Handle, profile_id: int
    ) -> list[tuple[int, int]]:
        """``(start, size)`` in memory slices for each placement the profile can take."""
        array = (self._nv.c_nvmlGpuInstancePlacement_t * _MAX_PLACEMENTS)()
        count = ctypes.c_uint(_MAX_PLACEMENTS)
        self._call(
            "nvmlDeviceGetGpuInstancePossiblePlacements",
            self._nv.nvmlDeviceGetGpuInstancePossiblePlacements,
            handle,
            profile_id,
            array,
            ctypes.byref(count),
        )
        return [(array[i].start, array[i].size) for i in range(count.value)]

    # ---- existing MIG devices ----
    def max_mig_device_count(self, handle: Handle) -> int:
        fn = self._nv.nvmlDeviceGetMaxMigDeviceCount
        return self._int_call("nvmlDeviceGetMaxMigDeviceCount", fn, handle)

    def mig_device_handle(self, handle: Handle, index: int) -> Handle:
        fn = self._nv.nvmlDeviceGetMigDeviceHandleByIndex
        return self._call("nvmlDeviceGetMigDeviceHandleByIndex", fn, handle, index)

    def gpu_instance_id(self, mig: Handle) -> int:
        return self._int_call(
            "nvmlDeviceGetGpuInstanceId", self._nv.nvmlDeviceGetGpuInstanceId, mig
        )

    def compute_instance_id(self, mig: Handle) -> int:
        fn = self._nv.nvmlDeviceGetComputeInstanceId
        return self._int_call("nvmlDeviceGetComputeInstanceId", fn, mig)

    def mig_device_attributes(self, mig: Handle) -> MigDeviceAttributes:
        a = self._call("nvmlDeviceGetAttributes", self._nv.nvmlDeviceGetAttributes_v2, mig)
        return MigDeviceAttributes(
            multiprocessors=a.multiprocessorCount,
            copy_engines=a.sharedCopyEngineCount,
            decoders=a.sharedDecoderCount,
            encoders=a.sharedEncoderCount,
            jpeg_engines=a.sharedJpegCount,
            ofa_engines=a.sharedOfaCount,
            gi_slices=a.gpuInstanceSliceCount,
            ci_slices=a.computeInstanceSliceCount,
            memory_mib=a.memorySizeMB,
        )

    def gpu_instance_by_id(self, handle: Handle, gi_id: int) -> Handle:
        fn = self._nv.nvmlDeviceGetGpuInstanceById
        return self._call("nvmlDeviceGetGpuInstanceById", fn, handle, gi_id)

    def gpu_instance_info(self, gi: Handle) -> tuple[int, int, int, int]:
        """``(gi_id, profile_id, placement_start, placement_size)``."""
        info = self._call("nvmlGpuInstanceGetInfo", self._nv.nvmlGpuInstanceGetInfo, gi)
        return info.id, info.profileId, info.placement.start, info.placement.size

    def compute_instance_profile_id(self, gi: Handle, ci_id: int) -> int:
        fn = self._nv.nvmlGpuInstanceGetComputeInstanceById
        ci = self._call("nvmlGpuInstanceGetComputeInstanceById", fn, gi, ci_id)
        info = self._call("nvmlComputeInstanceGetInfo", self._nv.nvmlComputeInstanceGetInfo, ci)
        return int(info.profileId)

    def gpu_instances(self, handle: Handle, profile_id: int) -> list[Handle]:
        """Handles of the GPU's existing GPU instances of one GI profile."""
        array = (self._nv.c_nvmlGpuInstance_t * _MAX_PLACEMENTS)()
        count = ctypes.c_uint(_MAX_PLACEMENTS)
        fn = self._nv.nvmlDeviceGetGpuInstances
        self._call("nvmlDeviceGetGpuInstances", fn, handle, profile_id, array, ctypes.byref(count))
        return [array[i] for i in range(count.value)]

    def compute_instances(self, gi: Handle, ci_profile_id: int) -> list[Handle]:
        """Handles of a GPU instance's compute instances of one CI profile."""
        array = (self._nv.c_nvmlComputeInstance_t * _MAX_PLACEMENTS)()
        count = ctypes.c_uint(_MAX_PLACEMENTS)
        fn = self._nv.nvmlGpuInstanceGetComputeInstances
        self._call(
            "nvmlGpuInstanceGetComputeInstances", fn, gi, ci_profile_id, array, ctypes.byref(count)
        )
        return [array[i] for i in range(count.value)]

    def compute_instance_by_id(self, gi: Handle, ci_id: int) -> Handle:
        fn = self._nv.nvmlGpuInstanceGetComputeInstanceById
        return self._call("nvmlGpuInstanceGetComputeInstanceById", fn, gi, ci_id)

    def compute_instance_info(self, ci: Handle) -> tuple[int, int, Handle]:
        """``(ci_id, ci_profile_id, MIG device handle)``."""
        info = self._call("nvmlComputeInstanceGetInfo", self._nv.nvmlComputeInstanceGetInfo, ci)
        return int(info.id), int(info.profileId), info.device

    def ci_profile_id(self, gi: Handle, ci_profile: int) -> int:
        """The ID of CI profile ``NVML_COMPUTE_INSTANCE_PROFILE_<x>`` (index) on this GI."""
        fn = self._nv.nvmlGpuInstanceGetComputeInstanceProfileInfo
        info = self._call("nvmlGpuInstanceGetComputeInstanceProfileInfo", fn, gi, ci_profile, 0)
        return int(info.id)

    # ---- MIG changes (dynamic MIG; root only) ----
    def create_gpu_instance(self, handle: Handle, profile_id: int, start: int, size: int) -> Handle:
        """A GPU instance of ``profile_id`` at exactly memory slices ``[start, start+size)``.

        ``NVML_ERROR_INSUFFICIENT_RESOURCES`` when the placement is taken.
        """
        placement = self._nv.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = start, size
        fn = self._nv.nvmlDeviceCreateGpuInstanceWithPlacement
        return self._call(
            "nvmlDeviceCreateGpuInstanceWithPlacement",
            fn,
            handle,
            profile_id,
            ctypes.byref(placement),
        )

    def destroy_gpu_instance(self, gi: Handle) -> None:
        """Fails with ``NVML_ERROR_IN_USE`` while the GI still has compute instances."""
        self._call("nvmlGpuInstanceDestroy", self._nv.nvmlGpuInstanceDestroy, gi)

    def create_compute_instance(self, gi: Handle, ci_profile_id: int) -> Handle:
        fn = self._nv.nvmlGpuInstanceCreateComputeInstance
        return self._call("nvmlGpuInstanceCreateComputeInstance", fn, gi, ci_profile_id)

    def destroy_compute_instance(self, ci: Handle) -> None:
        self._call("nvmlComputeInstanceDestroy", self._nv.nvmlComputeInstanceDestroy, ci)
