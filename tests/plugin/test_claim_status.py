"""The claim status writer: our status.devices entries (Ready, Healthy, device data), stable
transition times, re-applied only on change, removed at unprepare, never failing or delaying
a prepare (the writes happen in refresh, on the plugin's background thread)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from dra_driver.plugin.backend import PreparedDevice
from dra_driver.plugin.claims import ClaimRef
from dra_driver.plugin.claimstatus import ClaimStatusWriter, Condition, DeviceStatus

REF = ClaimRef(namespace="ml", name="train", uid="6f1d3c2a-9b8e-4f7d-a1c2-3e4f5a6b7c8d")
DEV = PreparedDevice(("gpu",), "node-a", "gpu-0", ("k8s.gpu.nvidia.com/claim=x-gpu-0",))
SHARED = PreparedDevice(
    ("gpu",), "node-a", "gpu-1", ("id",), share_id="2d3f0c55-0000-4000-8000-000000000001"
)


class Reporter:
    def __init__(self) -> None:
        self.healthy = True

    def device_status(self, devices: Sequence[PreparedDevice]) -> list[DeviceStatus]:
        cond = (
            Condition("Healthy", "True", "NoFaults")
            if self.healthy
            else Condition("Healthy", "False", "DeviceTainted", "gpu.nvidia.com/xid=79:NoSchedule")
        )
        return [DeviceStatus(d.device_name, {"uuid": f"GPU-{d.device_name}"}, (cond,))
                for d in devices]  # fmt: skip


def writer(applied: list, reporter=None, clock=None, fail=()) -> ClaimStatusWriter:
    times = iter(f"2026-11-23T10:00:0{i}Z" for i in range(10))

    def apply(ns: str, name: str, body: dict) -> None:
        if fail:
            raise ConnectionError("API server unreachable")
        applied.append((ns, name, body))

    return ClaimStatusWriter(driver_name="gpu.nvidia.com", apply=apply, reporter=reporter,
                             logger=logging.getLogger("t"), node_name="node-a",
                             now=clock or (lambda: next(times)))  # fmt: skip


def test_prepare_writes_our_entries_with_uid_precondition() -> None:
    applied: list = []
    w = writer(applied, Reporter())
    w.prepared(REF, [DEV, SHARED])
    assert applied == []  # nothing on the prepare path itself
    assert w.refresh() == 1
    ((ns, name, body),) = applied
    assert (ns, name) == ("ml", "train")
    assert body["metadata"] == {"name": "train", "namespace": "ml", "uid": REF.uid}
    first, second = body["status"]["devices"]
    assert (first["driver"], first["pool"], first["device"]) == (
        "gpu.nvidia.com",
        "node-a",
        "gpu-0",
    )
    assert "shareID" not in first and second["shareID"] == SHARED.share_id
    assert first["data"] == {
        "uuid": "GPU-gpu-0",
        "cdiDeviceIDs": ["k8s.gpu.nvidia.com/claim=x-gpu-0"],
    }
    assert [(c["type"], c["status"], c["reason"]) for c in first["conditions"]] == [
        ("Ready", "True", "Prepared"), ("Healthy", "True", "NoFaults")
    ]  # fmt: skip
    assert first["conditions"][0]["message"] == "prepared by gpu.nvidia.com on node node-a"


def test_refresh_applies_only_changes_and_keeps_transition_times() -> None:
    applied: list = []
    reporter = Reporter()
    w = writer(applied, reporter)
    w.prepared(REF, [DEV])
    w.refresh()
    ready_since = applied[0][2]["status"]["devices"][0]["conditions"][0]["lastTransitionTime"]
    assert w.refresh() == 0 and len(applied) == 1  # nothing changed: no write
    reporter.healthy = False
    assert w.refresh() == 1
    ready, healthy = applied[-1][2]["status"]["devices"][0]["conditions"]
    assert ready["lastTransitionTime"] == ready_since  # Ready did not change
    assert (healthy["status"], healthy["reason"]) == ("False", "DeviceTainted")
    assert healthy["lastTransitionTime"] != ready_since


def test_unprepare_removes_our_entries_and_forgets_the_claim() -> None:
    applied: list = []
    w = writer(applied, Reporter())
    w.prepared(REF, [DEV])
    w.refresh()
    w.unprepared(REF)
    assert w.refresh() == 1
    assert applied[-1][2]["status"] == {"devices": []}
    assert w.refresh() == 0


def test_write_failures_are_logged_and_retried_never_raised(caplog) -> None:
    applied: list = []
    down = [True]
    w = writer(applied, Reporter(), fail=down)
    w.prepared(REF, [DEV])
    assert w.refresh() == 0  # does not raise
    assert "cannot write claim status devices" in caplog.text and applied == []
    down.clear()  # the API server is back: the next refresh writes it
    assert w.refresh() == 1 and len(applied) == 1
    down.append(True)
    w.unprepared(REF)
    assert w.refresh() == 0  # the removal failed: kept for the next refresh
    down.clear()
    assert w.refresh() == 1 and applied[-1][2]["status"] == {"devices": []}


def test_error_reasons_are_the_most_specific_known_cause() -> None:
    from dra_driver.errors import DriverError
    from dra_driver.plugin.backend import PrepareError
    from dra_driver.plugin.claimevents import reason_of
    from dra_driver.plugin.claims import ClaimError

    class ConfigError(DriverError):  # the GPU layer's class, matched by name
        pass

    try:
        try:
            raise ConfigError("sharing.strategy: 'Timeslicing' is not allowed")
        except ConfigError as inner:
            raise PrepareError("prepare claim x: bad config") from inner
    except PrepareError as outer:
        assert reason_of(outer) == "config"
    assert reason_of(ClaimError("claim ml/x not found")) == "claim"
    assert reason_of(PrepareError("something")) == "backend"
    assert reason_of(RuntimeError("bug")) == "internal"
