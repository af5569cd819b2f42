"""The chart's health, metrics and claim-status values: what the DaemonSet gets, the
metrics Service and ServiceMonitor, host PID only for usage sampling, and the env values
parsed by the plugin's own flags (so a chart value can never be one the plugin refuses)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from dra_driver.commands import observability
from tests.e2e.helm import CHART, build_helm, plugin_container, render, run_helm


@pytest.fixture(scope="module")
def helm() -> Path:
    return build_helm()


def daemonset_pod(objs):
    (ds,) = [o for o in objs if o["kind"] == "DaemonSet"]
    return ds["spec"]["template"]["spec"]


def plugin_args(pod, monkeypatch) -> argparse.Namespace:
    """Parse the container's args with its env, exactly as the plugin would."""
    from dra_driver.cli import build_parser

    container = plugin_container(pod["containers"])
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env["DRA_NODE_NAME"] = "n"  # the downward API's value
    return build_parser(environ=env).parse_args(container["args"])


def test_defaults_reach_the_plugin(helm: Path, monkeypatch) -> None:
    objs = render(helm)
    pod = daemonset_pod(objs)
    assert pod["hostPID"] is True  # usage sampling on by default
    args = plugin_args(pod, monkeypatch)
    assert (args.metrics, args.usage_interval, args.claim_status) == (True, 10.0, True)
    policy = observability.health_policy(args)
    assert policy is not None and policy.healthy_period_s == 60 and policy.check_interval_s == 5
    assert policy.ignored_xids == {13, 31, 43, 45, 68, 109}
    assert policy.fatal_effect == "NoSchedule" and args.numa_attribute_form == "scalar"
    assert not [o for o in objs if o["kind"] in ("Service", "ServiceMonitor")]


def test_values_change_what_the_plugin_does(helm: Path, monkeypatch) -> None:
    objs = render(
        helm, "--set", "health.fatalTaintEffect=NoExecute", "--set", "health.ignoredXids={13,74}",
        "--set", "health.healthyPeriodSeconds=300", "--set", "numaAttributeForm=list",
        "--set", "metrics.usageIntervalSeconds=0", "--set", "claimStatus=false",
        "--set", "health.monitor=false", "--set", "mpsDaemons=process",
    )  # fmt: skip
    pod = daemonset_pod(objs)
    assert "hostPID" not in pod  # neither usage sampling nor MPS daemon pods need it
    args = plugin_args(pod, monkeypatch)
    assert observability.health_policy(args) is None
    assert (args.usage_interval, args.claim_status, args.numa_attribute_form) == (0, False, "list")
    assert args.ignored_xids == {13, 74} and args.fatal_taint_effect == "NoExecute"


def test_metrics_service_and_service_monitor(helm: Path) -> None:
    objs = render(helm, "--set", "metrics.service=true", "--set",
                  "metrics.serviceMonitor.enabled=true", "--set",
                  "metrics.serviceMonitor.labels.release=prom")  # fmt: skip
    (svc,) = [o for o in objs if o["kind"] == "Service"]
    (mon,) = [o for o in objs if o["kind"] == "ServiceMonitor"]
    (ds,) = [o for o in objs if o["kind"] == "DaemonSet"]
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == ds["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["ports"] == [{"name": "metrics", "port": 51515, "targetPort": "health",
                                     "protocol": "TCP"}]  # fmt: skip
    assert mon["spec"]["endpoints"] == [{
        "port": "metrics", "path": "/metrics", "interval": "30s",
        "relabelings": [{"sourceLabels": ["__meta_kubernetes_pod_node_name"],
                         "targetLabel": "node"}],
    }]  # fmt: skip
    assert mon["metadata"]["labels"]["release"] == "prom"
    assert all(mon["spec"]["selector"]["matchLabels"][k] == v
               for k, v in svc["metadata"]["labels"].items()
               if k in mon["spec"]["selector"]["matchLabels"])  # fmt: skip


@pytest.mark.parametrize(
    ("setting", "field"),
    [("health.fatalTaintEffect=Evict", "fatalTaintEffect"),
     ("numaAttributeForm=lists", "numaAttributeForm"),
     ("health.ignoredXids={0}", "ignoredXids"),
     ("metrics.serviceMonitor.interval=often", "interval")],
)  # fmt: skip
def test_schema_rejects_bad_values(helm: Path, setting: str, field: str) -> None:
    result = run_helm(helm, "template", "x", str(CHART), "--set", setting)
    assert result.returncode != 0
    assert field in result.stderr
