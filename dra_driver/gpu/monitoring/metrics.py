"""Prometheus metrics of the GPU layer: NVML calls and what the health monitor saw.

Registered in the prometheus-client ``CollectorRegistry`` the composition root passes
in (nothing is global). Labels are bounded: NVML function names, NVML return codes, the node's
GPU UUIDs, Xid numbers and fault kinds.

============================================  ============================================
metric                                        what
============================================  ============================================
``dra_driver_nvml_call_duration_seconds``     every NVML call the plugin makes, by function
``dra_driver_nvml_errors_total``              failed NVML calls by function and return code
``dra_driver_gpu_xid_events_total``           Xid events by GPU and Xid (ignored ones too)
``dra_driver_gpu_faults_total``               faults recorded by GPU and kind
============================================  ============================================
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

_NVML_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25, 1, 5)


class GpuMetrics:
    """Implements the NVML call observer and the monitor's :class:`HealthEvents`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._calls = Histogram(
            "dra_driver_nvml_call_duration_seconds",
            "Duration of NVML calls made by the plugin (event waits excluded), by function.",
            ["function"],
            buckets=_NVML_BUCKETS,
            registry=registry,
        )
        self._errors = Counter(
            "dra_driver_nvml_errors",
            "NVML calls that returned an error, by function and NVML return code.",
            ["function", "code"],
            registry=registry,
        )
        self._xids = Counter(
            "dra_driver_gpu_xid_events",
            "Xid events NVML reported, by GPU UUID and Xid (including ignored Xids).",
            ["gpu", "xid"],
            registry=registry,
        )
        self._faults = Counter(
            "dra_driver_gpu_faults",
            "Faults the health monitor recorded, by GPU UUID and kind (taint key).",
            ["gpu", "kind"],
            registry=registry,
        )

    def nvml_call(self, function: str, seconds: float, code: int | None) -> None:
        self._calls.labels(function).observe(seconds)
        if code is not None:
            self._errors.labels(function, str(code)).inc()

    def xid(self, uuid: str, xid: int) -> None:
        self._xids.labels(uuid, str(xid)).inc()

    def fault(self, uuid: str, kind: str) -> None:
        self._faults.labels(uuid, kind).inc()
