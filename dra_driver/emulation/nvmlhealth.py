"""Emulated NVML: event sets (Xid, ECC, recovery action), field values and ECC counters.

``nvmlEventSetWait_v2`` blocks like the real call: it returns the oldest event
queued for the set, ``NVML_ERROR_TIMEOUT`` when none came within the timeout,
and ``NVML_ERROR_GPU_IS_LOST`` when a registered GPU fell off the bus. While it
waits it releases the library lock (other threads keep querying). One waiter
at a time re-reads the control file every 20 ms, so events injected by another
process arrive promptly while a node with many GPUs (one waiting thread each)
costs no more than one poller; the others sleep until an event or their
timeout, and a leaving poller hands over to one of them.
"""

from __future__ import annotations

import time
from typing import Any

from dra_driver.emulation.nvmlcore import (
    ERROR_GPU_IS_LOST,
    ERROR_INVALID_ARGUMENT,
    ERROR_NOT_SUPPORTED,
    ERROR_TIMEOUT,
    KIND_EVENT_SET,
    KIND_GPU,
    LibraryCore,
    Return,
    as_int,
    deref,
    handle_value,
    store_handle,
)
from dra_driver.emulation.runtime import SUPPORTED_EVENTS, EventSet

FI_DEV_GET_GPU_RECOVERY_ACTION = 230
"""``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` field ID."""
_VALUE_TYPE_UNSIGNED_INT = 1
_MEMORY_ERROR_UNCORRECTED = 1
_VOLATILE_ECC, _AGGREGATE_ECC = 0, 1
_WAIT_SLICE_S = 0.02


class HealthCalls(LibraryCore):
    """C functions for health monitoring: events, field values and ECC error counters."""

    # ---- event sets ----------------------------------------------------------------------
    def _event_set(self, handle: Any) -> EventSet:
        value = handle_value(handle)
        es = self._event_sets.get(value & 0xFFFF) if value >> 16 == KIND_EVENT_SET else None
        if es is None:
            raise Return(ERROR_INVALID_ARGUMENT)
        return es

    def _c_nvmlEventSetCreate(self, handle: Any) -> None:
        number = self._next_event_set
        self._next_event_set += 1
        self._event_sets[number] = EventSet()
        store_handle(deref(handle), self._encode(KIND_EVENT_SET, 0, 0) | number)

    def _c_nvmlEventSetFree(self, handle: Any) -> None:
        self._event_set(handle)
        del self._event_sets[handle_value(handle) & 0xFFFF]

    def _c_nvmlDeviceGetSupportedEventTypes(self, handle: Any, types: Any) -> None:
        self._gpu(handle)
        deref(types).value = SUPPORTED_EVENTS

    def _c_nvmlDeviceRegisterEvents(self, handle: Any, types: Any, event_set: Any) -> None:
        gpu = self._gpu(handle)  # MIG handles are not accepted: events come from the parent
        mask = as_int(types)
        if mask & ~SUPPORTED_EVENTS:
            raise Return(ERROR_NOT_SUPPORTED)
        es = self._event_set(event_set)
        es.registered[gpu.index] = es.registered.get(gpu.index, 0) | mask

    def _c_nvmlEventSetWait_v2(self, event_set: Any, data: Any, timeout_ms: Any) -> None:
        """One waiter at a time polls the control file (other processes' operations);
        it keeps that role until it returns, then hands it to another waiter."""
        deadline = time.monotonic() + as_int(timeout_ms) / 1000
        polling = False
        try:
            while True:
                es = self._event_set(event_set)  # freed by another thread: INVALID_ARGUMENT
                if es.pending:
                    event = es.pending.popleft()
                    out = deref(data)
                    store_handle(out.device, self._encode(KIND_GPU, event.slot))
                    out.eventType, out.eventData = event.event_type, event.data
                    out.gpuInstanceId, out.computeInstanceId = event.gi_id, event.ci_id
                    return
                if any(s not in self._present or self._runtime[s].lost for s in es.registered):
                    raise Return(ERROR_GPU_IS_LOST)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise Return(ERROR_TIMEOUT)
                if self._control.path is not None and (polling or not self._event_poller):
                    self._event_poller = polling = True
                    self._cond.wait(min(remaining, _WAIT_SLICE_S))  # releases the library lock
                    self._poll_control(force=True)
                else:
                    self._cond.wait(remaining)  # woken by an event (apply) or a handover
        finally:
            if polling:
                self._event_poller = False
                self._cond.notify(1)  # hand the polling over to another waiter

    # ---- field values and ECC --------------------------------------------------------------
    def _c_nvmlDeviceGetFieldValues(self, handle: Any, count: Any, values: Any) -> None:
        gpu = self._gpu(handle)
        array = deref(values)
        now_us = int(time.time() * 1e6)
        for i in range(as_int(count)):
            fv = array[i]
            fv.timestamp, fv.latencyUsec = now_us, 0
            if fv.fieldId == FI_DEV_GET_GPU_RECOVERY_ACTION:
                fv.valueType = _VALUE_TYPE_UNSIGNED_INT
                fv.value.uiVal = self._runtime[gpu.index].recovery_action
                fv.nvmlReturn = 0
            else:
                fv.nvmlReturn = ERROR_NOT_SUPPORTED

    def _c_nvmlDeviceGetTotalEccErrors(
        self, handle: Any, error_type: Any, counter_type: Any, count: Any
    ) -> None:
        gpu = self._gpu(handle)
        if not gpu.model.ecc:
            raise Return(ERROR_NOT_SUPPORTED)
        state = self._runtime[gpu.index]
        if as_int(error_type) != _MEMORY_ERROR_UNCORRECTED:
            deref(count).value = 0
        elif as_int(counter_type) == _VOLATILE_ECC:
            deref(count).value = state.ecc_volatile_uncorrected
        elif as_int(counter_type) == _AGGREGATE_ECC:
            deref(count).value = state.ecc_aggregate_uncorrected
        else:
            raise Return(ERROR_INVALID_ARGUMENT)
