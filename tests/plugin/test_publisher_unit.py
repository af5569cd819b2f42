"""SlicePublisher error paths against the fake API server (real HTTP client)."""

from __future__ import annotations

import logging
import time

from dra_driver.devcluster import wait_until
from dra_driver.plugin.kubeclient import KubeClient
from dra_driver.plugin.publishing import SlicePublisher
from dra_driver.plugin.resources import Device, Pool
from tests.plugin.fakes import DRIVER, FakeApiServer


def _publisher(api: FakeApiServer, pool: Pool) -> SlicePublisher:
    return SlicePublisher(
        client=KubeClient(api.config),
        driver_name=DRIVER,
        node_name="node-a",
        pool_source=lambda: pool,
        logger=logging.getLogger("test.publisher"),
        backoff_initial_s=0.05,
        backoff_max_s=0.2,
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
