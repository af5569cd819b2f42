"""Emulated NVML: MIG mode, GPU-instance profiles and placements, existing instances."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dra_driver.gpu.emulation.nvmlcore import (
    CI_PROFILE_BY_SLICES,
    CI_PROFILE_INFO_V2,
    ERROR_ARGUMENT_VERSION_MISMATCH,
    ERROR_INSUFFICIENT_SIZE,
    ERROR_INVALID_ARGUMENT,
    ERROR_NOT_FOUND,
    ERROR_NOT_SUPPORTED,
    GI_PROFILE_INDEX,
    GI_PROFILE_INFO_V2,
    KIND_CI,
    KIND_GI,
    KIND_GPU,
    KIND_MIG,
    LibraryCore,
    Return,
    as_int,
    deref,
    store_handle,
)
from dra_driver.gpu.emulation.profile import EmulatedGpu


class MigCalls(LibraryCore):
    """C functions for MIG: modes, GPU-instance profiles, instances and MIG device handles."""

    # ---- MIG: modes and profiles ---------------------------------------------------------
    def _mig_capable(self, handle: Any) -> EmulatedGpu:
        gpu = self._gpu(handle)
        if not gpu.model.mig_profiles:
            raise Return(ERROR_NOT_SUPPORTED)
        return gpu

    def _c_nvmlDeviceGetMigMode(self, handle: Any, current: Any, pending: Any) -> None:
        mode = int(self._mig_capable(handle).mig_enabled)
        deref(current).value, deref(pending).value = mode, mode

    def _c_nvmlDeviceGetMaxMigDeviceCount(self, handle: Any, count: Any) -> None:
        gpu = self._gpu(handle)
        deref(count).value = max((p.instances for p in gpu.model.mig_profiles), default=0)

    def _gi_profile_by_index(self, handle: Any, index: Any) -> Any:
        gpu = self._mig_capable(handle)
        for p in gpu.model.mig_profiles:
            if GI_PROFILE_INDEX[p.nvml_profile] == as_int(index):
                return p
        raise Return(ERROR_NOT_SUPPORTED)

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
        self._fill_gi_profile(deref(info), self._gi_profile_by_index(handle, index))

    def _c_nvmlDeviceGetGpuInstanceProfileInfoV(self, handle: Any, index: Any, info: Any) -> None:
        out = deref(info)
        if out.version != GI_PROFILE_INFO_V2:
            raise Return(ERROR_ARGUMENT_VERSION_MISMATCH)
        p = self._gi_profile_by_index(handle, index)
        self._fill_gi_profile(out, p)
        out.name = f"MIG {p.name}".encode()

    def _gi_profile_by_id(self, gpu: EmulatedGpu, profile_id: Any) -> Any:
        for p in gpu.model.mig_profiles:
            if p.id == as_int(profile_id):
                return p
        raise Return(ERROR_INVALID_ARGUMENT)

    @staticmethod
    def _fill_array(
        array: Any, count: Any, items: list[Any], store: Callable[[Any, int, Any], None]
    ) -> None:
        counter = deref(count)
        if array is None:
            counter.value = len(items)
            return
        if counter.value < len(items) and len(array) < len(items):
            counter.value = len(items)
            raise Return(ERROR_INSUFFICIENT_SIZE)
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
        deref(count).value = len(free) if gpu.mig_enabled else 0

    # ---- MIG: existing GPU and compute instances -----------------------------------------
    def _c_nvmlDeviceGetGpuInstances(
        self, handle: Any, profile_id: Any, instances: Any, count: Any
    ) -> None:
        gpu = self._mig_capable(handle)
        p = self._gi_profile_by_id(gpu, profile_id)
        mine = [k for k, m in enumerate(gpu.mig_instances) if m.profile.id == p.id]
        slot = gpu.index

        def store(array: Any, i: int, k: int) -> None:
            store_handle(array[i], self._encode(KIND_GI, slot, k))

        self._fill_array(instances, count, mine, store)

    def _c_nvmlDeviceGetGpuInstanceById(self, handle: Any, gi_id: Any, instance: Any) -> None:
        gpu = self._mig_capable(handle)
        for k, m in enumerate(gpu.mig_instances):
            if m.gi_id == as_int(gi_id):
                return store_handle(deref(instance), self._encode(KIND_GI, gpu.index, k))
        raise Return(ERROR_NOT_FOUND)

    def _c_nvmlGpuInstanceGetInfo(self, gi: Any, info: Any) -> None:
        gpu, _, mig = self._mig(gi, KIND_GI)
        out = deref(info)
        store_handle(out.device, self._encode(KIND_GPU, gpu.index))
        out.id, out.profileId = mig.gi_id, mig.profile.id
        out.placement.start, out.placement.size = mig.start, mig.profile.placement_size

    def _ci_profiles(self, gi_slices: int) -> list[int]:
        return [
            s for s in CI_PROFILE_BY_SLICES if s <= gi_slices and not (gi_slices == 4 and s == 3)
        ]

    def _c_nvmlGpuInstanceGetComputeInstanceProfileInfoV(
        self, gi: Any, index: Any, engine: Any, info: Any
    ) -> None:
        _, _, mig = self._mig(gi, KIND_GI)
        out = deref(info)
        if out.version != CI_PROFILE_INFO_V2:
            raise Return(ERROR_ARGUMENT_VERSION_MISMATCH)
        p = mig.profile
        slices = next((s for s, i in CI_PROFILE_BY_SLICES.items() if i == as_int(index)), None)
        if slices is None or slices not in self._ci_profiles(p.slices) or as_int(engine) != 0:
            raise Return(ERROR_NOT_SUPPORTED)
        out.id, out.sliceCount, out.instanceCount = as_int(index), slices, p.slices // slices
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
        gpu, k, mig = self._mig(gi, KIND_GI)
        match = CI_PROFILE_BY_SLICES.get(mig.profile.slices) == as_int(profile_id)

        def store(array: Any, i: int, item: int) -> None:
            store_handle(array[i], self._encode(KIND_CI, gpu.index, item))

        self._fill_array(instances, count, [k] if match else [], store)

    def _c_nvmlGpuInstanceGetComputeInstanceById(self, gi: Any, ci_id: Any, instance: Any) -> None:
        gpu, k, mig = self._mig(gi, KIND_GI)
        if mig.ci_id != as_int(ci_id):
            raise Return(ERROR_NOT_FOUND)
        store_handle(deref(instance), self._encode(KIND_CI, gpu.index, k))

    def _c_nvmlComputeInstanceGetInfo_v2(self, ci: Any, info: Any) -> None:
        gpu, k, mig = self._mig(ci, KIND_CI)
        out = deref(info)
        store_handle(out.device, self._encode(KIND_MIG, gpu.index, k))
        store_handle(out.gpuInstance, self._encode(KIND_GI, gpu.index, k))
        out.id, out.profileId = mig.ci_id, CI_PROFILE_BY_SLICES[mig.profile.slices]
        out.placement.start, out.placement.size = 0, mig.profile.slices

    # ---- MIG device handles --------------------------------------------------------------
    def _c_nvmlDeviceIsMigDeviceHandle(self, handle: Any, result: Any) -> None:
        deref(result).value = int(self._any(handle)[1] is not None)

    def _c_nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: Any, mig: Any) -> None:
        gpu = self._mig_capable(handle)
        if not gpu.mig_enabled:
            raise Return(ERROR_INVALID_ARGUMENT)
        if as_int(index) >= len(gpu.mig_instances):
            raise Return(ERROR_NOT_FOUND)
        store_handle(deref(mig), self._encode(KIND_MIG, gpu.index, as_int(index)))

    def _c_nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, mig: Any, handle: Any) -> None:
        gpu, _, _ = self._mig(mig, KIND_MIG)
        store_handle(deref(handle), self._encode(KIND_GPU, gpu.index))

    def _c_nvmlDeviceGetGpuInstanceId(self, handle: Any, gi_id: Any) -> None:
        _, mig = self._any(handle)
        if mig is None:
            raise Return(ERROR_NOT_SUPPORTED)
        deref(gi_id).value = mig.gi_id

    def _c_nvmlDeviceGetComputeInstanceId(self, handle: Any, ci_id: Any) -> None:
        _, mig = self._any(handle)
        if mig is None:
            raise Return(ERROR_NOT_SUPPORTED)
        deref(ci_id).value = mig.ci_id
