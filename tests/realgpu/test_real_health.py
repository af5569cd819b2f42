"""Health and usage on a real GPU: the NVML calls the health monitor and the usage
sampler make work against the real driver (not only the emulation below pynvml), a
healthy GPU stays healthy under the monitor, and a running CUDA process is seen with
its memory, as the per-claim usage metrics need."""

from __future__ import annotations

import json
import logging
import time

from dra_driver.gpu.hardware.inventory import Inventory
from dra_driver.gpu.hardware.nvml import Nvml
from dra_driver.gpu.hardware.nvmlerrors import NvmlError
from dra_driver.gpu.hardware.nvmlmonitor import (
    EVENT_DOUBLE_BIT_ECC,
    EVENT_GPU_UNAVAILABLE,
    EVENT_XID_CRITICAL,
)
from dra_driver.gpu.monitoring.healthpolicy import HealthPolicy
from dra_driver.gpu.monitoring.monitor import HealthMonitor
from tests.realgpu.realhost import Client, record

log = logging.getLogger("test.realgpu")
GIB = 1 << 30


def test_monitor_keeps_a_healthy_gpu_healthy(inventory: Inventory) -> None:
    """Event watchers registered on every GPU and periodic checks (recovery action, ECC)
    run for a few seconds without a single fault or lost watcher."""
    changes: list[int] = []
    monitor = HealthMonitor(
        nvml=Nvml(), policy=HealthPolicy(check_interval_s=0.5), logger=log,
        on_change=lambda: changes.append(1), event_wait_ms=200,
    )  # fmt: skip
    monitor.start(inventory)
    try:
        time.sleep(3)
        snapshot = monitor.book.snapshot()
    finally:
        monitor.stop()
    record("health monitor, 3 s", f"faults={dict(snapshot.faults)} changes={len(changes)}")
    assert snapshot.faults == {}
    assert changes == []


def test_monitoring_calls_answer_on_the_real_driver(inventory: Inventory) -> None:
    gpu = min(inventory.gpus, key=lambda g: g.minor)
    nvml = Nvml()
    nvml.init()
    seen: dict[str, object] = {}
    client = None
    try:
        handle = nvml.handle_by_uuid(gpu.uuid)
        mask = nvml.supported_event_types(handle)
        seen["supported event types"] = hex(mask)
        wanted = mask & (EVENT_XID_CRITICAL | EVENT_DOUBLE_BIT_ECC | EVENT_GPU_UNAVAILABLE)
        events = nvml.event_set_create()
        try:
            nvml.register_events(handle, wanted, events)
            seen["event in 200 ms"] = nvml.event_set_wait(events, 200)
        finally:
            nvml.event_set_free(events)
        calls = {"recovery action": nvml.recovery_action,
                 "uncorrected ECC": nvml.uncorrected_ecc_errors,
                 "nvlinks": nvml.nvlinks, "fabric": nvml.fabric_info}  # fmt: skip
        for name, call in calls.items():
            try:
                seen[name] = call(handle)
            except NvmlError as exc:  # recorded; NVLink/fabric are not on every GPU or VM
                seen[name] = f"NvmlError {exc.code}: {exc}"
        before = nvml.memory_used(handle)
        client = Client("usage", None, None)
        assert client.up, client.hello
        assert client.alloc(2) == 0
        procs = nvml.running_processes(handle)
        seen["processes while a client holds 2 GiB"] = [repr(p) for p in procs]
        seen["memory used before / during (MiB)"] = (before >> 20, nvml.memory_used(handle) >> 20)
        seen["utilization (gpu %, mem %)"] = nvml.utilization(handle)
        seen["process samples"] = [repr(s) for s in nvml.process_utilization(handle, 0)]
    finally:
        if client is not None:
            client.close()
        nvml.shutdown()
    record("NVML monitoring calls", json.dumps(seen, indent=1, default=str))
    assert mask & EVENT_XID_CRITICAL and wanted
    assert seen["event in 200 ms"] is None
    assert seen["recovery action"] == 0
    assert isinstance(seen["uncorrected ECC"], int)
    mine = [p for p in procs if p.pid == client.proc.pid]
    assert mine and mine[0].used_bytes is not None and mine[0].used_bytes >= 2 * GIB, seen
    used = seen["memory used before / during (MiB)"]
    assert isinstance(used, tuple) and used[1] - used[0] >= 2048, seen
