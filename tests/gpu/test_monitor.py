"""The health monitor on emulated GPUs, through real pynvml: events and periodic checks feed
the GPU driver's pool (taints) and health (one state per device), and faults heal."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pynvml
import pytest

from dra_driver.emulation import EmulatedNode
from dra_driver.gpu.driver import GpuDriver
from dra_driver.gpu.hardware.discovery import discover
from dra_driver.gpu.monitoring.healthpolicy import HealthPolicy
from dra_driver.gpu.sharing.tools import GpuTools

LOG = logging.getLogger("tests.monitor")
FAST = HealthPolicy(healthy_period_s=0.6, check_interval_s=0.1)


class Running:
    def __init__(self, node: EmulatedNode, driver: GpuDriver) -> None:
        self.node, self.driver = node, driver
        self.changes = threading.Semaphore(0)

    def taints(self) -> dict[str, list[tuple[str, str, str]]]:
        return {
            d.name: [(t.key.split("/")[1], t.value, t.effect) for t in d.taints]
            for d in self.driver.pool().devices
            if d.taints
        }

    def health(self) -> dict[str, str]:
        return {h.device: h.health for h in self.driver.device_health() if h.health != "Healthy"}

    def wait_for(self, check: Callable[[], bool], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            assert time.monotonic() < deadline, f"timed out; taints now {self.taints()}"
            time.sleep(0.02)


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Callable[..., Running]]:
    started: list[tuple[GpuDriver, object]] = []

    def start(profile: str, policy: HealthPolicy = FAST, faults=()) -> Running:
        node = EmulatedNode.create(profile, tmp_path / f"node{len(started)}")
        for gpu, function, code in faults:
            node.library.inject_fault(gpu, function, code)
        ctx = node.nvml()
        ctx.__enter__()
        driver = GpuDriver(
            driver_name="gpu.nvidia.com",
            discover=lambda: discover(node.host, LOG),
            host=node.host,
            cdi_dir=tmp_path / "cdi",
            state_dir=tmp_path / f"state{len(started)}",
            tools=GpuTools.for_host(node.host),
            logger=LOG,
            pool_name="node-a",
            health_policy=policy,
        )
        running = Running(node, driver)
        started.append((driver, ctx))
        driver.start_background(running.changes.release)
        return running

    yield start
    for driver, ctx in started:
        driver.stop_background()
        ctx.__exit__(None, None, None)  # type: ignore[attr-defined]
    assert pynvml.nvmlLib is None


def test_fatal_xid_taints_the_gpu_and_it_heals_after_reset(run) -> None:
    r = run("l4-x4")
    assert r.taints() == {} and r.health() == {}
    started = time.monotonic()
    r.node.inject_xid(2, 79)  # profile index 2 is minor 0: device gpu-0
    r.node.set_lost(2)
    assert r.changes.acquire(timeout=5)
    assert time.monotonic() - started < 1.0  # event-driven, not waiting for a check
    r.wait_for(lambda: "gpu-lost" in str(r.taints()))
    assert r.taints() == {
        "gpu-0": [("gpu-lost", "unreachable", "NoSchedule"), ("xid", "79", "NoSchedule")]
    }
    assert r.health() == {"gpu-0": "Unhealthy"}
    message = next(h.message for h in r.driver.device_health() if h.device == "gpu-0")
    assert "Xid 79" in message and "GPU unreachable" in message
    time.sleep(2 * FAST.healthy_period_s)
    assert "gpu-0" in r.taints()  # still lost: nothing clears on a guess
    r.node.reset_gpu(2)
    r.wait_for(lambda: r.taints() == {})
    assert r.health() == {}


def test_pending_recovery_action_holds_the_taint_until_done(run) -> None:
    r = run("l4-x4")
    r.node.inject_xid(0, 48)
    r.node.set_recovery_action(0, "gpu-reset")
    r.wait_for(lambda: len(r.taints().get("gpu-2", [])) == 2)
    assert r.taints()["gpu-2"] == [
        ("recovery", "gpu-reset", "NoSchedule"),
        ("xid", "48", "NoSchedule"),
    ]
    time.sleep(3 * FAST.healthy_period_s)
    assert len(r.taints()["gpu-2"]) == 2  # the GPU answers, but NVML still wants a reset
    r.node.set_recovery_action(0, "none")
    cleared_at = time.monotonic()
    r.wait_for(lambda: r.taints() == {})
    assert time.monotonic() - cleared_at >= FAST.healthy_period_s * 0.9


def test_ignored_and_informational_xids(run) -> None:
    r = run("l4-x4")
    r.node.inject_xid(1, 13)  # graphics engine exception: the application's fault
    r.node.inject_xid(3, 94)  # contained ECC error: informational
    r.wait_for(lambda: "gpu-1" in r.taints())
    assert r.taints() == {"gpu-1": [("xid", "94", "None")]}
    assert r.health() == {}  # an informational taint is not unhealthy
    r.wait_for(lambda: r.taints() == {})  # and it expires after the healthy period


def test_noexecute_opt_in_for_fatal_faults(run) -> None:
    r = run("t4", policy=HealthPolicy(healthy_period_s=60, check_interval_s=0.1,
                                      fatal_effect="NoExecute"))  # fmt: skip
    r.node.inject_double_bit_ecc(0)
    r.wait_for(lambda: "gpu-0" in r.taints())
    assert r.taints() == {"gpu-0": [("ecc", "double-bit", "NoExecute")]}


def test_a_mig_xid_taints_only_its_instance(run) -> None:
    r = run("dgx-a100-mig")
    gpu = r.node.profile.gpus[4]
    victim = gpu.mig_instances[1]
    r.node.inject_xid(4, 74, gi=victim.gi_id, ci=victim.ci_id)
    r.wait_for(lambda: bool(r.taints()))
    assert r.taints() == {"gpu-4-mig-3g40gb-9-4": [("xid", "74", "NoSchedule")]}
    assert r.health() == {"gpu-4-mig-3g40gb-9-4": "Unhealthy"}


def test_periodic_check_finds_what_events_cannot(run) -> None:
    r = run("l4-x4")
    r.node.set_lost(1)  # no event: the GPU just stops answering
    r.wait_for(lambda: "gpu-3" in r.taints())
    assert r.taints() == {"gpu-3": [("gpu-lost", "unreachable", "NoSchedule")]}
    r.node.control({"op": "recovery", "gpu": 3, "action": 3})  # drain-p2p, set silently
    r.wait_for(lambda: "gpu-1" in r.taints())
    assert r.taints()["gpu-1"] == [("recovery", "drain-p2p", "NoSchedule")]


def test_gpus_without_events_are_marked_unmonitored(run) -> None:
    r = run("l4-x4", faults=[(0, "nvmlDeviceRegisterEvents", pynvml.NVML_ERROR_NOT_SUPPORTED)])
    r.wait_for(lambda: "gpu-2" in r.taints())
    assert r.taints() == {"gpu-2": [("unmonitored", "events-unsupported", "None")]}
    assert r.health() == {}
    r.node.library.clear_faults()  # a driver update: events work, the mark goes (retry ~60 s)


def test_without_recovery_action_support_fatal_faults_stay(run) -> None:
    old_driver = [(i, "nvmlDeviceGetFieldValues", pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
                  for i in range(4)]  # fmt: skip
    r = run("l4-x4", faults=old_driver)
    r.node.inject_xid(0, 79)
    r.node.inject_xid(1, 63)
    r.wait_for(lambda: {"gpu-2", "gpu-3"} <= set(r.taints()))
    r.wait_for(lambda: "gpu-3" not in r.taints())  # the informational one expires
    time.sleep(3 * FAST.healthy_period_s)
    assert r.taints() == {"gpu-2": [("xid", "79", "NoSchedule")]}


def test_a_lost_gpu_that_discovery_drops_keeps_its_fault_when_it_returns(run) -> None:
    r = run("l4-x4")
    r.node.set_lost(2)
    r.wait_for(lambda: "gpu-0" in r.taints())
    r.driver.refresh()  # discovery now sees it degraded: it leaves the pool
    assert "gpu-0" not in {d.name for d in r.driver.pool().devices}
    r.node.reset_gpu(2)
    r.driver.refresh()  # back in discovery at once, but still inside its healthy period
    assert r.taints().get("gpu-0") == [("gpu-lost", "unreachable", "NoSchedule")]
    r.wait_for(lambda: r.taints() == {})


def test_no_thread_runs_before_the_plugin_starts_the_monitor(make_node, tmp_path: Path) -> None:
    node = make_node("l4-x4")
    with node.nvml():
        driver = GpuDriver(
            driver_name="gpu.nvidia.com", discover=lambda: discover(node.host, LOG),
            host=node.host, cdi_dir=tmp_path / "cdi", state_dir=tmp_path / "state",
            tools=GpuTools.for_host(node.host), logger=LOG, pool_name="node-a",
        )  # fmt: skip
        driver.refresh()
        names = [t.name for t in threading.enumerate()]
        assert not [n for n in names if n.startswith(("nvml-events-", "gpu-health-check"))]


def test_stop_at_exit_does_not_wait_out_nvml_event_waits(make_node) -> None:
    """SIGTERM to exit took the event wait's length (nvmlEventSetWait cannot be woken):
    with a deadline the monitor returns at once and leaves NVML for the process's exit
    (no nvmlShutdown while a wait is in it); without one it waits and shuts NVML down."""
    from dra_driver.gpu.hardware.nvml import Nvml
    from dra_driver.gpu.monitoring.monitor import HealthMonitor

    node = make_node("l4-x4")
    with node.nvml():
        inventory = discover(node.host, LOG)
        for wait_s in (0.1, None):
            monitor = HealthMonitor(nvml=Nvml(), policy=FAST, logger=LOG, event_wait_ms=3000)
            monitor.start(inventory)
            time.sleep(0.3)  # every event thread is inside its 3 s wait now
            started = time.monotonic()
            monitor.stop(wait_s=wait_s)
            took = time.monotonic() - started
            if wait_s is not None:
                assert took < 1.0
                assert monitor._started  # NVML left initialised: a wait is still in it
                for thread in threading.enumerate():  # let the waits end before NVML goes
                    if thread.name.startswith("nvml-events-"):
                        thread.join(timeout=5)
            else:
                assert took > 1.0
                assert not monitor._started
                assert not [t for t in threading.enumerate() if t.name.startswith("nvml-events-")]
