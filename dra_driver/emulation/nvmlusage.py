"""Emulated NVML: running processes, per-process and device utilization.

Processes come from control operations (see :mod:`.runtime`); a process on a
MIG device carries its GPU/compute instance IDs. As on real hardware, the
parent GPU's handle lists every process (with instance IDs in MIG mode), a MIG
device's handle lists only its own, and utilization is not available on MIG
handles (``NOT_SUPPORTED``): MIG usage is read as memory per instance.
"""

from __future__ import annotations

import time
from typing import Any

from dra_driver.emulation.nvmlcore import (
    ERROR_INSUFFICIENT_SIZE,
    ERROR_NOT_FOUND,
    ERROR_NOT_SUPPORTED,
    MIB,
    LibraryCore,
    Return,
    as_int,
    deref,
)
from dra_driver.emulation.runtime import NO_INSTANCE, EmulatedProcess


class UsageCalls(LibraryCore):
    """C functions for what runs on a GPU and how busy it is."""

    def _processes(self, handle: Any) -> list[EmulatedProcess]:
        gpu, mig = self._any(handle)
        procs = self._runtime[gpu.index].processes
        if mig is None:
            return list(procs)
        return [p for p in procs if (p.gi_id, p.ci_id) == (mig.gi_id, mig.ci_id)]

    def _c_nvmlDeviceGetComputeRunningProcesses_v3(
        self, handle: Any, count: Any, infos: Any
    ) -> None:
        procs = self._processes(handle)
        counter = deref(count)
        if infos is None or counter.value < len(procs):
            counter.value = len(procs)
            if procs:
                raise Return(ERROR_INSUFFICIENT_SIZE)
            return
        for i, p in enumerate(procs):
            infos[i].pid, infos[i].usedGpuMemory = p.pid, p.used_mib * MIB
            infos[i].gpuInstanceId = NO_INSTANCE if p.gi_id is None else p.gi_id
            infos[i].computeInstanceId = NO_INSTANCE if p.ci_id is None else p.ci_id
        counter.value = len(procs)

    def _c_nvmlDeviceGetProcessUtilization(
        self, handle: Any, samples: Any, count: Any, last_seen: Any
    ) -> None:
        gpu, mig = self._any(handle)
        if mig is not None:
            raise Return(ERROR_NOT_SUPPORTED)
        now_us = int(time.time() * 1e6)
        procs = list(self._runtime[gpu.index].processes) if now_us > as_int(last_seen) else []
        counter = deref(count)
        if samples is None or counter.value < len(procs):
            counter.value = len(procs)
            raise Return(ERROR_INSUFFICIENT_SIZE if procs else ERROR_NOT_FOUND)
        for i, p in enumerate(procs):
            s = samples[i]
            s.pid, s.timeStamp, s.smUtil, s.memUtil = p.pid, now_us, p.sm_util, p.mem_util
            s.encUtil = s.decUtil = 0
        counter.value = len(procs)

    def _c_nvmlDeviceGetUtilizationRates(self, handle: Any, utilization: Any) -> None:
        gpu, mig = self._any(handle)
        if mig is not None:
            raise Return(ERROR_NOT_SUPPORTED)
        procs = self._runtime[gpu.index].processes
        out = deref(utilization)
        out.gpu = min(100, sum(p.sm_util for p in procs))
        out.memory = min(100, sum(p.mem_util for p in procs))
