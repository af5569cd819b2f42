"""SlicePublisher error paths against the fake API server (real HTTP client)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from dra_driver.devcluster import wait_until
from dra_driver.plugin.publishing import SlicePublisher
from dra_driver.plugin.resources import Device, Pool
from tests.plugin.fakes import DRIVER, FakeApiServer


def _publisher(api: FakeApiServer, pool: Pool, **kw: Any) -> SlicePublisher:
    return SlicePublisher(
        client=api.client(),
        driver_name=DRIVER,
        node_name="node-a",
        pool_source=lambda: pool,
        logger=logging.getLogger("test.publisher"),
        backoff_initial_s=0.05,
        backoff_max_s=0.2,
        **kw,
    )


def test_api_errors_are_retried_with_backoff_until_published(api: FakeApiServer) -> None:
    api.fail_slice_requests = 6
    pub = _publisher(api, Pool(devices=(Device("gpu-0"),)))
    errors: list[str] = []
    pub.start()
    try:

        def done() -> bool:
            if pub.status.last_error:
                errors.append(pub.status.last_error)
            return pub.status.in_sync

        wait_until(done, timeout=10, what="publish after outage", interval=0.01)
    finally:
        pub.stop()
    assert any("etcd down" in e for e in errors)
    assert list(api.slices) == [f"00000-{DRIVER}-node-a"]


def test_invalid_pool_is_reported_and_nothing_is_written(api: FakeApiServer) -> None:
    pub = _publisher(api, Pool(devices=(Device("gpu-0", attributes={"s": "x" * 100}),)))
    pub.start()
    try:
        wait_until(lambda: pub.status.last_error, timeout=10, what="validation error")
        time.sleep(0.2)
    finally:
        pub.stop()
    assert "devices[0].attributes['s']: string is 100 characters; at most 64" in (
        pub.status.last_error
    )
    assert not pub.status.in_sync
    assert api.slices == {}


def test_d8_a_slice_deleted_while_unwatched_is_back_with_the_next_list(
    api: FakeApiServer,
) -> None:
    """Regression (issue 11, D8): after a watch gap the watcher re-listed without
    comparing, so a slice deleted meanwhile came back only with the 30 s resync."""
    pub = _publisher(api, Pool(devices=(Device("gpu-0"),)), resync_interval_s=30)
    pub.start()
    try:
        wait_until(lambda: pub.status.in_sync, timeout=10, what="first publish")
        (name,) = api.slices
        with api._lock:
            del api.slices[name]  # no watch event: the fake's watches only time out
        start = time.monotonic()
        wait_until(lambda: name in api.slices, timeout=10, what="slice re-created")
        assert time.monotonic() - start < 5  # the next list (0.5 s here), not the resync
    finally:
        pub.stop()


def test_a_crashed_background_thread_is_reported_as_fatal(api: FakeApiServer) -> None:
    api.nodes["node-a"] = {"kind": "Node"}  # no metadata: the owner lookup fails
    reasons: list[str] = []
    pub = _publisher(api, Pool(devices=(Device("gpu-0"),)), on_fatal=reasons.append)
    pub.start()
    try:
        wait_until(lambda: reasons, timeout=10, what="fatal report")
    finally:
        pub.stop()
    assert reasons[0].startswith("slice-sync crashed: KeyError('metadata')")
    assert not pub.status.in_sync


def test_slices_are_checked_within_seconds_after_a_long_outage(api: FakeApiServer) -> None:
    """With the shipped backoff (0.5 s doubling to 5 s): after a 20 s outage the next
    list comes within ~6 s of the API server's return (it waited 30 s before), so a
    slice lost meanwhile is back soon."""
    pub = SlicePublisher(
        client=api.client(), driver_name=DRIVER, node_name="node-a",
        pool_source=lambda: Pool(devices=(Device("gpu-0"),)),
        logger=logging.getLogger("test.publisher"),
    )  # fmt: skip
    pub.start()
    try:
        wait_until(lambda: pub.status.in_sync, timeout=10, what="first publish")
        api.slice_outage_until = time.monotonic() + 20
        with api._lock:
            api.slices.clear()  # lost during the outage
        time.sleep(20)
        back = time.monotonic()
        wait_until(lambda: api.slices, timeout=15, what="slice re-created after the outage")
        assert time.monotonic() - back < 7
    finally:
        pub.stop()


def test_the_watch_waits_for_our_write_in_flight_before_calling_a_change_foreign(
    api: FakeApiServer,
) -> None:
    """At start the watch may see our first create before the create call returned (3
    of 4 starts resynced for nothing, logging "changed by someone else"): a slice being
    written is judged once that write is recorded."""
    pub = _publisher(api, Pool(devices=(Device("gpu-0"),)))
    name = "node-a-gpu.test.example.com-0"
    with pub._written_cond:
        pub._writing.add(name)

    def finish() -> None:
        time.sleep(0.3)
        with pub._written_cond:
            pub._written[name] = ("42", "fingerprint")
            pub._writing.discard(name)
            pub._written_cond.notify_all()

    threading.Thread(target=finish).start()
    started = time.monotonic()
    assert pub._is_own_write({"metadata": {"name": name, "resourceVersion": "42"}})
    assert 0.2 < time.monotonic() - started < 5
    assert not pub._is_own_write({"metadata": {"name": name, "resourceVersion": "43"}})


def _node_gets(api: FakeApiServer) -> int:
    return api.requests.count(("GET", "/api/v1/nodes/node-a"))


def test_a_restarted_plugin_takes_over_its_slices_with_one_sync_and_no_write(
    api: FakeApiServer,
) -> None:
    """Issue 42 (rolling update): the new process's watch listed the slices before its
    first sync had recorded them as found, took them for somebody else's change and
    synced again; each of its relists (every watch's end) did the same."""
    pool = Pool(devices=(Device("gpu-0"),))
    old = _publisher(api, pool)
    old.start()
    wait_until(lambda: old.status.in_sync, timeout=10, what="first publish")
    old.stop()
    stored = {name: s["metadata"]["resourceVersion"] for name, s in api.slices.items()}
    gets = _node_gets(api)
    new = _publisher(api, pool)
    new.start()
    try:
        wait_until(lambda: new.status.in_sync, timeout=10, what="taken over")
        time.sleep(1.6)  # three of the fake's 0.5 s watches, each followed by a list
    finally:
        new.stop()
    assert _node_gets(api) - gets == 1  # one sync: the start's
    assert {n: s["metadata"]["resourceVersion"] for n, s in api.slices.items()} == stored


def test_the_resync_timer_asks_the_api_server_only_for_an_unannounced_pool_change(
    api: FakeApiServer,
) -> None:
    """The watch and its relists report every change to the slices; the timer only
    catches a pool change nobody triggered (it cost two requests per node every 30 s)."""
    pools = [Pool(devices=(Device("gpu-0"),))]
    pub = _publisher(api, Pool(), resync_interval_s=0.2)
    pub._pool_source = lambda: pools[-1]
    pub.start()
    try:
        wait_until(lambda: pub.status.in_sync, timeout=10, what="first publish")
        gets = _node_gets(api)
        time.sleep(1.2)  # six intervals
        assert _node_gets(api) == gets
        pools.append(Pool(devices=(Device("gpu-0"), Device("gpu-1"))))  # no trigger()

        def published() -> list[str]:
            return [d["name"] for s in api.slices.values() for d in s["spec"]["devices"]]

        wait_until(lambda: published() == ["gpu-0", "gpu-1"], timeout=10, what="new pool")
    finally:
        pub.stop()
