"""Emulated NVML: library, system and per-device queries (full GPUs and MIG devices)."""

from __future__ import annotations

from typing import Any

from dra_driver.emulation.nvmlcore import (
    ARCH_CODES,
    BRAND_CODES,
    ERROR_ARGUMENT_VERSION_MISMATCH,
    ERROR_DRIVER_NOT_LOADED,
    ERROR_INVALID_ARGUMENT,
    ERROR_NOT_FOUND,
    ERROR_NOT_SUPPORTED,
    ERROR_STRINGS,
    ERROR_UNINITIALIZED,
    KIND_GPU,
    KIND_MIG,
    MEMORY_V2,
    MIB,
    LibraryCore,
    Return,
    as_int,
    deref,
    store_handle,
    write_string,
)


class DeviceCalls(LibraryCore):
    """C functions for the library itself, the system, and device identity and figures."""

    # ---- library and system --------------------------------------------------------------
    def _c_nvmlInitWithFlags(self, flags: Any) -> None:
        self._c_nvmlInit_v2()

    def _c_nvmlInit_v2(self) -> None:
        if not self.profile.driver_loaded:  # a node whose kernel module is not loaded (yet)
            raise Return(ERROR_DRIVER_NOT_LOADED)
        self._init_count += 1

    def _c_nvmlShutdown(self) -> None:
        if self._init_count == 0:
            raise Return(ERROR_UNINITIALIZED)
        self._init_count -= 1

    def _c_nvmlErrorString(self, code: Any) -> bytes:
        return ERROR_STRINGS.get(as_int(code), "Unknown Error").encode()

    def _c_nvmlSystemGetDriverVersion(self, buffer: Any, length: Any) -> None:
        write_string(buffer, length, self.profile.driver_version)

    def _c_nvmlSystemGetNVMLVersion(self, buffer: Any, length: Any) -> None:
        major = self.profile.cuda_driver_version // 1000
        write_string(buffer, length, f"{major}.{self.profile.driver_version}")

    def _c_nvmlSystemGetCudaDriverVersion(self, version: Any) -> None:
        deref(version).value = self.profile.cuda_driver_version

    def _c_nvmlSystemGetCudaDriverVersion_v2(self, version: Any) -> None:
        deref(version).value = self.profile.cuda_driver_version

    # ---- device enumeration --------------------------------------------------------------
    def _c_nvmlDeviceGetCount_v2(self, count: Any) -> None:
        deref(count).value = len(self._present)

    def _c_nvmlDeviceGetHandleByIndex_v2(self, index: Any, handle: Any) -> None:
        i = as_int(index)
        if i >= len(self._present):
            raise Return(ERROR_INVALID_ARGUMENT)
        store_handle(deref(handle), self._encode(KIND_GPU, self._present[i]))

    def _c_nvmlDeviceGetHandleByUUID(self, uuid: Any, handle: Any) -> None:
        wanted = deref(uuid).value.decode()
        for slot in self._present:
            gpu = self.profile.gpus[slot]
            if gpu.uuid == wanted:
                return store_handle(deref(handle), self._encode(KIND_GPU, slot))
            for mig in self.mig.mig_devices(gpu):
                if mig.uuid == wanted:
                    instance = self.ci_instance(mig.gi_id, mig.ci_id)
                    return store_handle(deref(handle), self._encode(KIND_MIG, slot, instance))
        raise Return(ERROR_NOT_FOUND)

    def _c_nvmlDeviceGetHandleByPciBusId_v2(self, bus_id: Any, handle: Any) -> None:
        wanted = deref(bus_id).value.decode().lower()
        for slot in self._present:
            gpu = self.profile.gpus[slot]
            if wanted in (gpu.bus_id, "0000" + gpu.bus_id):
                return store_handle(deref(handle), self._encode(KIND_GPU, slot))
        raise Return(ERROR_NOT_FOUND)

    def _c_nvmlDeviceGetIndex(self, handle: Any, index: Any) -> None:
        deref(index).value = self._present.index(self._gpu(handle).index)

    def _c_nvmlDeviceGetMinorNumber(self, handle: Any, minor: Any) -> None:
        deref(minor).value = self._gpu(handle).minor

    # ---- identity and figures (full GPUs and MIG devices) -------------------------------
    def _c_nvmlDeviceGetName(self, handle: Any, buffer: Any, length: Any) -> None:
        gpu, mig = self._any(handle)
        name = gpu.model.product_name + (f" MIG {mig.name}" if mig else "")
        write_string(buffer, length, name)

    def _c_nvmlDeviceGetUUID(self, handle: Any, buffer: Any, length: Any) -> None:
        gpu, mig = self._any(handle)
        write_string(buffer, length, mig.uuid if mig else gpu.uuid)

    def _c_nvmlDeviceGetBrand(self, handle: Any, brand: Any) -> None:
        deref(brand).value = BRAND_CODES[self._any(handle)[0].model.brand]

    def _c_nvmlDeviceGetArchitecture(self, handle: Any, arch: Any) -> None:
        deref(arch).value = ARCH_CODES[self._any(handle)[0].model.architecture]

    def _c_nvmlDeviceGetCudaComputeCapability(self, handle: Any, major: Any, minor: Any) -> None:
        cc = self._any(handle)[0].model.compute_capability
        deref(major).value, deref(minor).value = cc

    def _memory(self, handle: Any) -> tuple[int, int, int]:
        """``(total, reserved, used by processes)`` in bytes."""
        gpu, mig = self._any(handle)
        used = sum(
            p.used_mib * MIB
            for p in self._runtime[gpu.index].processes
            if mig is None or (p.gi_id, p.ci_id) == (mig.gi_id, mig.ci_id)
        )
        if mig:
            return mig.profile.memory_mib * MIB, 0, used
        return gpu.model.memory_mib * MIB, gpu.model.reserved_mib * MIB, used

    def _c_nvmlDeviceGetMemoryInfo(self, handle: Any, memory: Any) -> None:
        total, reserved, used = self._memory(handle)
        info = deref(memory)
        info.total, info.used = total, reserved + used
        info.free = total - info.used

    def _c_nvmlDeviceGetMemoryInfo_v2(self, handle: Any, memory: Any) -> None:
        info = deref(memory)
        if info.version != MEMORY_V2:
            raise Return(ERROR_ARGUMENT_VERSION_MISMATCH)
        total, reserved, used = self._memory(handle)
        info.total, info.reserved, info.used = total, reserved, used
        info.free = total - reserved - used

    def _c_nvmlDeviceGetNumGpuCores(self, handle: Any, cores: Any) -> None:
        gpu, mig = self._any(handle)
        sms = mig.multiprocessors if mig else gpu.model.multiprocessors
        deref(cores).value = sms * gpu.model.cores_per_multiprocessor

    def _c_nvmlDeviceGetPciInfo_v3(self, handle: Any, pci: Any) -> None:
        gpu = self._any(handle)[0]
        dom, bus, rest = gpu.bus_id.split(":")
        info = deref(pci)
        info.busIdLegacy = gpu.bus_id.upper().encode()
        info.busId = f"0000{gpu.bus_id}".upper().encode()
        info.domain, info.bus, info.device = int(dom, 16), int(bus, 16), int(rest.split(".")[0], 16)
        info.pciDeviceId, info.pciSubSystemId = gpu.model.pci_device_id, gpu.model.pci_subsystem_id

    def _c_nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any, gen: Any) -> None:
        deref(gen).value = self._gpu(handle).model.pcie_generation

    def _c_nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any, width: Any) -> None:
        deref(width).value = self._gpu(handle).model.pcie_link_width

    def _c_nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any, gen: Any) -> None:
        deref(gen).value = 1  # idle GPUs train down to Gen1; why discovery uses the max

    def _c_nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any, width: Any) -> None:
        deref(width).value = self._gpu(handle).model.pcie_link_width

    def _c_nvmlDeviceGetEccMode(self, handle: Any, current: Any, pending: Any) -> None:
        ecc = int(self._gpu(handle).model.ecc)
        deref(current).value, deref(pending).value = ecc, ecc

    def _c_nvmlDeviceGetComputeMode(self, handle: Any, mode: Any) -> None:
        self._gpu(handle)
        deref(mode).value = 0

    def _c_nvmlDeviceGetAttributes_v2(self, handle: Any, attrs: Any) -> None:
        _, mig = self._any(handle)
        if mig is None:
            raise Return(ERROR_NOT_SUPPORTED)  # NVML documents this for MIG handles only
        p, out = mig.profile, deref(attrs)
        out.multiprocessorCount, out.sharedCopyEngineCount = mig.multiprocessors, p.copy_engines
        out.sharedDecoderCount, out.sharedEncoderCount = p.decoders, p.encoders
        out.sharedJpegCount, out.sharedOfaCount = p.jpeg_engines, p.ofa_engines
        out.gpuInstanceSliceCount, out.computeInstanceSliceCount = p.slices, mig.ci.slices
        out.memorySizeMB = p.memory_mib
