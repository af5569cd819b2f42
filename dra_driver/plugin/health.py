"""Device health streamed to the kubelet (``DRAResourceHealth``, v1alpha1 and v1).

The kubelet stamps each device with its own receive time and marks it Unknown
once its timeout passes without a refresh, so every stream sends the *full*
device list at once, then every ``interval_s`` and immediately whenever
:meth:`HealthHub.notify_changed` reports a change. 1.36 kubelets open the
v1alpha1 stream even when it is not advertised, so it is always served.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from dra_driver.plugin._proto import (
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
)
from dra_driver.plugin.backend import DeviceHealth
from dra_driver.retries import Retry

HealthSource = Callable[[], list[DeviceHealth]]

KUBELET_DEFAULT_TIMEOUT_S = 30


class HealthHub:
    """Current health snapshot plus a condition that wakes every open stream."""

    def __init__(
        self,
        *,
        source: HealthSource,
        interval_s: float,
        logger: logging.Logger,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._source = source
        self._interval_s = interval_s
        self._log = logger
        self._clock = clock
        self._cond = threading.Condition()
        self._version = 0
        self._closed = False
        self._snapshot: list[DeviceHealth] = []
        self._retry = Retry("reading device health (all devices reported Unknown)", logger,
                            paced=False)  # fmt: skip
        self._retry_lock = threading.Lock()
        self._default_timeout_s = max(KUBELET_DEFAULT_TIMEOUT_S, int(3 * interval_s) + 1)

    @property
    def default_timeout_s(self) -> int:
        """Per-device timeout sent when the backend gives none: a few missed intervals."""
        return self._default_timeout_s

    def _poll(self) -> list[DeviceHealth]:
        try:
            found = list(self._source())
        except Exception as exc:
            with self._retry_lock:  # said once, then every few minutes
                self._retry.failed(exc)
            return [
                DeviceHealth(d.pool, d.device, "Unknown", "health check failed")
                for d in self._snapshot
            ]
        with self._retry_lock:
            self._retry.succeeded()
        return found

    def notify_changed(self) -> None:
        """Re-read health now and push it to every stream if it differs."""
        fresh = self._poll()
        with self._cond:
            if fresh != self._snapshot:
                self._snapshot = fresh
                self._version += 1
                self._cond.notify_all()

    def snapshot(self) -> list[DeviceHealth]:
        with self._cond:
            return list(self._snapshot)

    def current(self) -> list[DeviceHealth]:
        """Health read now; if it changed, every stream gets it too (so a probe or a scrape
        never shows something the kubelet has not been sent)."""
        self.notify_changed()
        return self.snapshot()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def stream(self, is_active: Callable[[], bool]) -> Iterator[list[DeviceHealth]]:
        """Full lists until the hub closes or ``is_active`` turns false."""
        self.notify_changed()
        with self._cond:
            seen = self._version
            current = list(self._snapshot)
        yield current
        while True:
            with self._cond:
                self._cond.wait_for(
                    lambda last=seen: self._closed or self._version != last or not is_active(),  # type: ignore[misc]
                    timeout=self._interval_s,
                )
                if self._closed or not is_active():
                    return
                changed = self._version != seen
            if not changed:
                self.notify_changed()  # periodic poll: may bump the version itself
            with self._cond:
                seen = self._version
                current = list(self._snapshot)
            yield current

    def wake(self) -> None:
        """Wake streams so they re-check ``is_active`` (used on client cancel)."""
        with self._cond:
            self._cond.notify_all()


_STATUS = {"Unknown": 0, "Healthy": 1, "Unhealthy": 2}


def _response(pb: ModuleType, devices: list[DeviceHealth], now: int, default_timeout: int) -> Any:
    response = pb.NodeWatchResourcesResponse()
    for d in devices:
        response.devices.add(
            device=pb.DeviceIdentifier(pool_name=d.pool, device_name=d.device),
            health=_STATUS[d.health],
            last_updated_time=now,
            health_check_timeout_seconds=d.timeout_s or default_timeout,
            message=d.message,
        )
    return response


def _watch(
    hub: HealthHub, pb: ModuleType, context: Any, clock: Callable[[], float]
) -> Iterator[Any]:
    cancelled = threading.Event()

    def on_cancel() -> None:
        cancelled.set()
        hub.wake()

    context.add_callback(on_cancel)
    for devices in hub.stream(lambda: not cancelled.is_set()):
        yield _response(pb, devices, int(clock()), hub.default_timeout_s)


class HealthV1alpha1(health_v1alpha1_pb2_grpc.DRAResourceHealthServicer):  # type: ignore[misc]
    def __init__(self, hub: HealthHub, clock: Callable[[], float] = time.time) -> None:
        self._hub = hub
        self._clock = clock

    def NodeWatchResources(self, request: Any, context: Any) -> Iterator[Any]:
        return _watch(self._hub, health_v1alpha1_pb2, context, self._clock)


class HealthV1(health_v1_pb2_grpc.DRAResourceHealthServicer):  # type: ignore[misc]
    def __init__(self, hub: HealthHub, clock: Callable[[], float] = time.time) -> None:
        self._hub = hub
        self._clock = clock

    def NodeWatchResources(self, request: Any, context: Any) -> Iterator[Any]:
        return _watch(self._hub, health_v1_pb2, context, self._clock)


def add_health_services(server: Any, hub: HealthHub) -> None:
    health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(HealthV1alpha1(hub), server)
    health_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(HealthV1(hub), server)
