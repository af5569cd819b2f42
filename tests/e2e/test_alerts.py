"""The chart's alerting rules (``metrics.prometheusRule``), checked and unit-tested by
the real promtool (built from tests/go/prometheus): the rules rendered by Helm pass
``promtool check rules``, and each alert fires on a synthetic case of what it is
about and stays silent on one that is not (``promtool test rules``), with the labels
and annotations an operator gets. Series carry the labels a Prometheus scrape adds
(``instance``, ``job``, and ``node`` from the ServiceMonitor's relabeling)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.helm import build_helm, render
from tests.e2e.monitoring import build_prometheus, rule_groups

ON = ("--set", "metrics.prometheusRule.enabled=true")
NODE = {"node": "gpu-node-1", "instance": "10.0.0.5:51515", "job": "dra-driver-metrics"}
CLAIM = {**NODE, "namespace": "team-a", "claim": "train", "pod": "train-0", "device": "gpu-0"}
ALERT_CLAIM = {k: CLAIM[k] for k in ("node", "namespace", "claim", "pod", "device")}


def series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    inner = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return {"series": f"{name}{{{inner}}}", "values": values}


def alert(labels: dict[str, str], severity: str, summary: str, description: str) -> dict[str, Any]:
    return {"exp_labels": {**labels, "severity": severity},
            "exp_annotations": {"summary": summary, "description": description}}  # fmt: skip


IDLE = "A GPU allocated to a claim is idle."
MEMORY = "A claim is close to the GPU memory it was given."
UNHEALTHY = "A GPU is unhealthy or tainted."
NOT_READY = "The GPU DRA kubelet plugin is not ready."
ERRORS = "Claims failed to prepare or unprepare."
PLUGIN_POD = {"namespace": "dra-driver", "pod": "dra-driver-kubelet-plugin-x7k2p",
              "uid": "9d1c", "condition": "true"}  # fmt: skip

# fmt: off
# alert -> (fires: input series, eval time, expected alerts; silent: series, eval time)
CASES: dict[str, dict[str, tuple[list[dict[str, str]], str, list[dict[str, Any]]]]] = {
    "DRAGPUClaimIdle": {
        # 1 % busy for 90 minutes: idle for the whole hour.
        "fires": ([series("dra_driver_claim_gpu_utilization_ratio", CLAIM, "0.01x90")], "70m", [
            alert(ALERT_CLAIM, "warning", IDLE,
                  "Pod team-a/train-0 (claim train) has used 1% of gpu-0 on node gpu-node-1, "
                  "below 0.05 for 1h.")]),
        # Idle for 45 minutes only; another claim just above the threshold all along.
        "silent": ([series("dra_driver_claim_gpu_utilization_ratio", CLAIM, "0.5x25 0.01x65"),
                    series("dra_driver_claim_gpu_utilization_ratio", {**CLAIM, "claim": "eval"},
                           "0.06x90")], "70m", []),
    },
    "DRAGPUClaimMemoryNearLimit": {
        # 7.5 of its 8 GB (an MPS limit) for 15 minutes.
        "fires": ([series("dra_driver_claim_gpu_memory_used_bytes", CLAIM, "7500000000x20"),
                   series("dra_driver_claim_gpu_memory_allocated_bytes", CLAIM, "8000000000x20")],
                  "15m", [alert(ALERT_CLAIM, "warning", MEMORY,
                                "Pod team-a/train-0 (claim train) uses 93.75% of its memory on "
                                "gpu-0 (node gpu-node-1).")]),
        # 87.5 %; and a device whose allocation is not known (0) is no division by zero.
        "silent": ([series("dra_driver_claim_gpu_memory_used_bytes", CLAIM, "7000000000x20"),
                    series("dra_driver_claim_gpu_memory_allocated_bytes", CLAIM, "8000000000x20"),
                    series("dra_driver_claim_gpu_memory_used_bytes", {**CLAIM, "device": "gpu-1"},
                           "1000000000x20"),
                    series("dra_driver_claim_gpu_memory_allocated_bytes",
                           {**CLAIM, "device": "gpu-1"}, "0x20")], "15m", []),
    },
    "DRAGPUDeviceUnhealthy": {
        # gpu-1 Unhealthy in the health stream; gpu-2 Healthy but tainted after an Xid.
        "fires": ([series("dra_driver_device_healthy",
                          {**NODE, "pool": "gpu-node-1", "device": "gpu-1", "health": "Unhealthy"},
                          "0x10"),
                   series("dra_driver_device_healthy",
                          {**NODE, "pool": "gpu-node-1", "device": "gpu-2", "health": "Healthy"},
                          "1x10"),
                   series("dra_driver_device_taints",
                          {**NODE, "device": "gpu-2", "key": "gpu.nvidia.com/xid", "value": "79",
                           "effect": "NoSchedule"}, "1x10")],
                  "6m", [alert({"node": "gpu-node-1", "device": d}, "critical", UNHEALTHY,
                               f"Device {d} on node gpu-node-1 is unhealthy or tainted: new claims "
                               "will not get it (dra_driver_device_taints shows the taint).")
                         for d in ("gpu-1", "gpu-2")]),
        # Unhealthy for 2 minutes only; an unmonitored device (effect None) is no fault.
        "silent": ([series("dra_driver_device_healthy",
                           {**NODE, "pool": "gpu-node-1", "device": "gpu-1", "health": "Healthy"},
                           "1x4 0x6"),
                    series("dra_driver_device_taints",
                           {**NODE, "device": "gpu-3", "key": "gpu.nvidia.com/unmonitored",
                            "value": "", "effect": "None"}, "1x10")], "6m", []),
    },
    "DRADriverPluginNotReady": {
        # Not scraped for 15 minutes; another plugin pod scraped but not Ready.
        "fires": ([series("up", NODE, "0x15"),
                   series("kube_pod_status_ready", PLUGIN_POD, "0x15")], "12m", [
            alert(NODE, "critical", NOT_READY,
                  "The plugin 10.0.0.5:51515 is down or not Ready: pods needing GPUs on its "
                  "node cannot start."),
            alert(PLUGIN_POD, "critical", NOT_READY,
                  "The plugin dra-driver-kubelet-plugin-x7k2p is down or not Ready: pods needing "
                  "GPUs on its node cannot start.")]),
        # Up and Ready; other jobs' targets down and other pods not Ready are not ours.
        "silent": ([series("up", NODE, "1x15"),
                    series("up", {**NODE, "job": "node-exporter"}, "0x15"),
                    series("kube_pod_status_ready", PLUGIN_POD, "1x15"),
                    series("kube_pod_status_ready", {**PLUGIN_POD, "pod": "web-5f7d"}, "0x15")],
                   "12m", []),
    },
    "DRADriverPrepareErrors": {
        # The first failure of a reason: its counter appears at 1 (no increase to see).
        "fires": ([series("dra_driver_node_operation_errors_total",
                          {**NODE, "operation": "prepare", "reason": "InvalidConfig"},
                          "_x5 1x10")], "8m", [
            alert({"node": "gpu-node-1", "operation": "prepare", "reason": "InvalidConfig"},
                  "warning", ERRORS,
                  "prepare failed on node gpu-node-1 (InvalidConfig): see the pod's events and "
                  "the plugin's log.")]),
        # Failures long ago, none in the last 15 minutes.
        "silent": ([series("dra_driver_node_operation_errors_total",
                           {**NODE, "operation": "unprepare", "reason": "Internal"},
                           "1x5 2x40")], "40m", []),
    },
}
# fmt: on


@pytest.fixture(scope="module")
def promtool() -> Path:
    return build_prometheus() / "promtool"


@pytest.fixture(scope="module")
def rules(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chart's rules with default values, as a Prometheus rule file."""
    path = tmp_path_factory.mktemp("rules") / "dra-driver-rules.yaml"
    path.write_text(yaml.safe_dump(rule_groups(render(build_helm(), *ON))))
    return path


def run_promtool(promtool: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(promtool), *args], capture_output=True, text=True, check=False,
                          timeout=120)  # fmt: skip


def unit_test(
    promtool: Path, rules: Path, name: str, inputs: list[dict[str, str]], at: str,
    alertname: str, expected: list[dict[str, Any]],
) -> subprocess.CompletedProcess[str]:  # fmt: skip
    test = {"rule_files": [str(rules)], "evaluation_interval": "1m",
            "tests": [{"name": name, "interval": "1m", "input_series": inputs,
                       "alert_rule_test": [{"eval_time": at, "alertname": alertname,
                                            "exp_alerts": expected}]}]}  # fmt: skip
    path = rules.parent / f"{name}.test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    return run_promtool(promtool, "test", "rules", str(path))


def test_rules_are_off_by_default_and_pass_promtool_check(promtool: Path, rules: Path) -> None:
    assert not [o for o in render(build_helm()) if o["kind"] == "PrometheusRule"]
    checked = run_promtool(promtool, "check", "rules", str(rules))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 5 rules found" in checked.stdout, checked.stdout


def test_every_alert_has_a_firing_and_a_silent_case(rules: Path) -> None:
    names = {r["alert"] for g in yaml.safe_load(rules.read_text())["groups"] for r in g["rules"]}
    assert names == set(CASES)


@pytest.mark.parametrize("case", ["fires", "silent"])
@pytest.mark.parametrize("alertname", sorted(CASES))
def test_alert(promtool: Path, rules: Path, alertname: str, case: str) -> None:
    inputs, at, expected = CASES[alertname][case]
    result = unit_test(promtool, rules, f"{alertname}-{case}", inputs, at, alertname, expected)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout, result.stdout


def test_a_wrong_expectation_fails(promtool: Path, rules: Path) -> None:
    """The harness can fail: the firing case's input, expected silent, is refused."""
    inputs, at, _ = CASES["DRAGPUClaimIdle"]["fires"]
    result = unit_test(promtool, rules, "inverted", inputs, at, "DRAGPUClaimIdle", [])
    assert result.returncode != 0
    assert "DRAGPUClaimIdle" in result.stdout + result.stderr


def test_thresholds_and_durations_are_values(promtool: Path, tmp_path: Path) -> None:
    """20 % busy for 15 minutes: idle with a 0.25 threshold over 10m, not by default."""
    custom = tmp_path / "custom-rules.yaml"
    custom.write_text(yaml.safe_dump(rule_groups(render(build_helm(), *ON, "--set-json",
        "metrics.prometheusRule.idle.utilizationBelow=0.25", "--set",
        "metrics.prometheusRule.idle.for=10m", "--set",
        "metrics.prometheusRule.alertLabels.team=ml-platform"))))  # fmt: skip
    inputs = [series("dra_driver_claim_gpu_utilization_ratio", CLAIM, "0.2x20")]
    fired = alert({**ALERT_CLAIM, "team": "ml-platform"}, "warning", IDLE,
                  "Pod team-a/train-0 (claim train) has used 20% of gpu-0 on node gpu-node-1, "
                  "below 0.25 for 10m.")  # fmt: skip
    result = unit_test(promtool, custom, "custom", inputs, "15m", "DRAGPUClaimIdle", [fired])
    assert result.returncode == 0, result.stdout + result.stderr
    default = custom.parent / "default-rules.yaml"
    default.write_text(yaml.safe_dump(rule_groups(render(build_helm(), *ON))))
    result = unit_test(promtool, default, "default", inputs, "15m", "DRAGPUClaimIdle", [])
    assert result.returncode == 0, result.stdout + result.stderr
