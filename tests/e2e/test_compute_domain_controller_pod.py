"""The chart's ComputeDomain controller on a real node: its Deployment's pod runs from the
locally built image as the chart says (non-root, read-only root filesystem, /tmp an
emptyDir), reaches the API server in-cluster with its projected token under the chart's
RBAC, and sets a domain up and tears it down."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.computedomain import names
from dra_driver.computedomain.controller import objects
from dra_driver.devcluster import Cluster
from dra_driver.devcluster.binaries import NodeBinaries
from dra_driver.devcluster.node import NodeImage, RealNode
from tests.cluster.computedomains import (
    CD_API,
    RESOURCE_API,
    domain,
    get_or_none,
    install_crds,
    wait_for,
)
from tests.conftest import start_real_node
from tests.e2e.helm import CHART, run_helm


@pytest.fixture(scope="module")
def node(
    cluster: Cluster, node_binaries: NodeBinaries, plugin_image: tuple[Path, str]
) -> Iterator[RealNode]:
    real = start_real_node(cluster, node_binaries, prefix="cdc")
    try:
        real.import_image(NodeImage(*plugin_image))
        yield real
    finally:
        real.stop()
        real.remove_workdir()


def controller_objects(helm: Path, release: str, image: str, node: str) -> list[dict[str, Any]]:
    """The chart's compute-domain objects of one release, its pod pinned to ``node``."""
    repository, tag = image.rsplit(":", 1)
    result = run_helm(
        helm, "template", release, str(CHART), "--namespace", release,
        "--set", f"image.repository={repository}", "--set", f"image.tag={tag}",
        "--set", "image.pullPolicy=Never",
        "--set", "computeDomains.controller.tolerations[0].operator=Exists",
        "--set", f"computeDomains.controller.nodeSelector.kubernetes\\.io/hostname={node}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    docs = [o for o in yaml.safe_load_all(result.stdout) if o]
    return [o for o in docs if "compute-domain" in o["metadata"]["name"]
            and o["kind"] != "DeviceClass"]  # fmt: skip


def test_the_chart_s_controller_pod_sets_a_domain_up_and_tears_it_down(
    cluster: Cluster, cluster_namespace: str, node: RealNode, helm_binary: Path,
    plugin_image: tuple[Path, str],
) -> None:  # fmt: skip
    install_crds(cluster)
    release = f"cdc-{secrets.token_hex(3)}"
    cluster.create_namespace(release)
    objs = controller_objects(helm_binary, release, plugin_image[1], node.name)
    (deployment,) = [o for o in objs if o["kind"] == "Deployment"]
    # The test control plane runs no deployment or replica-set controller: the
    # Deployment's pod template is created as the pod a ReplicaSet would make.
    cluster.apply([o for o in objs if o["kind"] != "Deployment"])
    template = deployment["spec"]["template"]
    cluster.rest.create(f"/api/v1/namespaces/{release}/pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {**template["metadata"], "name": "compute-domain-controller"},
        "spec": template["spec"],
    })  # fmt: skip
    pods = f"/api/v1/namespaces/{release}/pods"
    selector = {"labelSelector": "app.kubernetes.io/component=compute-domain-controller"}

    def running() -> dict[str, Any] | None:
        for pod in cluster.rest.get(pods, selector)["items"]:
            conditions = pod.get("status", {}).get("conditions") or []
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                return dict(pod)
        return None

    try:
        try:
            pod = wait_for(running, what="the controller pod Ready", timeout=120)
        except TimeoutError:
            states = [(p["metadata"]["name"], p.get("spec", {}).get("nodeName"), p.get("status"))
                      for p in cluster.rest.get(pods, selector)["items"]]  # fmt: skip
            pytest.fail(f"controller pod not Ready: {states}\n{node.log_tails(30)}")
        assert pod["spec"]["nodeName"] == node.name
        assert pod["spec"]["securityContext"]["runAsUser"] == 65532
        path = f"{CD_API}/namespaces/{cluster_namespace}/{names.DOMAIN_PLURAL}/job"
        cluster.rest.create(f"{CD_API}/namespaces/{cluster_namespace}/{names.DOMAIN_PLURAL}",
                            domain("job", "job-channel"))  # fmt: skip
        uid = cluster.rest.get(path)["metadata"]["uid"]
        ds_path = f"/apis/apps/v1/namespaces/{release}/daemonsets/{objects.daemonset_name(uid)}"
        ds = wait_for(lambda: get_or_none(cluster, ds_path), what="the domain's DaemonSet")
        pod_spec = ds["spec"]["template"]["spec"]
        assert pod_spec["containers"][0]["image"] == plugin_image[1]
        assert pod_spec["serviceAccountName"] == f"{release}-dra-driver-compute-domain-daemon"
        template = (
            f"{RESOURCE_API}/namespaces/{cluster_namespace}/resourceclaimtemplates/job-channel"
        )
        assert wait_for(lambda: get_or_none(cluster, template), what="the workload template")
        wait_for(lambda: (cluster.rest.get(path).get("status") or {}).get("status") == "NotReady",
                 what="the domain's status")  # fmt: skip
        cluster.rest.delete(path)
        wait_for(lambda: get_or_none(cluster, path) is None, what="the domain gone", timeout=90)
        assert get_or_none(cluster, ds_path) is None
    finally:
        cluster.rest.delete(f"{pods}/compute-domain-controller")
