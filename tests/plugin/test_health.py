"""DRAResourceHealth streams (v1alpha1 and v1) over the real DRA socket."""

from __future__ import annotations

import time
from typing import Any

import pytest

from dra_driver.plugin._proto import (
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
)
from dra_driver.plugin.backend import DeviceHealth
from dra_driver.plugin.resources import Device
from tests.plugin.conftest import StartPlugin
from tests.plugin.fakes import HealthyBackend

VERSIONS = [
    pytest.param((health_v1_pb2, health_v1_pb2_grpc), id="v1"),
    pytest.param((health_v1alpha1_pb2, health_v1alpha1_pb2_grpc), id="v1alpha1"),
]


def _summary(pb: Any, msg: Any) -> list[tuple[str, str, str, str]]:
    return [
        (d.device.pool_name, d.device.device_name, pb.HealthStatus.Name(d.health), d.message)
        for d in msg.devices
    ]


@pytest.mark.parametrize("version", VERSIONS)
def test_default_health_is_every_published_device_healthy_and_repeats(
    start_plugin: StartPlugin, version: Any
) -> None:
    pb, pb_grpc = version
    run = start_plugin(health_interval_s=0.3)
    with run.channel() as ch:
        stream = pb_grpc.DRAResourceHealthStub(ch).NodeWatchResources(
            pb.NodeWatchResourcesRequest(), timeout=10
        )
        first = next(stream)
        t0 = time.monotonic()
        second = next(stream)
        gap = time.monotonic() - t0
        stream.cancel()
    expected = [("node-a", "gpu-0", "HEALTHY", ""), ("node-a", "gpu-1", "HEALTHY", "")]
    assert _summary(pb, first) == expected
    assert _summary(pb, second) == expected  # full list again, not a delta
    assert 0.15 < gap < 2.0
    assert first.devices[0].health_check_timeout_seconds >= 30
    assert abs(first.devices[0].last_updated_time - time.time()) < 5


@pytest.mark.parametrize("version", VERSIONS)
def test_change_is_pushed_immediately(start_plugin: StartPlugin, version: Any) -> None:
    pb, pb_grpc = version
    backend = HealthyBackend(
        devices=(Device("gpu-0"),),
        health=[DeviceHealth("node-a", "gpu-0", "Healthy", timeout_s=45)],
    )
    run = start_plugin(backend, health_interval_s=30)
    with run.channel() as ch:
        stream = pb_grpc.DRAResourceHealthStub(ch).NodeWatchResources(
            pb.NodeWatchResourcesRequest(), timeout=10
        )
        first = next(stream)
        assert _summary(pb, first) == [("node-a", "gpu-0", "HEALTHY", "")]
        assert first.devices[0].health_check_timeout_seconds == 45
        backend.health = [DeviceHealth("node-a", "gpu-0", "Unhealthy", "XID 79")]
        t0 = time.monotonic()
        run.plugin.notify_health_changed()
        second = next(stream)
        assert time.monotonic() - t0 < 2.0  # not waiting for the 30 s interval
        stream.cancel()
    assert _summary(pb, second) == [("node-a", "gpu-0", "UNHEALTHY", "XID 79")]


def test_open_stream_does_not_block_stop(start_plugin: StartPlugin) -> None:
    run = start_plugin(health_interval_s=30)
    with run.channel() as ch:
        stream = health_v1_pb2_grpc.DRAResourceHealthStub(ch).NodeWatchResources(
            health_v1_pb2.NodeWatchResourcesRequest(), timeout=20
        )
        next(stream)
        t0 = time.monotonic()
        run.plugin.stop(grace_s=5)
        assert time.monotonic() - t0 < 3.0
