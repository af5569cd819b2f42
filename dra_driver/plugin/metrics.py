"""Prometheus metrics of the plugin layer, in a registry the composition root passes in.

Nothing is global: every metric lives in the prometheus-client ``CollectorRegistry``
given to :class:`PluginMetrics` (never the library's global ``REGISTRY``), and
``/metrics`` (see :mod:`dra_driver.plugin.healthz`) serves that registry through
:func:`exposition`, rendered by prometheus-client in the text format 0.0.4.
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

import copy
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import (
    CONTENT_TYPE_PLAIN_0_0_4,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric

from dra_driver.plugin.backend import DeviceHealth
from dra_driver.plugin.resources import Pool

_OPERATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_SYNC_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class PublishMetrics:
    """What the slice publisher counts."""

    def __init__(self, registry: CollectorRegistry) -> None:
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

    def __init__(self, registry: CollectorRegistry) -> None:
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
        # The two operations' children, bound once: labels() takes a lock and a lookup.
        self.prepare_seconds = self._duration.labels("prepare")
        self.unprepare_seconds = self._duration.labels("unprepare")

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

    def collect(self) -> Iterator[Metric]:
        claims = GaugeMetricFamily("dra_driver_prepared_claims", "Claims prepared on this node.")
        claims.add_metric([], self._prepared())
        yield claims
        if self._devices is not None:
            devices = GaugeMetricFamily(
                "dra_driver_prepared_devices", "Devices of the claims prepared on this node."
            )
            devices.add_metric([], self._devices())
            yield devices
        healthy = GaugeMetricFamily(
            "dra_driver_device_healthy",
            "1 when the device is Healthy in the health stream to the kubelet, else 0.",
            labels=["pool", "device", "health"],
        )
        for d in self._health():
            healthy.add_metric([d.pool, d.device, d.health], 1.0 if d.health == "Healthy" else 0.0)
        yield healthy
        taints = GaugeMetricFamily(
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

    def __init__(self, registry: CollectorRegistry) -> None:
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


def exposition(registry: CollectorRegistry) -> Callable[[], tuple[bytes, str]]:
    """What ``/metrics`` serves: the registry in the text format 0.0.4, and its type."""
    shown = _WithoutCreated(registry)

    def render() -> tuple[bytes, str]:
        return generate_latest(shown), CONTENT_TYPE_PLAIN_0_0_4

    return render


class _WithoutCreated:
    """``registry`` without the ``<name>_created`` samples prometheus-client adds to each
    counter and histogram child: creation timestamps no dashboard, alert or ``dra-driver
    report`` reads, one more series per child, and absent from this endpoint before it
    used prometheus-client. Filtered here rather than by ``disable_created_metrics()``,
    which flips a switch for the whole process."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            created = family.name + "_created"
            shown = copy.copy(family)
            shown.samples = [s for s in family.samples if s.name != created]
            yield shown
