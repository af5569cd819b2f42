"""The claim status writer: our status.devices entries (Ready, Healthy, device data), stable
transition times, re-applied only on change, removed at unprepare, never failing or delaying
a prepare (the writes happen in refresh, on the plugin's background thread)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from dra_driver.plugin.claimbook import ClaimKeeper
from dra_driver.plugin.claims import ClaimRef, PreparedDevice
from dra_driver.plugin.claimstatus import ClaimStatusWriter, Condition, DeviceStatus
from dra_driver.plugin.kubeclient import KubeApiError

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
    assert "writing claim status failed" in caplog.text and applied == []
    assert w.refresh() == 0
    assert caplog.text.count("writing claim status") == 1  # an outage is said once
    down.clear()  # the API server is back: the next refresh writes it
    assert w.refresh() == 1 and len(applied) == 1
    down.append(True)
    w.unprepared(REF)
    assert w.refresh() == 0  # the removal failed: kept for the next refresh
    down.clear()
    assert w.refresh() == 1 and applied[-1][2]["status"] == {"devices": []}


def test_a_status_the_api_server_refuses_is_not_sent_again_until_it_changes(caplog) -> None:
    """422: sending the same entries again can only be refused again (and warned about
    at every refresh, as before); a change (health, another prepare) is tried."""
    sent: list = []
    reporter = Reporter()

    def apply(ns: str, name: str, body: dict) -> None:
        sent.append(body)
        raise KubeApiError(422, "Invalid", "status.devices[0].data: Too long")

    w = ClaimStatusWriter(driver_name="gpu.nvidia.com", apply=apply, reporter=reporter,
                          logger=logging.getLogger("t"), node_name="node-a")  # fmt: skip
    w.prepared(REF, [DEV])
    for _ in range(3):
        assert w.refresh() == 0
    assert len(sent) == 1
    refused = [r for r in caplog.records if "refused our claim status" in r.getMessage()]
    assert len(refused) == 1 and refused[0].claim_uid == REF.uid  # type: ignore[attr-defined]
    assert "Too long" in refused[0].getMessage()
    reporter.healthy = False  # the entries change: tried again
    assert w.refresh() == 0 and len(sent) == 2


def test_error_reasons_are_the_most_specific_known_cause() -> None:
    from dra_driver.errors import DriverError
    from dra_driver.plugin.claimbook import reason_of
    from dra_driver.plugin.claims import ClaimError, PrepareError

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


def test_claim_prepared_and_unprepared_between_writes_needs_no_write() -> None:
    applied: list = []
    w = writer(applied, Reporter())
    w.inherit([])  # nothing from before this process
    w.prepared(REF, [DEV])
    w.unprepared(REF)
    assert w.refresh() == 0 and applied == []  # nothing of ours can be in its status
    # Written once, its removal is written when it goes.
    w.prepared(REF, [DEV])
    assert w.refresh() == 1
    w.unprepared(REF)
    assert w.refresh() == 1 and applied[-1][2]["status"] == {"devices": []}
    # After that removal nothing of ours is there again: the next short stay needs nothing.
    w.prepared(REF, [DEV])
    w.unprepared(REF)
    assert w.refresh() == 0 and len(applied) == 2


def test_removal_is_written_when_our_entries_may_be_there() -> None:
    # Before the keeper said which claims are from before this process, every claim
    # may carry entries a previous instance wrote: its removal is written.
    applied: list = []
    w = writer(applied, Reporter())
    w.prepared(REF, [DEV])
    w.unprepared(REF)
    assert w.refresh() == 1 and applied[-1][2]["status"] == {"devices": []}
    # A claim from before this process (re-prepared after a restart), the same.
    applied.clear()
    w = writer(applied, Reporter())
    w.inherit([REF.uid])
    w.prepared(REF, [DEV])
    w.unprepared(REF)
    assert w.refresh() == 1 and applied[-1][2]["status"] == {"devices": []}
    # inherit() after the prepare (the keeper's first reload came late): still written.
    applied.clear()
    w = writer(applied, Reporter())
    w.inherit([])
    w.prepared(REF, [DEV])
    w.inherit([REF.uid])
    w.unprepared(REF)
    assert w.refresh() == 1 and applied[-1][2]["status"] == {"devices": []}


def test_unprepare_during_a_write_still_removes_the_entries() -> None:
    # The write of a new claim is under way (outside the lock) when it is unprepared:
    # the entries may land, so the removal must follow.
    applied: list = []
    w: ClaimStatusWriter

    def apply(ns: str, name: str, body: dict) -> None:
        if body["status"]["devices"]:
            w.unprepared(REF)  # arrives while this write is in flight
        applied.append(body)

    w = ClaimStatusWriter(driver_name="gpu.nvidia.com", apply=apply, reporter=Reporter(),
                          logger=logging.getLogger("t"), node_name="node-a")  # fmt: skip
    w.inherit([])
    w.prepared(REF, [DEV])
    assert w.refresh() == 1 and applied[0]["status"]["devices"]
    assert w.refresh() == 1 and applied[-1]["status"] == {"devices": []}


class _Book:
    def reload(self, refs: object) -> None:
        pass

    def refresh(self) -> None:
        pass


class _Status:
    def __init__(self) -> None:
        self.refreshed: list[float] = []
        self.inherited: list[list[str]] = []

    def inherit(self, uids) -> None:
        self.inherited.append(list(uids))

    def refresh(self) -> int:
        self.refreshed.append(time.monotonic())
        return 0


def _keeper(status: _Status, settle_s: float, settle_max_s: float) -> ClaimKeeper:
    return ClaimKeeper(book=_Book(), prepared=lambda: [REF], status=status,
                       interval_s=3600, logger=logging.getLogger("t"), settle_s=settle_s,
                       settle_max_s=settle_max_s)  # fmt: skip


def _wait_for(check, timeout_s: float = 5.0) -> None:
    end = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_status_is_written_after_a_burst_of_calls_not_during_it() -> None:
    status = _Status()
    keeper = _keeper(status, settle_s=0.3, settle_max_s=30)
    keeper.start()
    try:
        _wait_for(lambda: status.refreshed)  # the start: reload, then a first write round
        assert status.inherited == [[REF.uid]]  # the backend's claims, before any write
        burst_start = time.monotonic()
        for _ in range(8):  # a call every 0.1 s: never quiet for 0.3 s
            keeper.trigger()
            time.sleep(0.1)
        burst_end = time.monotonic()
        _wait_for(lambda: len(status.refreshed) == 2)
        assert status.refreshed[1] >= burst_end + 0.2  # after the burst had settled
        assert not [t for t in status.refreshed if burst_start < t < burst_end]
    finally:
        keeper.stop()


def test_status_is_written_under_steady_load_at_the_latest_after_settle_max() -> None:
    status = _Status()
    keeper = _keeper(status, settle_s=0.3, settle_max_s=0.6)
    keeper.start()
    try:
        _wait_for(lambda: status.refreshed)
        start = time.monotonic()
        while time.monotonic() - start < 2.0:  # never quiet
            keeper.trigger()
            time.sleep(0.05)
        during = [t for t in status.refreshed if start < t < start + 2.0]
        assert len(during) >= 2  # one round per settle_max_s, not starved
    finally:
        keeper.stop()
