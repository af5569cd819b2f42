"""Health policy and bookkeeping (pure): Xid classes, worst-fault-wins, the healthy period,
never clearing on a guess, and faults -> taints per device (MIG scope included)."""

from __future__ import annotations

import datetime

import pytest

from dra_driver.gpu.monitoring.health import (
    Fault,
    HealthBook,
    device_faults,
    recovery_fault,
    taints_for,
)
from dra_driver.gpu.monitoring.healthpolicy import DEFAULT_IGNORED_XIDS, HealthPolicy, Severity
from dra_driver.plugin.resources import DeviceTaint

UUID = "GPU-1"
T0 = datetime.datetime(2026, 11, 18, 6, 53, 20, tzinfo=datetime.UTC).timestamp()


def xid(n: int, severity: Severity, since: float = T0, scope=None) -> Fault:
    return Fault("xid", str(n), severity, since, f"Xid {n}", scope)


@pytest.mark.parametrize(
    ("number", "severity"),
    [(13, None), (31, None), (109, None), (63, Severity.INFO), (94, Severity.INFO),
     (74, Severity.UNUSABLE), (62, Severity.UNUSABLE), (48, Severity.FATAL),
     (79, Severity.FATAL), (119, Severity.FATAL)],
)  # fmt: skip
def test_xid_classes(number: int, severity: Severity | None) -> None:
    assert HealthPolicy().xid_severity(number) == severity


def test_ignored_xids_are_configurable() -> None:
    policy = HealthPolicy(ignored_xids=(DEFAULT_IGNORED_XIDS | {74}) - {13})
    assert policy.xid_severity(74) is None
    assert policy.xid_severity(13) is Severity.UNUSABLE


def test_effects_by_severity_and_the_noexecute_opt_in() -> None:
    assert [HealthPolicy().effect(s) for s in Severity] == ["None", "NoSchedule", "NoSchedule"]
    evicting = HealthPolicy(fatal_effect="NoExecute")
    assert [evicting.effect(s) for s in Severity] == ["None", "NoSchedule", "NoExecute"]


def test_worst_fault_of_a_kind_wins_and_keeps_its_start() -> None:
    book = HealthBook(HealthPolicy())
    assert book.record(UUID, xid(74, Severity.UNUSABLE, T0))
    assert not book.record(UUID, xid(74, Severity.UNUSABLE, T0 + 5))  # same condition again
    assert book.record(UUID, xid(62, Severity.UNUSABLE, T0 + 9))  # same severity, newer value
    assert not book.record(UUID, xid(94, Severity.INFO, T0 + 10))  # milder: ignored
    (fault,) = book.snapshot().faults[UUID]
    assert (fault.value, fault.since) == ("62", T0)
    assert book.record(UUID, xid(79, Severity.FATAL, T0 + 20))
    (fault,) = book.snapshot().faults[UUID]
    assert (fault.value, fault.since) == ("79", T0 + 20)


def test_faults_clear_only_after_a_full_healthy_period() -> None:
    book = HealthBook(HealthPolicy(healthy_period_s=60))
    book.record(UUID, xid(79, Severity.FATAL))
    assert not book.check_passed(UUID, 100.0, recovery_known=True)  # period starts
    assert not book.check_passed(UUID, 150.0, recovery_known=True)
    book.check_failed(UUID)  # e.g. a recovery action was pending again
    assert not book.check_passed(UUID, 155.0, recovery_known=True)  # starts over
    assert not book.check_passed(UUID, 214.0, recovery_known=True)
    version = book.snapshot().version
    assert book.check_passed(UUID, 215.0, recovery_known=True)
    assert book.snapshot().faults == {} and book.snapshot().version > version


def test_a_new_fault_restarts_the_healthy_period() -> None:
    book = HealthBook(HealthPolicy(healthy_period_s=10))
    book.record(UUID, xid(74, Severity.UNUSABLE))
    book.check_passed(UUID, 0.0, recovery_known=True)
    book.record(UUID, Fault("ecc", "double-bit", Severity.FATAL, T0, "dbe"))
    assert not book.check_passed(UUID, 10.0, recovery_known=True)
    assert book.check_passed(UUID, 20.0, recovery_known=True)


def test_without_recovery_action_only_informational_faults_clear() -> None:
    book = HealthBook(HealthPolicy(healthy_period_s=1))
    book.record(UUID, xid(79, Severity.FATAL))
    book.record(UUID, Fault("ecc", "double-bit", Severity.FATAL, T0, "dbe"))
    book.record("GPU-2", xid(94, Severity.INFO))
    for uuid in (UUID, "GPU-2"):
        book.check_passed(uuid, 0.0, recovery_known=False)
        book.check_passed(uuid, 5.0, recovery_known=False)
    assert set(book.snapshot().faults) == {UUID}  # the fatal faults stay: a reset is not proven


def test_unmonitored_is_not_cleared_by_checks_only_by_registration() -> None:
    book = HealthBook(HealthPolicy(healthy_period_s=0))
    book.record(UUID, Fault("unmonitored", "events-unsupported", Severity.INFO, T0, "no events"))
    book.check_passed(UUID, 0.0, recovery_known=True)
    assert UUID in book.snapshot().faults
    assert book.drop(UUID, "unmonitored") and book.snapshot().faults == {}


def test_recovery_actions_map_to_severities() -> None:
    assert recovery_fault(1, T0).value == "gpu-reset"
    assert recovery_fault(1, T0).severity is Severity.FATAL
    assert recovery_fault(3, T0).severity is Severity.UNUSABLE  # drain-p2p: P2P off, GPU works
    assert recovery_fault(2, T0).value == "node-reboot"


def test_taints_one_per_kind_with_value_effect_and_time(make_node, discover_node) -> None:
    policy = HealthPolicy(fatal_effect="NoExecute")
    faults = [
        xid(74, Severity.UNUSABLE, T0),
        xid(79, Severity.FATAL, T0 + 1),
        recovery_fault(1, T0 + 2),
        Fault("unmonitored", "events-unsupported", Severity.INFO, T0, "no events"),
    ]
    assert taints_for(faults, driver_name="gpu.nvidia.com", policy=policy) == (
        DeviceTaint("gpu.nvidia.com/recovery", "NoExecute", "gpu-reset", "2026-11-18T06:53:22Z"),
        DeviceTaint("gpu.nvidia.com/unmonitored", "None", "events-unsupported",
                    "2026-11-18T06:53:20Z"),
        DeviceTaint("gpu.nvidia.com/xid", "NoExecute", "79", "2026-11-18T06:53:21Z"),
    )  # fmt: skip


def test_faults_reach_the_right_devices(make_node, discover_node) -> None:
    node = make_node("dgx-a100-mig")
    inventory = discover_node(node)
    gpu0, gpu2 = inventory.gpus[0], inventory.gpus[2]  # GPU 0 in MIG mode, GPU 2 not
    mig = gpu0.mig_instances[1]
    book = HealthBook(HealthPolicy())
    book.record(gpu0.uuid, xid(94, Severity.INFO, scope=(mig.gi_id, mig.ci_id)))
    book.record(gpu2.uuid, xid(79, Severity.FATAL))
    by_device = device_faults(book.snapshot(), inventory)
    assert set(by_device) == {"gpu-0-mig-2g20gb-14-4", "gpu-2"}
    book.record(gpu0.uuid, Fault("ecc", "double-bit", Severity.FATAL, T0, "dbe"))  # GPU-wide
    by_device = device_faults(book.snapshot(), inventory)
    assert {n for n in by_device if n.startswith("gpu-0-")} == {
        "gpu-0-mig-3g40gb-9-0", "gpu-0-mig-2g20gb-14-4", "gpu-0-mig-1g10gb-19-6"
    }  # fmt: skip
    assert [f.kind for f in by_device["gpu-0-mig-2g20gb-14-4"]] == ["ecc", "xid"]
    assert [f.kind for f in by_device["gpu-0-mig-3g40gb-9-0"]] == ["ecc"]
