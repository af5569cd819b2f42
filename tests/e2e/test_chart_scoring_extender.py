"""The chart's scoring extender: off by default; when enabled, a Deployment whose
settings reach the real command, a Service on its port (what kube-scheduler's
urlPrefix names), and RBAC that only lists and watches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.helm import CHART, build_helm, render, run_helm

SCHEDULER_FILE = (
    Path(__file__).resolve().parents[2] / "deploy" / "scheduler" / "scoring-extender.yaml"
)


@pytest.fixture(scope="module")
def helm() -> Path:
    return build_helm()


def _named(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [
        o for o in objs if o["kind"] == kind and "scoring-extender" in o["metadata"]["name"]
    ]
    return found


def test_off_by_default(helm: Path) -> None:
    assert not [o for o in render(helm) if "scoring-extender" in o["metadata"]["name"]]


def test_enabled_it_serves_where_the_shipped_scheduler_config_points(helm: Path) -> None:
    from dra_driver.cli import build_parser

    objs = render(helm, "--set", "scoringExtender.enabled=true", "--set",
                  "scoringExtender.port=9090", "--set", "image.tag=2.0")  # fmt: skip
    pod = _named(objs, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    args = build_parser(environ=env).parse_args(container["args"])
    assert args.command == "scoring-extender"
    assert args.bind_address == "0.0.0.0:9090" and args.driver == "gpu.nvidia.com"
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    service = _named(objs, "Service")
    assert service["spec"]["ports"][0]["port"] == 9090
    assert container["ports"][0]["containerPort"] == 9090
    assert pod["serviceAccountName"] == _named(objs, "ServiceAccount")["metadata"]["name"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    # The shipped scheduler file names this Service for release dra-driver, default port.
    default = render(helm, "--set", "scoringExtender.enabled=true")
    name = _named(default, "Service")["metadata"]["name"]
    (entry,) = yaml.safe_load(SCHEDULER_FILE.read_text())["extenders"]
    assert entry["urlPrefix"] == f"http://{name}.dra-driver.svc:8888"
    assert entry["ignorable"] is True and entry["nodeCacheCapable"] is True


def test_rbac_only_reads(helm: Path) -> None:
    objs = render(helm, "--set", "scoringExtender.enabled=true")
    rules = _named(objs, "ClusterRole")["rules"]
    assert {v for r in rules for v in r["verbs"]} == {"list", "watch"}
    resources = {res for r in rules for res in r["resources"]}
    assert resources == {"nodes", "pods", "resourceslices", "resourceclaims"}
    binding = _named(objs, "ClusterRoleBinding")
    assert binding["subjects"][0]["name"] == _named(objs, "ServiceAccount")["metadata"]["name"]


def test_bad_values_are_refused(helm: Path) -> None:
    result = run_helm(helm, "template", "x", str(CHART), "--set", "scoringExtender.port=0")
    assert result.returncode != 0 and "port" in result.stderr
