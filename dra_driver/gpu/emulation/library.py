"""An emulated ``libnvidia-ml.so``: the object ``pynvml`` calls instead of the C library.

``pynvml`` looks every C function up by name on its module-level ``nvmlLib``
and calls it with ctypes arguments (``byref`` out-integers and structs,
``create_string_buffer`` out-strings, opaque handle pointers). This class
answers those calls from an :class:`EmulatedProfile`, filling the ctypes
out-arguments and returning NVML return codes, so every line of ``pynvml`` and
of our discovery runs exactly as on a GPU node. Functions it does not know
behave like symbols missing from an old driver (``NVML_ERROR_FUNCTION_NOT_FOUND``).

Handles are small integers stored in the opaque pointers: the kind in the high
bits, the GPU's profile slot and instance number below. A GPU removed with
:meth:`EmulatedNvmlLibrary.remove_gpu` vanishes from the count and its old
handles answer ``NVML_ERROR_GPU_IS_LOST``, as a GPU that fell off the bus does.

Faults are injected per GPU and C function name (``*`` for every function),
from the profile (``faults:``) or at run time with :meth:`inject_fault`.
"""

from __future__ import annotations

import ctypes
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from dra_driver.gpu.emulation.profile import EmulatedGpu, EmulatedMigInstance, EmulatedProfile

# NVML return codes (nvml.h).
SUCCESS = 0
ERROR_UNINITIALIZED = 1
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NOT_FOUND = 6
ERROR_INSUFFICIENT_SIZE = 7
ERROR_FUNCTION_NOT_FOUND = 13
ERROR_GPU_IS_LOST = 15
ERROR_ARGUMENT_VERSION_MISMATCH = 25
ERROR_UNKNOWN = 999

_ERROR_STRINGS = {
    SUCCESS: "Success",
    ERROR_UNINITIALIZED: "Uninitialized",
    ERROR_INVALID_ARGUMENT: "Invalid Argument",
    ERROR_NOT_SUPPORTED: "Not Supported",
    ERROR_NOT_FOUND: "Not Found",
    ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
    ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    ERROR_GPU_IS_LOST: "GPU is lost",
    ERROR_ARGUMENT_VERSION_MISMATCH: "Argument version mismatch",
    ERROR_UNKNOWN: "Unknown Error",
}

_BRAND_CODES = {"NVIDIA": 14, "TESLA": 2, "QUADRO": 1, "GEFORCE": 5, "TITAN": 6,
                "NVIDIA_RTX": 13, "QUADRO_RTX": 12}  # fmt: skip
_ARCH_CODES = {"KEPLER": 2, "MAXWELL": 3, "PASCAL": 4, "VOLTA": 5, "TURING": 6, "AMPERE": 7,
               "ADA": 8, "HOPPER": 9, "BLACKWELL": 10}  # fmt: skip
# NVML_GPU_INSTANCE_PROFILE_<x> constants: the index nvmlDeviceGetGpuInstanceProfileInfo takes.
_GI_PROFILE_INDEX = {"1_SLICE": 0, "2_SLICE": 1, "3_SLICE": 2, "4_SLICE": 3, "7_SLICE": 4,
                     "8_SLICE": 5, "6_SLICE": 6, "1_SLICE_REV1": 7, "2_SLICE_REV1": 8,
                     "1_SLICE_REV2": 9}  # fmt: skip
# NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE index (== profile id) by compute-slice count.
_CI_PROFILE_BY_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
# Struct versions pynvml puts in the version field (nvml.h NVML_STRUCT_VERSION(...)).
_MEMORY_V2 = 0x02000028
_GI_PROFILE_INFO_V2 = 0x02000098
_CI_PROFILE_INFO_V2 = 0x02000088

_KIND_GPU, _KIND_MIG, _KIND_GI, _KIND_CI = 1, 2, 3, 4
_MIB = 1024 * 1024


class _Return(Exception):
    """Carries an NVML return code out of an emulated function."""

    def __init__(self, code: int) -> None:
        self.code = code


def _out(arg: Any) -> Any:
    """The ctypes object behind a ``byref()`` argument (or the object itself)."""
    return getattr(arg, "_obj", arg)


def _int(arg: Any) -> int:
    return int(arg.value) if hasattr(arg, "value") else int(arg)


def _handle_value(handle: Any) -> int:
    if handle is None:
        return 0
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


def _store_handle(target: Any, value: int) -> None:
    """Write a handle value into a ctypes pointer object in place."""
    holder = ctypes.c_void_p(value)
    ctypes.memmove(ctypes.addressof(target), ctypes.addressof(holder), ctypes.sizeof(holder))


def _write_string(buffer: Any, length: Any, text: str) -> None:
    data = text.encode() + b"\0"
    if len(data) > _int(length):
        raise _Return(ERROR_INSUFFICIENT_SIZE)
    ctypes.memmove(buffer, data, len(data))


class _CFunction:
    """One emulated C symbol; attributes like ``restype`` can be set as on a ctypes function."""

    def __init__(self, library: EmulatedNvmlLibrary, name: str, impl: Callable[..., None]) -> None:
        self.library, self.name, self.impl = library, name, impl
        self.restype: Any = ctypes.c_int
        self.argtypes: Any = None

    def __call__(self, *args: Any) -> Any:
        return self.library._dispatch(self.name, self.impl, args)


class EmulatedNvmlLibrary:
    """Stands in for the loaded NVML shared library; install as ``pynvml.nvmlLib``."""

    def __init__(self, profile: EmulatedProfile) -> None:
        self.profile = profile
        self._lock = threading.RLock()
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

    @property
    def present_gpus(self) -> tuple[EmulatedGpu, ...]:
        with self._lock:
            return tuple(self.profile.gpus[i] for i in self._present)

    # ---- symbol lookup, as ctypes.CDLL does ----------------------------------------------
    def __getattr__(self, name: str) -> _CFunction:
        if not name.startswith("nvml"):
            raise AttributeError(name)
        impl = getattr(type(self), "_c_" + name, None)
        if impl is None:
            raise AttributeError(f"emulated NVML has no symbol {name}")
        return _CFunction(self, name, impl.__get__(self))

    def _dispatch(self, name: str, impl: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        with self._lock:
            self.calls[name] += 1
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
            except _Return as ret:
                return ret.code
            return SUCCESS

    def _subject(self, name: str, args: tuple[Any, ...]) -> int | None:
        """The GPU slot a call is about, for fault injection."""
        if name == "nvmlDeviceGetHandleByIndex_v2":
            index = _int(args[0])
            return self._present[index] if index < len(self._present) else None
        if name.startswith(("nvmlDevice", "nvmlGpuInstance", "nvmlComputeInstance")) and args:
            value = _handle_value(args[0]) if not isinstance(args[0], int | bytes) else 0
            if value >> 16 in (_KIND_GPU, _KIND_MIG, _KIND_GI, _KIND_CI):
                return (value >> 8) & 0xFF
        return None

    # ---- handles -------------------------------------------------------------------------
    @staticmethod
    def _encode(kind: int, slot: int, instance: int = 0) -> int:
        return (kind << 16) | (slot << 8) | instance

    def _decode(self, handle: Any, *kinds: int) -> tuple[int, EmulatedGpu, int]:
        value = _handle_value(handle)
        kind, slot, instance = value >> 16, (value >> 8) & 0xFF, value & 0xFF
        if kind not in kinds or slot >= len(self.profile.gpus):
            raise _Return(ERROR_INVALID_ARGUMENT)
        if slot not in self._present:
            raise _Return(ERROR_GPU_IS_LOST)
        gpu = self.profile.gpus[slot]
        if kind != _KIND_GPU and instance >= len(gpu.mig_instances):
            raise _Return(ERROR_INVALID_ARGUMENT)
        return kind, gpu, instance

    def _gpu(self, handle: Any) -> EmulatedGpu:
        return self._decode(handle, _KIND_GPU)[1]

    def _any(self, handle: Any) -> tuple[EmulatedGpu, EmulatedMigInstance | None]:
        kind, gpu, instance = self._decode(handle, _KIND_GPU, _KIND_MIG)
        return gpu, gpu.mig_instances[instance] if kind == _KIND_MIG else None

    def _mig(self, handle: Any, kind: int) -> tuple[EmulatedGpu, int, EmulatedMigInstance]:
        _, gpu, instance = self._decode(handle, kind)
        return gpu, instance, gpu.mig_instances[instance]

    # ---- library and system --------------------------------------------------------------
    def _c_nvmlInitWithFlags(self, flags: Any) -> None:
        self._init_count += 1

    def _c_nvmlInit_v2(self) -> None:
        self._init_count += 1

    def _c_nvmlShutdown(self) -> None:
        if self._init_count == 0:
            raise _Return(ERROR_UNINITIALIZED)
        self._init_count -= 1

    def _c_nvmlErrorString(self, code: Any) -> bytes:
        return _ERROR_STRINGS.get(_int(code), "Unknown Error").encode()

    def _c_nvmlSystemGetDriverVersion(self, buffer: Any, length: Any) -> None:
        _write_string(buffer, length, self.profile.driver_version)

    def _c_nvmlSystemGetNVMLVersion(self, buffer: Any, length: Any) -> None:
        major = self.profile.cuda_driver_version // 1000
        _write_string(buffer, length, f"{major}.{self.profile.driver_version}")

    def _c_nvmlSystemGetCudaDriverVersion(self, version: Any) -> None:
        _out(version).value = self.profile.cuda_driver_version

    def _c_nvmlSystemGetCudaDriverVersion_v2(self, version: Any) -> None:
        _out(version).value = self.profile.cuda_driver_version

    # ---- device enumeration --------------------------------------------------------------
    def _c_nvmlDeviceGetCount_v2(self, count: Any) -> None:
        _out(count).value = len(self._present)

    def _c_nvmlDeviceGetHandleByIndex_v2(self, index: Any, handle: Any) -> None:
        i = _int(index)
        if i >= len(self._present):
            raise _Return(ERROR_INVALID_ARGUMENT)
        _store_handle(_out(handle), self._encode(_KIND_GPU, self._present[i]))

    def _c_nvmlDeviceGetHandleByUUID(self, uuid: Any, handle: Any) -> None:
        wanted = _out(uuid).value.decode()
        for slot in self._present:
            gpu = self.profile.gpus[slot]
            if gpu.uuid == wanted:
                return _store_handle(_out(handle), self._encode(_KIND_GPU, slot))
            for k, mig in enumerate(gpu.mig_instances):
                if mig.uuid == wanted:
                    return _store_handle(_out(handle), self._encode(_KIND_MIG, slot, k))
        raise _Return(ERROR_NOT_FOUND)

    def _c_nvmlDeviceGetHandleByPciBusId_v2(self, bus_id: Any, handle: Any) -> None:
        wanted = _out(bus_id).value.decode().lower()
        for slot in self._present:
            gpu = self.profile.gpus[slot]
            if wanted in (gpu.bus_id, "0000" + gpu.bus_id):
                return _store_handle(_out(handle), self._encode(_KIND_GPU, slot))
        raise _Return(ERROR_NOT_FOUND)

    def _c_nvmlDeviceGetIndex(self, handle: Any, index: Any) -> None:
        _out(index).value = self._present.index(self._gpu(handle).index)

    def _c_nvmlDeviceGetMinorNumber(self, handle: Any, minor: Any) -> None:
        _out(minor).value = self._gpu(handle).minor

    # ---- identity and figures (full GPUs and MIG devices) -------------------------------
    def _c_nvmlDeviceGetName(self, handle: Any, buffer: Any, length: Any) -> None:
        gpu, mig = self._any(handle)
        name = gpu.model.product_name + (f" MIG {mig.profile.name}" if mig else "")
        _write_string(buffer, length, name)

    def _c_nvmlDeviceGetUUID(self, handle: Any, buffer: Any, length: Any) -> None:
        gpu, mig = self._any(handle)
        _write_string(buffer, length, mig.uuid if mig else gpu.uuid)

    def _c_nvmlDeviceGetBrand(self, handle: Any, brand: Any) -> None:
        _out(brand).value = _BRAND_CODES[self._any(handle)[0].model.brand]

    def _c_nvmlDeviceGetArchitecture(self, handle: Any, arch: Any) -> None:
        _out(arch).value = _ARCH_CODES[self._any(handle)[0].model.architecture]

    def _c_nvmlDeviceGetCudaComputeCapability(self, handle: Any, major: Any, minor: Any) -> None:
        cc = self._any(handle)[0].model.compute_capability
        _out(major).value, _out(minor).value = cc

    def _memory(self, handle: Any) -> tuple[int, int]:
        gpu, mig = self._any(handle)
        if mig:
            return mig.profile.memory_mib * _MIB, 0
        return gpu.model.memory_mib * _MIB, gpu.model.reserved_mib * _MIB

    def _c_nvmlDeviceGetMemoryInfo(self, handle: Any, memory: Any) -> None:
        total, reserved = self._memory(handle)
        info = _out(memory)
        info.total, info.used, info.free = total, reserved, total - reserved

    def _c_nvmlDeviceGetMemoryInfo_v2(self, handle: Any, memory: Any) -> None:
        info = _out(memory)
        if info.version != _MEMORY_V2:
            raise _Return(ERROR_ARGUMENT_VERSION_MISMATCH)
        total, reserved = self._memory(handle)
        info.total, info.reserved, info.used, info.free = total, reserved, 0, total - reserved

    def _c_nvmlDeviceGetNumGpuCores(self, handle: Any, cores: Any) -> None:
        gpu, mig = self._any(handle)
        sms = mig.profile.multiprocessors if mig else gpu.model.multiprocessors
        _out(cores).value = sms * gpu.model.cores_per_multiprocessor

    def _c_nvmlDeviceGetPciInfo_v3(self, handle: Any, pci: Any) -> None:
        gpu = self._any(handle)[0]
        dom, bus, rest = gpu.bus_id.split(":")
        info = _out(pci)
        info.busIdLegacy = gpu.bus_id.upper().encode()
        info.busId = f"0000{gpu.bus_id}".upper().encode()
        info.domain, info.bus, info.device = int(dom, 16), int(bus, 16), int(rest.split(".")[0], 16)
        info.pciDeviceId, info.pciSubSystemId = gpu.model.pci_device_id, gpu.model.pci_subsystem_id

    def _c_nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any, gen: Any) -> None:
        _out(gen).value = self._gpu(handle).model.pcie_generation

    def _c_nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any, width: Any) -> None:
        _out(width).value = self._gpu(handle).model.pcie_link_width

    def _c_nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any, gen: Any) -> None:
        _out(gen).value = 1  # idle GPUs train down to Gen1; why discovery uses the max

    def _c_nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any, width: Any) -> None:
        _out(width).value = self._gpu(handle).model.pcie_link_width

    def _c_nvmlDeviceGetEccMode(self, handle: Any, current: Any, pending: Any) -> None:
        ecc = int(self._gpu(handle).model.ecc)
        _out(current).value, _out(pending).value = ecc, ecc

    def _c_nvmlDeviceGetComputeMode(self, handle: Any, mode: Any) -> None:
        self._gpu(handle)
        _out(mode).value = 0

    def _c_nvmlDeviceGetAttributes_v2(self, handle: Any, attrs: Any) -> None:
        _, mig = self._any(handle)
        if mig is None:
            raise _Return(ERROR_NOT_SUPPORTED)  # NVML documents this for MIG handles only
        p, out = mig.profile, _out(attrs)
        out.multiprocessorCount, out.sharedCopyEngineCount = p.multiprocessors, p.copy_engines
        out.sharedDecoderCount, out.sharedEncoderCount = p.decoders, p.encoders
        out.sharedJpegCount, out.sharedOfaCount = p.jpeg_engines, p.ofa_engines
        out.gpuInstanceSliceCount = out.computeInstanceSliceCount = p.slices
        out.memorySizeMB = p.memory_mib

    # ---- MIG: modes and profiles ---------------------------------------------------------
    def _mig_capable(self, handle: Any) -> EmulatedGpu:
        gpu = self._gpu(handle)
        if not gpu.model.mig_profiles:
            raise _Return(ERROR_NOT_SUPPORTED)
        return gpu

    def _c_nvmlDeviceGetMigMode(self, handle: Any, current: Any, pending: Any) -> None:
        mode = int(self._mig_capable(handle).mig_enabled)
        _out(current).value, _out(pending).value = mode, mode

    def _c_nvmlDeviceGetMaxMigDeviceCount(self, handle: Any, count: Any) -> None:
        gpu = self._gpu(handle)
        _out(count).value = max((p.instances for p in gpu.model.mig_profiles), default=0)

    def _gi_profile_by_index(self, handle: Any, index: Any) -> Any:
        gpu = self._mig_capable(handle)
        for p in gpu.model.mig_profiles:
            if _GI_PROFILE_INDEX[p.nvml_profile] == _int(index):
                return p
        raise _Return(ERROR_NOT_SUPPORTED)

    def _fill_gi_profile(self, info: Any, p: Any) -> None:
        info.id, info.isP2pSupported, info.sliceCount = p.id, 0, p.slices
        info.instanceCount, info.multiprocessorCount = p.instances, p.multiprocessors
        info.copyEngineCount, info.decoderCount, info.encoderCount = (
            p.copy_engines,
            p.decoders,
            p.encoders,
        )
        info.jpegCount, info.ofaCount, info.memorySizeMB = (
            p.jpeg_engines,
            p.ofa_engines,
            p.memory_mib,
        )

    def _c_nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, index: Any, info: Any) -> None:
        self._fill_gi_profile(_out(info), self._gi_profile_by_index(handle, index))

    def _c_nvmlDeviceGetGpuInstanceProfileInfoV(self, handle: Any, index: Any, info: Any) -> None:
        out = _out(info)
        if out.version != _GI_PROFILE_INFO_V2:
            raise _Return(ERROR_ARGUMENT_VERSION_MISMATCH)
        p = self._gi_profile_by_index(handle, index)
        self._fill_gi_profile(out, p)
        out.name = f"MIG {p.name}".encode()

    def _gi_profile_by_id(self, gpu: EmulatedGpu, profile_id: Any) -> Any:
        for p in gpu.model.mig_profiles:
            if p.id == _int(profile_id):
                return p
        raise _Return(ERROR_INVALID_ARGUMENT)

    @staticmethod
    def _fill_array(
        array: Any, count: Any, items: list[Any], store: Callable[[Any, int, Any], None]
    ) -> None:
        counter = _out(count)
        if array is None:
            counter.value = len(items)
            return
        if counter.value < len(items) and len(array) < len(items):
            counter.value = len(items)
            raise _Return(ERROR_INSUFFICIENT_SIZE)
        for i, item in enumerate(items):
            store(array, i, item)
        counter.value = len(items)

    def _c_nvmlDeviceGetGpuInstancePossiblePlacements_v2(
        self, handle: Any, profile_id: Any, placements: Any, count: Any
    ) -> None:
        gpu = self._mig_capable(handle)
        p = self._gi_profile_by_id(gpu, profile_id)

        def store(array: Any, i: int, start: int) -> None:
            array[i].start, array[i].size = start, p.placement_size

        self._fill_array(placements, count, list(p.placements), store)

    def _c_nvmlDeviceGetGpuInstanceRemainingCapacity(
        self, handle: Any, profile_id: Any, count: Any
    ) -> None:
        gpu = self._mig_capable(handle)
        p = self._gi_profile_by_id(gpu, profile_id)
        used = {
            s for m in gpu.mig_instances for s in range(m.start, m.start + m.profile.placement_size)
        }
        free = [s for s in p.placements if not used & set(range(s, s + p.placement_size))]
        _out(count).value = len(free) if gpu.mig_enabled else 0

    # ---- MIG: existing GPU and compute instances -----------------------------------------
    def _c_nvmlDeviceGetGpuInstances(
        self, handle: Any, profile_id: Any, instances: Any, count: Any
    ) -> None:
        gpu = self._mig_capable(handle)
        p = self._gi_profile_by_id(gpu, profile_id)
        mine = [k for k, m in enumerate(gpu.mig_instances) if m.profile.id == p.id]
        slot = gpu.index

        def store(array: Any, i: int, k: int) -> None:
            _store_handle(array[i], self._encode(_KIND_GI, slot, k))

        self._fill_array(instances, count, mine, store)

    def _c_nvmlDeviceGetGpuInstanceById(self, handle: Any, gi_id: Any, instance: Any) -> None:
        gpu = self._mig_capable(handle)
        for k, m in enumerate(gpu.mig_instances):
            if m.gi_id == _int(gi_id):
                return _store_handle(_out(instance), self._encode(_KIND_GI, gpu.index, k))
        raise _Return(ERROR_NOT_FOUND)

    def _c_nvmlGpuInstanceGetInfo(self, gi: Any, info: Any) -> None:
        gpu, _, mig = self._mig(gi, _KIND_GI)
        out = _out(info)
        _store_handle(out.device, self._encode(_KIND_GPU, gpu.index))
        out.id, out.profileId = mig.gi_id, mig.profile.id
        out.placement.start, out.placement.size = mig.start, mig.profile.placement_size

    def _ci_profiles(self, gi_slices: int) -> list[int]:
        return [
            s for s in _CI_PROFILE_BY_SLICES if s <= gi_slices and not (gi_slices == 4 and s == 3)
        ]

    def _c_nvmlGpuInstanceGetComputeInstanceProfileInfoV(
        self, gi: Any, index: Any, engine: Any, info: Any
    ) -> None:
        _, _, mig = self._mig(gi, _KIND_GI)
        out = _out(info)
        if out.version != _CI_PROFILE_INFO_V2:
            raise _Return(ERROR_ARGUMENT_VERSION_MISMATCH)
        p = mig.profile
        slices = next((s for s, i in _CI_PROFILE_BY_SLICES.items() if i == _int(index)), None)
        if slices is None or slices not in self._ci_profiles(p.slices) or _int(engine) != 0:
            raise _Return(ERROR_NOT_SUPPORTED)
        out.id, out.sliceCount, out.instanceCount = _int(index), slices, p.slices // slices
        out.multiprocessorCount = p.multiprocessors * slices // p.slices
        out.sharedCopyEngineCount, out.sharedDecoderCount = p.copy_engines, p.decoders
        out.sharedEncoderCount, out.sharedJpegCount, out.sharedOfaCount = (
            p.encoders,
            p.jpeg_engines,
            p.ofa_engines,
        )
        out.name = f"MIG {slices}c.{p.name}".encode()

    def _c_nvmlGpuInstanceGetComputeInstances(
        self, gi: Any, profile_id: Any, instances: Any, count: Any
    ) -> None:
        gpu, k, mig = self._mig(gi, _KIND_GI)
        match = _CI_PROFILE_BY_SLICES.get(mig.profile.slices) == _int(profile_id)

        def store(array: Any, i: int, item: int) -> None:
            _store_handle(array[i], self._encode(_KIND_CI, gpu.index, item))

        self._fill_array(instances, count, [k] if match else [], store)

    def _c_nvmlGpuInstanceGetComputeInstanceById(self, gi: Any, ci_id: Any, instance: Any) -> None:
        gpu, k, mig = self._mig(gi, _KIND_GI)
        if mig.ci_id != _int(ci_id):
            raise _Return(ERROR_NOT_FOUND)
        _store_handle(_out(instance), self._encode(_KIND_CI, gpu.index, k))

    def _c_nvmlComputeInstanceGetInfo_v2(self, ci: Any, info: Any) -> None:
        gpu, k, mig = self._mig(ci, _KIND_CI)
        out = _out(info)
        _store_handle(out.device, self._encode(_KIND_MIG, gpu.index, k))
        _store_handle(out.gpuInstance, self._encode(_KIND_GI, gpu.index, k))
        out.id, out.profileId = mig.ci_id, _CI_PROFILE_BY_SLICES[mig.profile.slices]
        out.placement.start, out.placement.size = 0, mig.profile.slices

    # ---- MIG device handles --------------------------------------------------------------
    def _c_nvmlDeviceIsMigDeviceHandle(self, handle: Any, result: Any) -> None:
        _out(result).value = int(self._any(handle)[1] is not None)

    def _c_nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: Any, mig: Any) -> None:
        gpu = self._mig_capable(handle)
        if not gpu.mig_enabled:
            raise _Return(ERROR_INVALID_ARGUMENT)
        if _int(index) >= len(gpu.mig_instances):
            raise _Return(ERROR_NOT_FOUND)
        _store_handle(_out(mig), self._encode(_KIND_MIG, gpu.index, _int(index)))

    def _c_nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, mig: Any, handle: Any) -> None:
        gpu, _, _ = self._mig(mig, _KIND_MIG)
        _store_handle(_out(handle), self._encode(_KIND_GPU, gpu.index))

    def _c_nvmlDeviceGetGpuInstanceId(self, handle: Any, gi_id: Any) -> None:
        _, mig = self._any(handle)
        if mig is None:
            raise _Return(ERROR_NOT_SUPPORTED)
        _out(gi_id).value = mig.gi_id

    def _c_nvmlDeviceGetComputeInstanceId(self, handle: Any, ci_id: Any) -> None:
        _, mig = self._any(handle)
        if mig is None:
            raise _Return(ERROR_NOT_SUPPORTED)
        _out(ci_id).value = mig.ci_id
