"""The chart's ComputeDomain parts: the controller Deployment's settings reach the real
command, its ServiceAccount is the one the shipped RBAC binds, ``computeDomains.enabled``
leaves them out (the CRDs stay: Helm never removes crds/), bad values are refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.helm import CHART, build_helm, render, run_helm


@pytest.fixture(scope="module")
def helm() -> Path:
    return build_helm()


def deployment(objs: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = [o for o in objs if o["kind"] == "Deployment"]
    return found


def test_the_controller_gets_the_chart_s_image_namespace_and_daemon_account(helm: Path) -> None:
    from dra_driver.cli import build_parser

    objs = render(helm, "--set", "image.repository=reg/dra", "--set", "image.tag=2.0",
                  "--set", "computeDomains.controller.workers=8", namespace="gpu-ops")  # fmt: skip
    pod = deployment(objs)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    refs = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
            for e in container["env"] if "valueFrom" in e}  # fmt: skip
    assert refs == {"DRA_NAMESPACE": "metadata.namespace"}
    parser = build_parser(environ={**env, "DRA_NAMESPACE": "gpu-ops"})
    args = parser.parse_args(container["args"])
    assert args.command == "compute-domain-controller"
    assert (args.namespace, args.image, args.workers) == ("gpu-ops", "reg/dra:2.0", 8)
    assert container["image"] == "reg/dra:2.0"
    accounts = {o["metadata"]["name"] for o in objs if o["kind"] == "ServiceAccount"}
    assert pod["serviceAccountName"] in accounts
    assert args.daemon_service_account in accounts
    bound = {s["name"] for o in objs if o["kind"] in ("ClusterRoleBinding", "RoleBinding")
             for s in o["subjects"]}  # fmt: skip
    assert {pod["serviceAccountName"], args.daemon_service_account} <= bound
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_replicas_elect_a_leader_and_are_probed_on_the_health_port(helm: Path) -> None:
    """Replicas > 1 render with leader election on and a rolling update that keeps one
    running; both probes ask the port the command serves them on."""
    from dra_driver.cli import build_parser

    objs = render(helm, "--set", "computeDomains.controller.replicas=3",
                  "--set", "computeDomains.controller.healthPort=9440",
                  "--set", "computeDomains.controller.leaseDurationSeconds=30")  # fmt: skip
    spec = deployment(objs)["spec"]
    assert spec["replicas"] == 3
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    (container,) = spec["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    args = build_parser(environ={**env, "DRA_NAMESPACE": "x"}).parse_args(container["args"])
    assert (args.leader_elect, args.lease_duration, args.health_port) == (True, 30.0, 9440)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for probe in ("livenessProbe", "readinessProbe"):
        assert ports[container[probe]["httpGet"]["port"]] == 9440
    rules = [r for o in objs if o["kind"] in ("Role", "ClusterRole")
             and o["metadata"]["name"].endswith("compute-domain-controller")
             for r in o["rules"]]  # fmt: skip
    leases = [r for r in rules if r["resources"] == ["leases"]]
    assert {v for r in leases for v in r["verbs"]} == {"create", "get", "update"}
    assert all(r.get("resourceNames") == ["compute-domain-controller"]
               for r in leases if r["verbs"] != ["create"])  # fmt: skip
    (events,) = [r for r in rules if r["resources"] == ["events"]]
    assert (events["apiGroups"], events["verbs"]) == (["events.k8s.io"], ["create"])


def test_compute_domains_can_be_left_out_but_their_crds_stay(helm: Path) -> None:
    on = render(helm)
    off = render(helm, "--set", "computeDomains.enabled=false")
    names_on = {(o["kind"], o["metadata"]["name"]) for o in on}
    names_off = {(o["kind"], o["metadata"]["name"]) for o in off}
    gone = names_on - names_off
    assert ("Deployment", "dra-driver-compute-domain-controller") in gone
    assert ("DeviceClass", "compute-domain-default-channel.nvidia.com") in gone
    assert ("ServiceAccount", "dra-driver-compute-domain-daemon") in gone
    assert not [n for n in names_off if "compute-domain" in n[1]]
    crds = {n for k, n in names_off if k == "CustomResourceDefinition"}
    assert crds == {"computedomains.resource.nvidia.com",
                    "computedomaincliques.resource.nvidia.com"}  # fmt: skip


@pytest.mark.parametrize(
    "setting",
    ["computeDomains.controller.workers=0", "computeDomains.controller.resyncIntervalSeconds=0",
     "computeDomains.enabled=maybe", "computeDomains.controller.replicas=0",
     "computeDomains.controller.leaseDurationSeconds=2",
     "computeDomains.controller.healthPort=0",
     "computeDomains.plugin.cliqueNodeLabel=maybe"],
)  # fmt: skip
def test_schema_rejects_bad_compute_domain_values(helm: Path, setting: str) -> None:
    result = run_helm(helm, "template", "x", str(CHART), "--set", setting)
    assert result.returncode != 0
    assert "computeDomains" in result.stderr
