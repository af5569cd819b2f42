"""Health in dynamic MIG mode, through the GPU driver with its health monitor on emulated
A100s (Xids injected below pynvml): a GPU-wide fault taints every device published for
the GPU (the whole GPU and every placement), a fault on an instance a claim's prepare made
taints that partition only, others' instances behave as in static mode, faults do not
outlive their instance onto a later one with the same IDs, and a restarted plugin finds
what NVML still reports; the slices' taints and the health stream agree throughout."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dra_driver.gpu.driver import GpuDriver
from dra_driver.gpu.hardware.discovery import discover
from dra_driver.gpu.monitoring.healthpolicy import HealthPolicy
from dra_driver.gpu.sharing.tools import GpuTools
from tests.prepare.migsetup import LOG, mig_claim, open_mig_node

LASTING = HealthPolicy(healthy_period_s=600, check_interval_s=0.1)
"""Faults stay for the whole test: what is asserted cannot heal meanwhile."""
Taints = dict[str, list[tuple[str, str, str]]]


class Watched:
    """A GPU driver in dynamic MIG mode with its health monitor running."""

    def __init__(self, root: Path, profile: str, policy: HealthPolicy) -> None:
        self.mig = open_mig_node(root, profile)
        self.node = self.mig.node
        self.driver = GpuDriver(
            driver_name="gpu.nvidia.com",
            discover=lambda: discover(self.node.host, LOG),
            host=self.node.host,
            cdi_dir=self.mig.cdi_dir,
            state_dir=self.mig.state_dir,
            tools=GpuTools(nvidia_smi=Path("/nonexistent"), mps_control=Path("/nonexistent")),
            logger=LOG,
            pool_name="node-a",
            health_policy=policy,
            mig_mode="dynamic",
        )
        self.driver.start_background(lambda: None)
        self.running = True

    def stop(self) -> None:
        if self.running:
            self.running = False
            self.driver.stop_background()
            self.driver.close()
            self.mig.close()

    def taints(self) -> Taints:
        """Device -> (key, value, effect) of its taints, as the slices publish them."""
        return {
            d.name: [(t.key.split("/")[1], t.value, t.effect) for t in d.taints]
            for d in self.driver.pool().devices
            if d.taints
        }

    def unhealthy(self) -> set[str]:
        """Devices the kubelet's health stream reports Unhealthy."""
        return {h.device for h in self.driver.device_health() if h.health != "Healthy"}

    def of_gpu(self, minor: int) -> set[str]:
        """Every device published for one GPU."""
        names = {d.name for d in self.driver.pool().devices}
        return {n for n in names if n == f"gpu-{minor}" or n.startswith(f"gpu-{minor}-")}

    def wait_for(self, check: Callable[[], bool], timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            assert time.monotonic() < deadline, f"timed out; taints now {self.taints()}"
            time.sleep(0.02)

    def instance_of(self, gpu: int) -> tuple[int, int]:
        """``(gi, ci)`` of the one instance on a GPU now."""
        ((gi, _, _, (ci,)),) = self.mig.instances(gpu)
        return gi, ci


@pytest.fixture
def watch(tmp_path: Path) -> Iterator[Callable[..., Watched]]:
    started: list[Watched] = []

    def start(profile: str = "dgx-a100-mig-on", policy: HealthPolicy = LASTING) -> Watched:
        watched = Watched(tmp_path, profile, policy)  # the same root: a restart
        started.append(watched)
        return watched

    yield start
    for watched in reversed(started):
        watched.stop()


def taint(kind: str, value: str, effect: str = "NoSchedule") -> tuple[str, str, str]:
    return (kind, value, effect)


def test_a_gpu_wide_fault_taints_the_whole_gpu_and_every_placement(watch) -> None:
    w = watch()
    gpu3 = w.of_gpu(3)
    assert len(gpu3) == 26 and "gpu-3" in gpu3  # 25 placements and the whole GPU
    w.node.inject_xid(3, 79)  # fallen off the bus, no MIG scope
    w.wait_for(lambda: bool(w.taints()))
    assert w.taints() == {name: [taint("xid", "79")] for name in gpu3}
    assert w.unhealthy() == gpu3  # the health stream agrees, device by device
    w.driver.refresh()  # re-discovery changes nothing
    assert set(w.taints()) == gpu3 and w.unhealthy() == gpu3


def test_a_fault_on_a_prepared_instance_taints_that_partition_only(watch) -> None:
    w = watch()
    partition = "gpu-2-mig-3g40gb-9-4"
    (prepared,) = w.driver.prepare(mig_claim(partition))
    gi, ci = w.instance_of(2)
    w.node.inject_xid(2, 95, gi=gi, ci=ci)  # uncontained ECC error in that instance
    w.wait_for(lambda: bool(w.taints()))
    assert w.taints() == {partition: [taint("xid", "95")]}
    assert w.unhealthy() == {partition}
    (status,) = w.driver.device_status([prepared])  # the claim's status says so too
    assert (status.conditions[0].status, status.conditions[0].reason) == ("False", "DeviceTainted")
    w.driver.refresh()  # re-discovery now lists the instance: the same device, no other
    assert w.taints() == {partition: [taint("xid", "95")]} and w.unhealthy() == {partition}
    # A GPU-wide fault on top reaches every device of the GPU, the partition too.
    w.node.inject_double_bit_ecc(2)
    w.wait_for(lambda: len(w.taints()) > 1)
    assert set(w.taints()) == w.of_gpu(2) and w.unhealthy() == w.of_gpu(2)
    assert w.taints()[partition] == [taint("ecc", "double-bit"), taint("xid", "95")]


def test_an_instance_fault_heals_as_before(watch) -> None:
    w = watch(policy=HealthPolicy(healthy_period_s=1.0, check_interval_s=0.1))
    partition = "gpu-4-mig-2g20gb-14-2"
    w.driver.prepare(mig_claim(partition))
    gi, ci = w.instance_of(4)
    w.node.inject_xid(4, 95, gi=gi, ci=ci)
    w.wait_for(lambda: w.taints() == {partition: [taint("xid", "95")]})
    w.wait_for(lambda: w.taints() == {})  # answered every check for the healthy period
    assert w.unhealthy() == set()


def test_no_fault_outlives_its_instance_onto_a_later_one(watch) -> None:
    """NVML gives the same GI ID to a 1g.10gb and a 1g.10gb+me at memory slice 6: the
    fault of the first, destroyed at unprepare, must not land on the second."""
    w = watch()
    first = mig_claim("gpu-2-mig-1g10gb-19-6")
    w.driver.prepare(first)
    gi, ci = w.instance_of(2)
    w.node.inject_xid(2, 95, gi=gi, ci=ci)
    w.wait_for(lambda: bool(w.taints()))
    assert w.taints() == {"gpu-2-mig-1g10gb-19-6": [taint("xid", "95")]}
    w.driver.unprepare(first.ref)  # the instance goes, and its fault with it
    assert w.taints() == {} and w.unhealthy() == set()
    again = mig_claim("gpu-2-mig-1g10gb-me-20-6", uid="0a1b2c3d-5555-4000-8000-0000000d1a90")
    w.driver.prepare(again)
    assert w.instance_of(2) == (gi, ci)  # the very same IDs, another device
    w.driver.refresh()
    assert w.taints() == {} and w.unhealthy() == set()
    # The same device for another claim starts healthy too.
    w.driver.unprepare(again.ref)
    third = mig_claim("gpu-2-mig-1g10gb-19-6", uid="0a1b2c3d-7777-4000-8000-0000000d1a90")
    w.driver.prepare(third)
    assert w.instance_of(2) == (gi, ci) and w.taints() == {}
    # ... and a new fault of the new instance reaches it alone.
    w.node.inject_xid(2, 74, gi=gi, ci=ci)
    w.wait_for(lambda: bool(w.taints()))
    assert w.taints() == {"gpu-2-mig-1g10gb-19-6": [taint("xid", "74")]}
    assert w.unhealthy() == {"gpu-2-mig-1g10gb-19-6"}


def test_the_whole_gpu_prepared_as_the_full_instance(watch) -> None:
    w = watch()
    w.driver.prepare(mig_claim("gpu-5"))
    gi, ci = w.instance_of(5)
    w.node.inject_xid(5, 95, gi=gi, ci=ci)
    w.wait_for(lambda: bool(w.taints()))
    assert w.taints() == {"gpu-5": [taint("xid", "95")]} and w.unhealthy() == {"gpu-5"}
    w.node.inject_xid(5, 79)
    w.wait_for(lambda: len(w.taints()) > 1)
    assert set(w.taints()) == w.of_gpu(5) and w.unhealthy() == w.of_gpu(5)


def test_a_restarted_plugin_finds_the_fault_again(watch) -> None:
    """Xid events are not replayed by NVML (static mode alike); what NVML still reports,
    a pending reset, is found again and reaches every device of the GPU, the prepared
    partition too; the partition's instance is known again from the checkpoint."""
    w = watch()
    partition = "gpu-2-mig-3g40gb-9-4"
    w.driver.prepare(mig_claim(partition))
    gi, ci = w.instance_of(2)
    w.node.inject_xid(2, 95, gi=gi, ci=ci)
    w.node.set_recovery_action(2, "gpu-reset")
    w.wait_for(lambda: len(w.taints()) == 26)
    w.stop()
    again = watch()  # restarted: the claim stays prepared, NVML still wants a reset
    again.wait_for(lambda: bool(again.taints()))
    gpu2 = again.of_gpu(2)
    assert len(gpu2) == 26 and again.taints() == {
        name: [taint("recovery", "gpu-reset")] for name in gpu2
    }
    assert again.unhealthy() == gpu2
    again.node.inject_xid(2, 74, gi=gi, ci=ci)
    again.wait_for(lambda: len(again.taints()[partition]) == 2)
    assert [name for name, t in again.taints().items() if len(t) == 2] == [partition]


def test_instances_made_by_someone_else_behave_as_in_static_mode(watch) -> None:
    """An admin's instance on GPU 6 is published as a static device beside the placements
    that still fit: a fault in it taints it alone, a GPU-wide one every device of GPU 6."""
    w = watch()
    gpu = w.node.profile.gpus[6]
    profile = gpu.model.mig_profile("3g.40gb")
    assert profile is not None
    theirs = w.node.mig.create_gpu_instance(gpu, profile, 4, profile.placement_size)
    ci = w.node.mig.create_compute_instance(gpu, theirs.gi_id, 2)  # the 3-slice CI
    w.driver.refresh()
    static = "gpu-6-mig-3g40gb-9-4"
    gpu6 = w.of_gpu(6)
    assert static in gpu6 and "gpu-6" not in gpu6 and len(gpu6) > 1
    w.node.inject_xid(6, 74, gi=theirs.gi_id, ci=ci.ci_id)
    w.wait_for(lambda: bool(w.taints()))
    assert w.taints() == {static: [taint("xid", "74")]} and w.unhealthy() == {static}
    w.node.inject_xid(6, 79)
    w.wait_for(lambda: len(w.taints()) > 1)
    assert set(w.taints()) == gpu6 and w.unhealthy() == gpu6
