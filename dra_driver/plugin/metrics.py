"""Prometheus metrics of the plugin layer, in a registry the composition root passes in.

Nothing is global: every metric lives in the :class:`~dra_driver.prometheus.Registry`
given to :class:`PluginMetrics`,
and ``/metrics`` (see :mod:`dra_driver.plugin.healthz`) serves that registry.
Names start with ``dra_driver_``; label values are bounded (operations,
reasons, the node's own devices), never claim UIDs.

==================================================  =====================================
metric                                              what
==================================================  =====================================
``dra_driver_node_operation_duration_seconds``      prepare/unprepare time per claim
``dra_driver_node_operation_errors_total``          failed claims by operation and reason
``dra_driver_prepared_claims``                      claims prepared on the node now
``dra_driver_prepared_devices``                     their devices
``dra_driver_resourceslice_writes_total``           slice creates/updates/deletes
``dra_driver_resourceslice_conflicts_total``        writes refused on a stale version
``dra_driver_resourceslice_sync_errors_total``      failed syncs (API errors, invalid pool)
``dra_driver_resourceslice_sync_duration_seconds``  one reconcile of the node's slices
``dra_driver_resourceslice_generation``             pool generation last published
``dra_driver_device_healthy``                       1/0 per device, as streamed to the kubelet
``dra_driver_device_taints``                        taints per device, key and effect
==================================================  =====================================
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from dra_driver.plugin.backend import DeviceHealth
from dra_driver.plugin.resources import Pool
from dra_driver.prometheus import (
    CONTENT_TYPE,
    Counter,
    Family,
    Gauge,
    Histogram,
    Registry,
    gauge_family,
)

_OPERATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_SYNC_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class PublishMetrics:
    """What the slice publisher counts."""

    def __init__(self, registry: Registry) -> None:
        self._writes = Counter(
            "dra_driver_resourceslice_writes",
            "ResourceSlice writes by this node's plugin, by operation.",
            ["operation"],
            registry=registry,
        )
        self._conflicts = Counter(
            "dra_driver_resourceslice_conflicts",
            "ResourceSlice writes refused because someone changed the slice first.",
            registry=registry,
        )
        self._errors = Counter(
            "dra_driver_resourceslice_sync_errors",
            "Slice syncs that failed (API errors or an invalid pool), retried with backoff.",
            registry=registry,
        )
        self._duration = Histogram(
            "dra_driver_resourceslice_sync_duration_seconds",
            "Time of one reconcile of the node's ResourceSlices with the pool.",
            buckets=_SYNC_BUCKETS,
            registry=registry,
        )
        self._generation = Gauge(
            "dra_driver_resourceslice_generation",
            "Pool generation of the slices last published.",
            registry=registry,
        )
        for op in ("create", "update", "delete"):
            self._writes.labels(op)

    def write(self, operation: str) -> None:
        self._writes.labels(operation).inc()

    def conflict(self) -> None:
        self._conflicts.inc()

    def sync(self, seconds: float, *, ok: bool, generation: int | None = None) -> None:
        self._duration.observe(seconds)
        if not ok:
            self._errors.inc()
        if generation is not None:
            self._generation.set(generation)


class OperationMetrics:
    """Per-claim prepare/unprepare latency and failures, labelled by operation and reason."""

    def __init__(self, registry: Registry) -> None:
        self._duration = Histogram(
            "dra_driver_node_operation_duration_seconds",
            "Time to prepare or unprepare one claim (kubelet request to result).",
            ["operation"],
            buckets=_OPERATION_BUCKETS,
            registry=registry,
        )
        self._errors = Counter(
            "dra_driver_node_operation_errors",
            "Claims that failed to prepare or unprepare, by reason.",
            ["operation", "reason"],
            registry=registry,
        )

    def observe(self, operation: str, seconds: float, error_reason: str | None = None) -> None:
        self._duration.labels(operation).observe(seconds)
        if error_reason is not None:
            self._errors.labels(operation, error_reason).inc()


class _StateCollector:
    """Read at scrape time: prepared claims, device health and taints (bounded by devices)."""

    def __init__(
        self,
        *,
        health: Callable[[], Iterable[DeviceHealth]],
        pool: Callable[[], Pool],
        prepared_claims: Callable[[], int],
        prepared_devices: Callable[[], int] | None = None,
    ) -> None:
        self._health, self._pool, self._prepared = health, pool, prepared_claims
        self._devices = prepared_devices

    def collect(self) -> Iterator[Family]:
        claims = gauge_family("dra_driver_prepared_claims", "Claims prepared on this node.")
        claims.add_metric([], self._prepared())
        yield claims
        if self._devices is not None:
            devices = gauge_family(
                "dra_driver_prepared_devices", "Devices of the claims prepared on this node."
            )
            devices.add_metric([], self._devices())
            yield devices
        healthy = gauge_family(
            "dra_driver_device_healthy",
            "1 when the device is Healthy in the health stream to the kubelet, else 0.",
            labels=["pool", "device", "health"],
        )
        for d in self._health():
            healthy.add_metric([d.pool, d.device, d.health], 1.0 if d.health == "Healthy" else 0.0)
        yield healthy
        taints = gauge_family(
            "dra_driver_device_taints",
            "Taints on a published device (1 per taint), by key, value and effect.",
            labels=["device", "key", "value", "effect"],
        )
        for dev in self._pool().devices:
            for t in dev.taints:
                taints.add_metric([dev.name, t.key, t.value, t.effect], 1.0)
        yield taints


class PluginMetrics:
    """The plugin layer's metrics; one per plugin, all in ``registry``."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.publish = PublishMetrics(registry)
        self.operations = OperationMetrics(registry)

    def watch_state(
        self,
        *,
        health: Callable[[], Iterable[DeviceHealth]],
        pool: Callable[[], Pool],
        prepared_claims: Callable[[], int],
        prepared_devices: Callable[[], int] | None = None,
    ) -> None:
        """Register the scrape-time view of the plugin's state (once, at start)."""
        self.registry.register(
            _StateCollector(
                health=health,
                pool=pool,
                prepared_claims=prepared_claims,
                prepared_devices=prepared_devices,
            )
        )


def exposition(registry: Registry) -> Callable[[], tuple[bytes, str]]:
    """What ``/metrics`` serves: the registry in Prometheus text format, and its type."""

    def render() -> tuple[bytes, str]:
        return registry.render(), CONTENT_TYPE

    return render
