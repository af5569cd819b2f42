"""Kueue gang admission of GPU Jobs whose pods get their GPUs through our driver
(deploy/examples/kueue-gang.yaml), all real: Kueue's manager, CRDs and webhooks from
its pinned release (tests/go/kueue), our control plane with the Job, ResourceClaim and
quota controllers, and a real node (kubelet, containerd) where our plugin prepares
each pod's claim from the template.

Kueue counts the claims' devices through its DRA integration (``deviceClassMappings``:
our ``gpu.nvidia.com`` class as the quota resource ``nvidia.com/gpu``). With 6 GPUs of
quota, a Job of 4 one-GPU pods is admitted whole: its webhook suspended it at creation,
Kueue reserves 4 and unsuspends it, and all 4 pods run on 4 different GPUs. A second
such Job finds 2 GPUs of quota left and gets none: it stays suspended with no pod at
all (never 2 of its 4) until the first Job ends, and then runs in its turn."""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.demo.realgpu import RealGpuNode
from dra_driver.demo.stack import DEDICATED_TAINT, RESOURCE_API, load_examples
from dra_driver.devcluster import Cluster, wait_until
from dra_driver.devcluster.api import ApiError
from dra_driver.devcluster.kueue import KUEUE_API, QUEUE_LABEL, Kueue, KueueBuild, KueueError
from tests.e2e.helm import ROOT
from tests.e2e.scenarios import EXAMPLES, gpu_device_nodes

SELECTOR_LABEL = "dra-driver.test/kueue"
RELEASE = "/release"


@pytest.fixture(scope="module")
def kueue(cluster: Cluster, driver_objects: list[str], tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Kueue]:  # fmt: skip
    try:
        build = KueueBuild.find(ROOT)
    except KueueError as err:
        pytest.fail(str(err), pytrace=False)
    manager = Kueue(
        cluster=cluster, build=build, workdir=tmp_path_factory.mktemp("kueue"),
        device_class_mappings=[{"name": "nvidia.com/gpu", "deviceClassNames": ["gpu.nvidia.com"]}],
        namespace_selector={"matchLabels": {SELECTOR_LABEL: "true"}},
    )  # fmt: skip
    try:
        manager.start()
        yield manager
    finally:
        manager.stop()


def gang_objects(ns: str, suffix: str) -> dict[str, dict[str, Any]]:
    """The example's objects by kind, the cluster-wide ones renamed for this run."""
    objs = {o["kind"]: o for o in load_examples(EXAMPLES / "kueue-gang.yaml", ns)}
    assert list(objs) == ["ResourceFlavor", "ClusterQueue", "LocalQueue", "ResourceClaimTemplate",
                          "Job"]  # fmt: skip
    flavor, queue = objs["ResourceFlavor"], objs["ClusterQueue"]
    for obj in (flavor, queue):
        del obj["metadata"]["namespace"]
        obj["metadata"]["name"] += f"-{suffix}"
    (group,) = queue["spec"]["resourceGroups"]
    group["flavors"][0]["name"] = flavor["metadata"]["name"]
    objs["LocalQueue"]["spec"]["clusterQueue"] = queue["metadata"]["name"]
    return objs


def gang_job(
    example: dict[str, Any], name: str, node: RealGpuNode, release: Path
) -> dict[str, Any]:
    """The example's Job on our node, its pods holding their GPUs until ``release`` exists."""
    job = {**example, "metadata": {**example["metadata"], "name": name}}
    pod = job["spec"]["template"]["spec"]
    (worker,) = pod["containers"]
    worker["command"] = ["sh", "-c", f"ls /dev/nvidia[0-9]*; echo --done--; "
                         f"until [ -e {RELEASE}/go ]; do sleep 0.2; done"]  # fmt: skip
    worker["volumeMounts"] = [{"name": "release", "mountPath": RELEASE}]
    host = {"path": str(release), "type": "DirectoryOrCreate"}
    pod["volumes"] = [{"name": "release", "hostPath": host}]
    pod["nodeSelector"] = {"kubernetes.io/hostname": node.name}
    pod["tolerations"] = [{"key": DEDICATED_TAINT, "operator": "Equal", "value": node.name,
                           "effect": "NoSchedule"}]  # fmt: skip
    pod["terminationGracePeriodSeconds"] = 1
    return job


def workload(cluster: Cluster, ns: str, job: str) -> dict[str, Any] | None:
    """Kueue's Workload for a Job (owned by it)."""
    for wl in cluster.rest.get(f"{KUEUE_API}/namespaces/{ns}/workloads")["items"]:
        if any(o["name"] == job for o in wl["metadata"].get("ownerReferences", [])):
            return dict(wl)
    return None


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == kind:
            return dict(c)
    return {}


def job_pods(cluster: Cluster, ns: str, job: str) -> list[dict[str, Any]]:
    listed = cluster.rest.get(f"/api/v1/namespaces/{ns}/pods", {"labelSelector": f"job-name={job}"})
    return list(listed["items"])


def job_obj(cluster: Cluster, ns: str, job: str) -> dict[str, Any]:
    return cluster.rest.get(f"/apis/batch/v1/namespaces/{ns}/jobs/{job}")


def wait_running_gang(cluster: Cluster, ns: str, job: str, node: RealGpuNode) -> list[str]:
    """Wait for the Job's 4 pods to have printed their GPUs; returns the device nodes."""

    def printed() -> list[str] | None:
        pods = job_pods(cluster, ns, job)
        if len(pods) != 4:
            return None
        outs = [node.node.pod_log(ns, p["metadata"]["name"], "worker") for p in pods]
        if not all("--done--" in out for out in outs):
            return None
        return [d for out in outs for d in gpu_device_nodes(out)]

    def describe() -> str:
        pods = job_pods(cluster, ns, job)
        return f"{len(pods)} pods; " + "; ".join(
            node.describe_pod(ns, p["metadata"]["name"]) for p in pods[:2]
        )

    return wait_until(printed, timeout=180, interval=1, what=f"the 4 pods of {job} running",
                      describe=describe)  # fmt: skip


def test_a_job_of_four_gpu_pods_is_admitted_whole_or_waits(
    cluster: Cluster, cluster_namespace: str, real_a100: RealGpuNode, kueue: Kueue,
    tmp_path: Path,
) -> None:  # fmt: skip
    ns, node = cluster_namespace, real_a100
    cluster.apply({"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": ns, "labels": {SELECTOR_LABEL: "true"}}})  # fmt: skip
    objs = gang_objects(ns, secrets.token_hex(3))
    cluster.apply([objs[k] for k in ("ResourceFlavor", "ClusterQueue", "LocalQueue",
                                     "ResourceClaimTemplate")])  # fmt: skip
    queue_path = f"{KUEUE_API}/clusterqueues/{objs['ClusterQueue']['metadata']['name']}"
    wait_until(lambda: condition(cluster.rest.get(queue_path), "Active").get("status") == "True",
               timeout=60, what="ClusterQueue active", describe=kueue.log_tail)  # fmt: skip
    jobs = f"/apis/batch/v1/namespaces/{ns}/jobs"

    # The first Job: suspended by Kueue's webhook at creation, then admitted whole.
    release_a = tmp_path / "release-a"
    created = cluster.rest.create(jobs, gang_job(objs["Job"], "train-a", node, release_a))
    assert created["metadata"]["labels"][QUEUE_LABEL] == "training"
    assert created["spec"]["suspend"] is True, "Kueue's webhook did not suspend the Job"
    devices_a = wait_running_gang(cluster, ns, "train-a", node)
    assert len(set(devices_a)) == 4, devices_a  # one GPU each, four different GPUs
    wl_a = workload(cluster, ns, "train-a")
    assert condition(wl_a, "Admitted")["status"] == "True"
    (assignment,) = wl_a["status"]["admission"]["podSetAssignments"]
    assert assignment["count"] == 4 and assignment["resourceUsage"] == {"nvidia.com/gpu": "4"}
    assert not job_obj(cluster, ns, "train-a")["spec"]["suspend"]
    # Each pod's claim from the template, allocated on our node, prepared by our plugin.
    claims = cluster.rest.get(f"{RESOURCE_API}/namespaces/{ns}/resourceclaims")["items"]
    results = [r for c in claims for r in c["status"]["allocation"]["devices"]["results"]]
    assert len(results) == 4 and {r["pool"] for r in results} == {node.name}
    assert len({r["device"] for r in results}) == 4
    assert len(node.cdi_specs()) == 4

    # The second Job: 2 GPUs of quota left, it needs 4, so it gets none. No pod at all.
    release_b = tmp_path / "release-b"
    cluster.rest.create(jobs, gang_job(objs["Job"], "train-b", node, release_b))

    def refused() -> str:
        reserved = condition(workload(cluster, ns, "train-b"), "QuotaReserved")
        return str(reserved.get("message", "")) if reserved.get("status") == "False" else ""

    message = wait_until(refused, timeout=60, what="train-b's quota refused",
                         describe=kueue.log_tail)  # fmt: skip
    assert "insufficient unused quota for nvidia.com/gpu" in message, message
    for _ in range(10):  # and it stays so while the first Job holds the quota
        assert job_obj(cluster, ns, "train-b")["spec"]["suspend"] is True
        assert job_pods(cluster, ns, "train-b") == []
        time.sleep(0.5)
    usage = cluster.rest.get(queue_path)["status"]["flavorsReservation"]
    assert [r["total"] for f in usage for r in f["resources"]] == ["4"], usage

    # The first Job ends: its quota goes back and the second is admitted, whole.
    release_a.mkdir(parents=True, exist_ok=True)
    (release_a / "go").touch()
    wait_until(lambda: condition(job_obj(cluster, ns, "train-a"), "Complete").get("status")
               == "True", timeout=120, what="train-a complete")  # fmt: skip
    devices_b = wait_running_gang(cluster, ns, "train-b", node)
    assert len(set(devices_b)) == 4, devices_b
    assert condition(workload(cluster, ns, "train-b"), "Admitted")["status"] == "True"
    release_b.mkdir(parents=True, exist_ok=True)
    (release_b / "go").touch()
    wait_until(lambda: condition(job_obj(cluster, ns, "train-b"), "Complete").get("status")
               == "True", timeout=120, what="train-b complete")  # fmt: skip
    for job in ("train-a", "train-b"):
        with contextlib.suppress(ApiError):
            cluster.rest.request("DELETE", f"{jobs}/{job}", {"propagationPolicy": "Background"})
    wait_until(lambda: node.cdi_specs() == {}, timeout=60, what="all GPUs unprepared")
