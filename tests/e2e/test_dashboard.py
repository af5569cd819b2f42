"""The chart's Grafana dashboard (``metrics.dashboard``) answers against what our plugin
exports: a real Prometheus (built from tests/go/prometheus) scrapes the plugin on a real
node (real scheduler, kubelet and containerd; the chart's args) while claims run there,
one fails to prepare and a device is tainted, and every panel's query, with Grafana's
variables filled in as Grafana would, returns series carrying every label its legend and
grouping use, for our node, namespaces and claim. The variables' queries list them too.
The ``node`` label comes from the scrape config, as the chart's ServiceMonitor adds it."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.demo.realgpu import RealGpuNode
from dra_driver.demo.stack import load_examples, pin_to_node
from dra_driver.devcluster import Cluster, wait_until
from dra_driver.devcluster.binaries import NodeBinaries
from dra_driver.emulation import EmulatedNode
from tests.e2e.conftest import real_gpu_node
from tests.e2e.helm import build_helm, render
from tests.e2e.monitoring import PrometheusServer, build_prometheus
from tests.e2e.scenarios import EXAMPLES, apply_claimed_pod

VALUES = {"health.checkIntervalSeconds": "1", "metrics.usageIntervalSeconds": "1"}
# What Grafana puts in for the variables: "All" (allValue .*), the default idle
# threshold, the time range and the rate interval of a short dashboard range.
GRAFANA = {"$node": ".*", "$namespace": ".*", "$claim": ".*", "$idle_threshold": "0.05",
           "$__range": "10m", "$__rate_interval": "2m"}  # fmt: skip


@pytest.fixture(scope="module")
def node(
    cluster: Cluster, driver_objects: list[str], node_binaries: NodeBinaries, helm_binary: Path
) -> Iterator[RealGpuNode]:
    with real_gpu_node(cluster, node_binaries, helm_binary, "l4-x4", values=VALUES) as n:
        yield n


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    """The dashboard as the chart ships it, from the rendered ConfigMap."""
    objs = render(build_helm(), "--set", "metrics.dashboard.enabled=true")
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith(
        "-dashboard")]  # fmt: skip
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    loaded: dict[str, Any] = json.loads(cm["data"]["dra-driver.json"])
    return loaded


def fill(expr: str) -> str:
    for var in sorted(GRAFANA, key=len, reverse=True):  # $__range before $__rate_interval
        expr = expr.replace(var, GRAFANA[var])
    assert "$" not in expr, expr
    return expr


def used_labels(target: dict[str, Any]) -> set[str]:
    """Labels the panel shows: those of its legend and of its outermost grouping."""
    legend = set(re.findall(r"{{\s*(\w+)\s*}}", target.get("legendFormat", "")))
    outer = re.match(r"\s*\w+ by \(([^)]*)\)", target["expr"])
    grouping = {g.strip() for g in outer.group(1).split(",")} - {"le"} if outer else set()
    return legend | grouping


def test_dashboard_is_off_by_default() -> None:
    assert not [o for o in render(build_helm()) if o["kind"] == "ConfigMap"]


def test_every_panel_answers_against_prometheus_scraping_the_plugin(
    cluster: Cluster,
    cluster_namespace: str,
    node: RealGpuNode,
    dashboard: dict[str, Any],
    tmp_path: Path,
) -> None:
    target = (f"127.0.0.1:{node.health_port}", {"node": node.name})
    prometheus = PrometheusServer(build_prometheus() / "prometheus", tmp_path / "prom", [target])
    prometheus.start()
    try:
        run_and_check(cluster, cluster_namespace, node, dashboard, prometheus)
    finally:
        prometheus.stop()


def run_and_check(
    cluster: Cluster, ns: str, node: RealGpuNode, dashboard: dict[str, Any],
    prometheus: PrometheusServer,
) -> None:  # fmt: skip
    # A running claim, a pod whose claim fails to prepare, a tainted device.
    apply_claimed_pod(cluster, node.name, ns, "trainer", "trainer-0")
    node.run_pod(ns, "trainer-0")
    bad_ns = f"{ns}-bad"
    cluster.create_namespace(bad_ns)
    cluster.apply(pin_to_node(load_examples(EXAMPLES / "invalid-config.yaml", bad_ns), node.name))
    emulated = EmulatedNode.create("l4-x4", node.host_root)
    emulated.inject_xid(3, 79)  # fallen off the bus: a fatal fault, the device is tainted
    # ... until the GPU is reset: without a pending recovery action the taint clears
    # after the healthy period (60 s), which a loaded machine outlasts before every
    # other panel has its series (failed so in two full runs).
    emulated.set_recovery_action(3, "gpu-reset")
    tainted = f"gpu-{emulated.profile.gpus[3].minor}"

    targets = [(p["title"], t) for p in dashboard["panels"] for t in p["targets"]]
    assert len({title for title, _ in targets}) == 7 and len(targets) == 12

    def valued(found: list[dict[str, Any]]) -> bool:
        """A series alone is not an answer: the plugin exports its latency histogram's
        children from start (zero counts), and a quantile of nothing observed is NaN."""
        return any(s["value"][1] != "NaN" for s in found)

    def answers() -> dict[str, list[dict[str, Any]]] | None:
        results = {}
        for title, target in targets:
            found = prometheus.query(fill(target["expr"]))
            if not valued(found):
                return None
            results[f"{title} [{target['refId']}]"] = found
        return results

    def missing() -> str:
        empty = [f"{title} [{t['refId']}]" for title, t in targets
                 if not valued(prometheus.query(fill(t["expr"])))]  # fmt: skip
        return f"panels without a value: {empty}\n{node.plugin_log_tail()}"

    results = wait_until(answers, timeout=120, interval=2, what="every panel answers",
                         describe=missing)  # fmt: skip
    for title, target in targets:
        for series in results[f"{title} [{target['refId']}]"]:
            labels = series["metric"]
            assert used_labels(target) <= set(labels), (title, target["expr"], labels)
            assert labels.get("node", node.name) == node.name, labels
    # Per-claim panels show our claim; the failure and the taint are the ones we caused.
    per_claim = [s for title, found in results.items() if "per claim" in title for s in found]
    claims = {(s["metric"]["namespace"], s["metric"]["claim"]) for s in per_claim}
    assert (ns, "trainer") in claims, claims
    failures = results["Prepare and unprepare failures [A]"]
    assert {s["metric"]["operation"] for s in failures} == {"prepare"}, failures
    taints = results["Device health [B]"]
    assert {s["metric"]["device"] for s in taints} == {tainted}, taints
    latency = results["Prepare and unprepare latency [B]"]
    assert any(s["metric"]["operation"] == "prepare" and s["value"][1] != "NaN"
               for s in latency), latency  # fmt: skip

    # The variables' queries (label_values) list our node, namespace and claim.
    wanted = {"node": node.name, "namespace": ns, "claim": "trainer"}
    for var in dashboard["templating"]["list"]:
        if var["type"] != "query":
            continue
        query = re.fullmatch(r"label_values\((.*), (\w+)\)", var["query"]["query"])
        assert query, var["query"]
        match, label = fill(query.group(1)), query.group(2)
        assert label == var["name"]
        assert wanted[label] in prometheus.label_values(label, match), (label, match)
