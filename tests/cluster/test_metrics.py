"""``/metrics`` of a plugin on an emulated node against the real API server: driver-level
metrics (slice writes, device health and taints, NVML calls, Xids) in Prometheus format,
parsed with prometheus-client's own parser."""

from __future__ import annotations

import urllib.request

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from dra_driver.devcluster import Cluster, wait_until
from dra_driver.gpu.monitoring.healthpolicy import HealthPolicy
from dra_driver.plugin.healthz import HealthServer
from dra_driver.plugin.metrics import exposition
from tests.cluster.test_health_taints import LOG, health_node


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain; version=")
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def test_metrics_show_publishing_health_nvml_and_xids(cluster: Cluster) -> None:
    registry = CollectorRegistry()
    policy = HealthPolicy(healthy_period_s=60, check_interval_s=0.5)
    with health_node(cluster, "l4-x4", policy, registry=registry) as h:
        server = HealthServer(readiness=h.on_node.plugin.readiness, port=0, host="127.0.0.1",
                              logger=LOG, metrics=exposition(registry))  # fmt: skip
        server.start()
        try:
            wait_until(
                lambda: h.on_node.plugin.readiness().publish.in_sync, timeout=30, what="sync"
            )
            m = scrape(server.port)
            assert value(m, "dra_driver_resourceslice_writes_total", operation="create") == 1
            assert value(m, "dra_driver_resourceslice_sync_duration_seconds_count") >= 1
            assert value(m, "dra_driver_prepared_claims") == 0
            pool = h.name
            for dev in ("gpu-0", "gpu-1", "gpu-2", "gpu-3"):
                assert value(m, "dra_driver_device_healthy", pool=pool, device=dev,
                             health="Healthy") == 1  # fmt: skip
            assert value(m, "dra_driver_nvml_call_duration_seconds_count",
                         function="nvmlDeviceGetFieldValues") >= 4  # fmt: skip

            h.node.inject_xid(0, 74)
            h.node.inject_xid(0, 13)  # ignored, but counted
            uuid = h.node.profile.gpus[0].uuid
            wait_until(
                lambda: value(scrape(server.port), "dra_driver_device_healthy", pool=pool,
                              device="gpu-2", health="Unhealthy") == 0,
                timeout=30, what="gpu-2 unhealthy in /metrics",
            )  # fmt: skip
            m = scrape(server.port)
            assert value(m, "dra_driver_gpu_xid_events_total", gpu=uuid, xid="74") == 1
            assert value(m, "dra_driver_gpu_xid_events_total", gpu=uuid, xid="13") == 1
            assert value(m, "dra_driver_gpu_faults_total", gpu=uuid, kind="xid") == 1
            assert value(m, "dra_driver_device_taints", device="gpu-2", key="gpu.nvidia.com/xid",
                         value="74", effect="NoSchedule") == 1  # fmt: skip
            wait_until(
                lambda: value(scrape(server.port), "dra_driver_resourceslice_writes_total",
                              operation="update"),
                timeout=30, what="the taint republished (a slice update counted)",
            )  # fmt: skip
        finally:
            server.stop()
