"""Emulated NVML: MIG mode, GPU-instance profiles and placements, GPU and compute instances.

Queries answer from :class:`~.migstate.MigState`; creating and destroying
instances goes through its placement rules, so overlaps and exhausted
profiles fail with ``NVML_ERROR_INSUFFICIENT_RESOURCES`` as on hardware.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dra_driver.emulation.hardware import EmulatedGpu
from dra_driver.emulation.migrules import (
    CI_SLICES_BY_PROFILE,
    ERROR_IN_USE,
    MigRuleError,
    ci_profiles_for,
)
from dra_driver.emulation.nvmlcore import (
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

    def _c_nvmlDeviceGetGpuInstanceProfileInfoByIdV(
        self, handle: Any, profile_id: Any, info: Any
    ) -> None:
        out = deref(info)
        if out.version != GI_PROFILE_INFO_V2:
            raise Return(ERROR_ARGUMENT_VERSION_MISMATCH)
        p = self._gi_profile_by_id(self._mig_capable(handle), profile_id)
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
        free = self.mig.free_placements(gpu, p)
        deref(count).value = len(free) if gpu.mig_enabled else 0

    # ---- MIG: GPU instances --------------------------------------------------------------
    def _c_nvmlDeviceGetGpuInstances(
        self, handle: Any, profile_id: Any, instances: Any, count: Any
    ) -> None:
        gpu = self._mig_capable(handle)
        p = self._gi_profile_by_id(gpu, profile_id)
        mine = [gi.gi_id for gi in self.mig.gpu_instances(gpu.index) if gi.profile.id == p.id]

        def store(array: Any, i: int, gi_id: int) -> None:
            store_handle(array[i], self._encode(KIND_GI, gpu.index, gi_id))

        self._fill_array(instances, count, mine, store)

    def _c_nvmlDeviceGetGpuInstanceById(self, handle: Any, gi_id: Any, instance: Any) -> None:
        gpu = self._mig_capable(handle)
        if self.mig.gpu_instance(gpu.index, as_int(gi_id)) is None:
            raise Return(ERROR_NOT_FOUND)
        store_handle(deref(instance), self._encode(KIND_GI, gpu.index, as_int(gi_id)))

    def _c_nvmlGpuInstanceGetInfo(self, gi_handle: Any, info: Any) -> None:
        gpu, gi = self._gi(gi_handle)
        out = deref(info)
        store_handle(out.device, self._encode(KIND_GPU, gpu.index))
        out.id, out.profileId = gi.gi_id, gi.profile.id
        out.placement.start, out.placement.size = gi.start, gi.profile.placement_size

    def _c_nvmlDeviceCreateGpuInstance(self, handle: Any, profile_id: Any, instance: Any) -> None:
        self._create_gi(handle, profile_id, None, instance)

    def _c_nvmlDeviceCreateGpuInstanceWithPlacement(
        self, handle: Any, profile_id: Any, placement: Any, instance: Any
    ) -> None:
        self._create_gi(handle, profile_id, deref(placement), instance)

    def _create_gi(self, handle: Any, profile_id: Any, placement: Any, instance: Any) -> None:
        gpu = self._mig_capable(handle)
        p = self._gi_profile_by_id(gpu, profile_id)
        start, size = (None, None) if placement is None else (placement.start, placement.size)
        try:
            gi = self.mig.create_gpu_instance(gpu, p, start, size)
        except MigRuleError as exc:
            raise Return(exc.code) from exc
        store_handle(deref(instance), self._encode(KIND_GI, gpu.index, gi.gi_id))

    def _c_nvmlGpuInstanceDestroy(self, gi_handle: Any) -> None:
        gpu, gi = self._gi(gi_handle)
        try:
            self.mig.destroy_gpu_instance(gpu, gi.gi_id)
        except MigRuleError as exc:
            raise Return(exc.code) from exc

    # ---- MIG: compute instances ----------------------------------------------------------
    def _c_nvmlGpuInstanceGetComputeInstanceProfileInfoV(
        self, gi_handle: Any, index: Any, engine: Any, info: Any
    ) -> None:
        _, gi = self._gi(gi_handle)
        out = deref(info)
        if out.version != CI_PROFILE_INFO_V2:
            raise Return(ERROR_ARGUMENT_VERSION_MISMATCH)
        p = gi.profile
        if as_int(index) not in ci_profiles_for(p.slices) or as_int(engine) != 0:
            raise Return(ERROR_NOT_SUPPORTED)
        slices = CI_SLICES_BY_PROFILE[as_int(index)]
        out.id, out.sliceCount, out.instanceCount = as_int(index), slices, p.slices // slices
        out.multiprocessorCount = p.multiprocessors * slices // p.slices
        out.sharedCopyEngineCount, out.sharedDecoderCount = p.copy_engines, p.decoders
        out.sharedEncoderCount, out.sharedJpegCount, out.sharedOfaCount = (
            p.encoders,
            p.jpeg_engines,
            p.ofa_engines,
        )
        out.name = (f"MIG {slices}c.{p.name}" if slices < p.slices else f"MIG {p.name}").encode()

    def _c_nvmlGpuInstanceGetComputeInstanceRemainingCapacity(
        self, gi_handle: Any, profile_id: Any, count: Any
    ) -> None:
        _, gi = self._gi(gi_handle)
        if as_int(profile_id) not in ci_profiles_for(gi.profile.slices):
            raise Return(ERROR_NOT_SUPPORTED)
        free = gi.profile.slices - sum(c.slices for c in gi.cis.values())
        deref(count).value = free // CI_SLICES_BY_PROFILE[as_int(profile_id)]

    def _c_nvmlGpuInstanceGetComputeInstances(
        self, gi_handle: Any, profile_id: Any, instances: Any, count: Any
    ) -> None:
        gpu, gi = self._gi(gi_handle)
        mine = sorted(c.ci_id for c in gi.cis.values() if c.profile_id == as_int(profile_id))

        def store(array: Any, i: int, ci_id: int) -> None:
            store_handle(
                array[i], self._encode(KIND_CI, gpu.index, self.ci_instance(gi.gi_id, ci_id))
            )

        self._fill_array(instances, count, mine, store)

    def _c_nvmlGpuInstanceGetComputeInstanceById(
        self, gi_handle: Any, ci_id: Any, instance: Any
    ) -> None:
        gpu, gi = self._gi(gi_handle)
        if as_int(ci_id) not in gi.cis:
            raise Return(ERROR_NOT_FOUND)
        encoded = self._encode(KIND_CI, gpu.index, self.ci_instance(gi.gi_id, as_int(ci_id)))
        store_handle(deref(instance), encoded)

    def _c_nvmlComputeInstanceGetInfo_v2(self, ci_handle: Any, info: Any) -> None:
        mig = self._ci(ci_handle)
        index, instance = mig.gpu.index, self.ci_instance(mig.gi_id, mig.ci_id)
        out = deref(info)
        store_handle(out.device, self._encode(KIND_MIG, index, instance))
        store_handle(out.gpuInstance, self._encode(KIND_GI, index, mig.gi_id))
        out.id, out.profileId = mig.ci_id, mig.ci.profile_id
        out.placement.start, out.placement.size = mig.ci.start, mig.ci.slices

    def _c_nvmlGpuInstanceCreateComputeInstance(
        self, gi_handle: Any, profile_id: Any, instance: Any
    ) -> None:
        gpu, gi = self._gi(gi_handle)
        try:
            ci = self.mig.create_compute_instance(gpu, gi.gi_id, as_int(profile_id))
        except MigRuleError as exc:
            raise Return(exc.code) from exc
        encoded = self._encode(KIND_CI, gpu.index, self.ci_instance(gi.gi_id, ci.ci_id))
        store_handle(deref(instance), encoded)

    def _c_nvmlComputeInstanceDestroy(self, ci_handle: Any) -> None:
        mig = self._ci(ci_handle)
        if any(
            (p.gi_id, p.ci_id) == (mig.gi_id, mig.ci_id)
            for p in self._runtime[mig.gpu.index].processes
        ):
            raise Return(ERROR_IN_USE)  # a process still runs on this MIG device
        try:
            self.mig.destroy_compute_instance(mig.gpu, mig.gi_id, mig.ci_id)
        except MigRuleError as exc:
            raise Return(exc.code) from exc

    # ---- MIG device handles --------------------------------------------------------------
    def _c_nvmlDeviceIsMigDeviceHandle(self, handle: Any, result: Any) -> None:
        deref(result).value = int(self._any(handle)[1] is not None)

    def _c_nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: Any, mig: Any) -> None:
        gpu = self._mig_capable(handle)
        if not gpu.mig_enabled:
            raise Return(ERROR_INVALID_ARGUMENT)
        devices = self.mig.mig_devices(gpu)
        if as_int(index) >= len(devices):
            raise Return(ERROR_NOT_FOUND)
        found = devices[as_int(index)]
        encoded = self._encode(KIND_MIG, gpu.index, self.ci_instance(found.gi_id, found.ci_id))
        store_handle(deref(mig), encoded)

    def _c_nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, mig: Any, handle: Any) -> None:
        gpu, device = self._any(mig)
        if device is None:
            raise Return(ERROR_INVALID_ARGUMENT)
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
