"""The chart's node side of ComputeDomains: the compute-domain-plugin container's flags
and env parse as the plugin would parse them, and the switches leave it (and its rights)
out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.helm import build_helm, render


@pytest.fixture(scope="module")
def helm() -> Path:
    return build_helm()


def _pod(objs: list[dict[str, Any]]) -> dict[str, Any]:
    (ds,) = [o for o in objs if o["kind"] == "DaemonSet"]
    spec: dict[str, Any] = ds["spec"]["template"]["spec"]
    return spec


def _cd_objects(objs: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """The plugin's own objects (the controller's are named compute-domain-controller,
    -daemon and -node-labels)."""
    return {(o["kind"], o["metadata"]["name"]) for o in objs
            if o["metadata"]["name"].endswith(("compute-domain-plugin",
                                                "compute-domain-node-label"))}  # fmt: skip


def test_container_flags_parse_into_the_plugin_settings(helm: Path) -> None:
    from dra_driver.cli import build_parser

    objs = render(helm, "--set", "emulate=hgx-h100-fabric", "--set",
                  "computeDomains.plugin.readyWaitSeconds=5")  # fmt: skip
    gpu, cd = _pod(objs)["containers"]
    assert (gpu["name"], cd["name"]) == ("plugin", "compute-domain-plugin")
    env = {e["name"]: e["value"] for e in cd["env"] if "value" in e}
    refs = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in cd["env"]
            if "valueFrom" in e}  # fmt: skip
    assert refs == {"DRA_NODE_NAME": "spec.nodeName", "DRA_NAMESPACE": "metadata.namespace",
                    "DRA_ROLLING_UPDATE_UID": "metadata.uid"}  # fmt: skip
    fields = {"spec.nodeName": "n1", "metadata.namespace": "dra-driver", "metadata.uid": "u-1"}
    parser = build_parser(environ={**env, **{k: fields[v] for k, v in refs.items()}})
    args = parser.parse_args(cd["args"])
    assert (args.node_name, args.namespace, args.ready_wait) == ("n1", "dra-driver", 5.0)
    assert args.emulate == "hgx-h100-fabric" and args.claim_status is False
    assert str(args.host_root) == "/var/lib/dra-driver/emulated"
    assert (
        args.health_port
        == 51516
        != int({e["name"]: e.get("value") for e in gpu["env"]}["DRA_HEALTH_PORT"])
    )
    mounts = {m["name"]: m["mountPath"] for m in cd["volumeMounts"]}
    assert mounts["plugins"] == "/var/lib/kubelet/plugins"  # sockets, state: host paths
    assert mounts["emulated-host"] == "/var/lib/dra-driver/emulated"
    assert cd["readinessProbe"]["httpGet"]["port"] == "cd-health"


@pytest.mark.parametrize("switch", ["computeDomains.plugin.enabled=false",
                                    "computeDomains.enabled=false"])  # fmt: skip
def test_switches_leave_the_container_and_its_rights_out(helm: Path, switch: str) -> None:
    assert len(_cd_objects(render(helm))) == 6  # ClusterRole(+Binding), Role(+Binding), VAP(+B)
    objs = render(helm, "--set", switch)
    assert [c["name"] for c in _pod(objs)["containers"]] == ["plugin"]
    assert not _cd_objects(objs)
    (policy,) = [o for o in objs if o["metadata"]["name"].endswith("resourceslices-own-node")
                 and o["kind"] == "ValidatingAdmissionPolicy"]  # fmt: skip
    assert "compute-domain.nvidia.com" not in str(policy["spec"])


@pytest.mark.parametrize("on", [True, False])
def test_clique_label_value_drives_the_flag_and_the_policy(helm: Path, on: bool) -> None:
    """cliqueNodeLabel=false (GFD owns nvidia.com/gpu.clique): the plugin is told not to
    write it and the admission policy no longer lets its token write it either."""
    from dra_driver.cli import build_parser

    objs = render(helm, "--set", f"computeDomains.plugin.cliqueNodeLabel={str(on).lower()}")
    cd = _pod(objs)["containers"][1]
    parser = build_parser(environ={"DRA_NODE_NAME": "n1", "DRA_NAMESPACE": "dra-driver"})
    assert parser.parse_args(cd["args"]).clique_node_label is on
    (policy,) = [o for o in objs if o["kind"] == "ValidatingAdmissionPolicy"
                 and o["metadata"]["name"].endswith("compute-domain-node-label")]  # fmt: skip
    (keys,) = [v["expression"] for v in policy["spec"]["variables"] if v["name"] == "keys"]
    assert json.loads(keys) == ["resource.nvidia.com/computeDomain"] + (
        ["nvidia.com/gpu.clique"] if on else []
    )
