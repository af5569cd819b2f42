"""Issue 44's two-node job on real components: two kubelet + containerd nodes (emulated
``hgx-h100-fabric``, one clique, each node its own pod subnet so daemon IPs differ), the
chart's plugin DaemonSet pod on each (both releases in one driver namespace, as one
cluster's nodes share it), and the chart's ComputeDomain controller as a pod on the first
node. Nothing plays the controller's part: our example manifest (a ComputeDomain and two
pods claiming from its template) is applied as a user would, the controller makes the
template and the DaemonSet, and the DaemonSet controller and scheduler place the daemons.

The test control plane runs no Deployment or ReplicaSet controller, so the controller's
pod is the chart's Deployment pod template created as the pod a ReplicaSet would make
(as in test_compute_domain_controller_pod)."""

from __future__ import annotations

import ipaddress
import json
import secrets
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from dra_driver.computedomain.names import (
    CLIQUE_LABEL,
    DOMAIN_LABEL,
    DOMAIN_PLURAL,
    DRIVER_NAME,
    GPU_CLIQUE_LABEL,
)
from dra_driver.demo.realgpu import keep_running
from dra_driver.demo.realgpupod import RealGpuNodePod
from dra_driver.demo.stack import DEDICATED_TAINT, load_examples
from dra_driver.devcluster import ApiError, Cluster, wait_until
from dra_driver.devcluster.binaries import NodeBinaries
from dra_driver.emulation.imextools import read_record
from tests.cluster.computedomains import CD_API, RESOURCE_API, get_or_none, install_crds
from tests.e2e.helm import ROOT, chart_pod_node

EXAMPLE = ROOT / "deploy" / "examples" / "compute-domain.yaml"
SUBNETS = ("10.88.1.0/24", "10.88.2.0/24")
CLIQUE = "8f3a2c61-5d0e-4b7a-9c1e-2f6d8b4a0c17.7"
"""``hgx-h100-fabric``'s ``<clusterUUID>.<cliqueId>``: both nodes in one clique."""
CONTROLLER_POD = "compute-domain-controller"
WAIT = 180.0


@pytest.fixture(scope="module")
def cd_nodes(
    cluster: Cluster,
    driver_objects: list[str],
    node_binaries: NodeBinaries,
    helm_binary: Path,
    plugin_image: tuple[Path, str],
) -> Iterator[tuple[RealGpuNodePod, RealGpuNodePod]]:
    install_crds(cluster)
    namespace = f"cd2-{secrets.token_hex(3)}"
    cluster.create_namespace(namespace)
    with ExitStack() as stack:
        a, b = (
            stack.enter_context(chart_pod_node(
                cluster, node_binaries, helm_binary, plugin_image, "hgx-h100-fabric",
                prefix=f"cd{i}", namespace=namespace, pod_subnet=subnet))
            for i, subnet in enumerate(SUBNETS)
        )  # fmt: skip
        yield a, b


@pytest.fixture(scope="module")
def controller(cluster: Cluster, cd_nodes: tuple[RealGpuNodePod, RealGpuNodePod]) -> Iterator[str]:
    """The chart's controller pod on the first node; yields the driver namespace."""
    a = cd_nodes[0]
    a.values.update({
        "computeDomains.controller.tolerations[0].operator": "Exists",
        r"computeDomains.controller.nodeSelector.kubernetes\.io/hostname": a.name,
    })  # fmt: skip
    (deployment,) = [o for o in a.render() if o["kind"] == "Deployment"]
    cluster.apply(deployment)
    template = deployment["spec"]["template"]
    pods = f"/api/v1/namespaces/{a.namespace}/pods"
    cluster.rest.create(pods, {"apiVersion": "v1", "kind": "Pod",
                               "metadata": {**template["metadata"], "name": CONTROLLER_POD},
                               "spec": template["spec"]})  # fmt: skip
    try:
        wait_until(lambda: a.pod_ready(a.pod(a.namespace, CONTROLLER_POD)), timeout=WAIT,
                   what="the controller pod Ready",
                   describe=lambda: a.describe_pod(a.namespace, CONTROLLER_POD))  # fmt: skip
        yield a.namespace
    finally:
        a.delete_pod(a.namespace, CONTROLLER_POD)


def on_these_nodes(obj: dict[str, Any], nodes: list[str]) -> dict[str, Any]:
    """The example's pod, allowed onto the two test nodes only (the control plane is
    shared; the nodes are tainted for that): which one is the scheduler's choice. The
    example's own node affinity (nvidia.com/gpu.clique Exists, as NVIDIA's examples
    select nodes; our plugin sets that label) stays: each term gets the hostname too."""
    copy: dict[str, Any] = json.loads(json.dumps(obj))
    if copy["kind"] == "Pod":
        spec = copy["spec"]
        spec["tolerations"] = [{"key": DEDICATED_TAINT, "operator": "Exists"}]
        here = {"key": "kubernetes.io/hostname", "operator": "In", "values": nodes}
        required = spec["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]
        assert any(e["key"] == GPU_CLIQUE_LABEL for t in required["nodeSelectorTerms"]
                   for e in t["matchExpressions"])  # fmt: skip
        for term in required["nodeSelectorTerms"]:
            term["matchExpressions"].append(here)
    return copy


class Job:
    """What the test watches of one domain across both nodes."""

    def __init__(self, cluster: Cluster, nodes: tuple[RealGpuNodePod, ...], ns: str,
                 driver_ns: str) -> None:  # fmt: skip
        self.cluster, self.ns, self.driver_ns = cluster, ns, driver_ns
        self.nodes = {n.name: n for n in nodes}
        self.uid = ""
        self.t0 = time.monotonic()

    @property
    def domain_path(self) -> str:
        return f"{CD_API}/namespaces/{self.ns}/{DOMAIN_PLURAL}/two-node-job"

    def node_label(self, node: str) -> str | None:
        labels = self.cluster.rest.get(f"/api/v1/nodes/{node}")["metadata"].get("labels") or {}
        return labels.get(DOMAIN_LABEL)

    def daemons(self) -> dict[str, dict[str, Any]]:
        """The domain's daemon pods by node (the ones that have a node and an IP)."""
        listed = self.cluster.rest.get(f"/api/v1/namespaces/{self.driver_ns}/pods",
                                       {"labelSelector": f"{DOMAIN_LABEL}={self.uid}"})  # fmt: skip
        return {p["spec"]["nodeName"]: p for p in listed["items"]
                if p["spec"].get("nodeName") and p.get("status", {}).get("podIP")
                and not p["metadata"].get("deletionTimestamp")}  # fmt: skip

    def clique(self) -> list[dict[str, Any]]:
        path = f"{CD_API}/namespaces/{self.driver_ns}/computedomaincliques/{self.uid}.{CLIQUE}"
        return list((get_or_none(self.cluster, path) or {}).get("daemons") or [])

    def nodes_file(self, node: str) -> list[str] | None:
        path = self.domain_dir(node) / "nodes_config.cfg"
        return path.read_text().split() if path.exists() else None

    def domain_dir(self, node: str) -> Path:
        kubelet_root = self.nodes[node].node.paths.kubelet_root
        return kubelet_root / "plugins" / DRIVER_NAME / "domains" / self.uid

    def imex_peers(self, node: str) -> list[str]:
        """The peers ``nvidia-imex`` on ``node`` last read (start or SIGUSR1)."""
        record = self.nodes[node].host_root / "emulation" / "imex.jsonl"
        told = [e for e in read_record(record) if e.get("event") in ("started", "reloaded")]
        return [p["host"] for p in told[-1]["peers"]] if told else []

    def peers_agree(self) -> list[str] | None:
        """Both daemons listed in the clique with distinct indices, and every node's
        nodes file and ``nvidia-imex`` holding exactly those IPs in index order."""
        daemons = self.daemons()
        listed = sorted((d["index"], d["ipAddress"], d["nodeName"]) for d in self.clique())
        if {n for _, _, n in listed} != set(self.nodes) or len(listed) != 2:
            return None
        if [i for i, _, _ in listed] != [0, 1]:
            return None
        ips = [ip for _, ip, _ in listed]
        if any(daemons.get(n, {}).get("status", {}).get("podIP") != ip for _, ip, n in listed):
            return None  # a daemon's entry is from an earlier pod
        for node in self.nodes:
            if self.nodes_file(node) != ips or self.imex_peers(node) != ips:
                return None
        return ips

    def waiting(self, pod: str) -> bool:
        """The workload pod is still ContainerCreating (its channel not prepared)."""
        status = self.cluster.rest.get(f"/api/v1/namespaces/{self.ns}/pods/{pod}")["status"]
        states = [s.get("state", {}) for s in status.get("containerStatuses") or []]
        return not any("running" in s or "terminated" in s for s in states)

    def domain_status(self) -> str:
        return str((self.cluster.rest.get(self.domain_path).get("status") or {}).get("status"))

    def describe(self) -> str:
        lines = [f"domain: {json.dumps(get_or_none(self.cluster, self.domain_path))[:600]}",
                 f"clique: {self.clique()}"]  # fmt: skip
        for name, node in self.nodes.items():
            lines.append(f"--- {name}: nodes file {self.nodes_file(name)}, imex peers "
                         f"{self.imex_peers(name)}, label {self.node_label(name)}")  # fmt: skip
            for ns in (self.ns, self.driver_ns):
                for pod in self.cluster.rest.get(f"/api/v1/namespaces/{ns}/pods",
                                                 {"fieldSelector": f"spec.nodeName={name}"}
                                                 )["items"]:  # fmt: skip
                    lines.append(node.describe_pod(ns, pod["metadata"]["name"]))
            for container in sorted(node.node.paths.pod_logs.glob(f"{self.driver_ns}_*/*")):
                logs = sorted(container.glob("*.log"), key=lambda p: int(p.stem))
                tail = logs[-1].read_text(errors="replace").splitlines()[-8:] if logs else []
                lines.append(f"[{container.parent.name}/{container.name}]\n" + "\n".join(tail))
            state = self.domain_dir(name) / "config.cfg.state"
            lines.append(f"[{state}] {state.read_text() if state.exists() else 'absent'}")
            record = node.host_root / "emulation" / "imex.jsonl"
            lines.append(f"[{record}] {read_record(record)[-4:]}")
        return "\n".join(lines)

    def wait(self, check: Any, what: str) -> Any:
        found = wait_until(check, timeout=WAIT, what=what, describe=self.describe)
        print(f"{time.monotonic() - self.t0:6.1f} s  {what}")  # the phases' timings
        return found

    def force_delete_daemon(self, node: str) -> str:
        """``kubectl delete --force --grace-period=0`` of the node's daemon pod; its UID."""
        pod = self.daemons()[node]
        self.cluster.rest.request(
            "DELETE", f"/api/v1/namespaces/{self.driver_ns}/pods/{pod['metadata']['name']}",
            {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})  # fmt: skip
        return str(pod["metadata"]["uid"])

    def replaced(self, node: str, old_uid: str) -> bool:
        pod = self.daemons().get(node)
        return pod is not None and pod["metadata"]["uid"] != old_uid


def ready(pod: dict[str, Any]) -> bool:
    return RealGpuNodePod.pod_ready(pod)


def hold_file(node: RealGpuNodePod) -> Path:
    """The emulated IMEX's switch: while it exists ``nvidia-imex-ctl -q`` says NOT_READY."""
    hold = node.host_root / "emulation" / "imex.jsonl.imex.hold"
    hold.parent.mkdir(parents=True, exist_ok=True)
    return hold


def channel_line(out: str) -> str:
    (line,) = [w for w in out.splitlines() if w.endswith(" channel0")]
    return line


@pytest.mark.timeout(1200)  # two real nodes on a loaded 2-core machine
def test_two_pod_job_in_one_domain_across_two_real_nodes(
    cluster: Cluster,
    cluster_namespace: str,
    cd_nodes: tuple[RealGpuNodePod, RealGpuNodePod],
    controller: str,
) -> None:
    ns, names = cluster_namespace, [n.name for n in cd_nodes]
    job = Job(cluster, cd_nodes, ns, controller)
    for node in cd_nodes:
        hold_file(node).touch()  # no IMEX quorum yet on either node
    objs = [on_these_nodes(o, names) for o in load_examples(EXAMPLE, ns)]
    (domain,) = [o for o in objs if o["kind"] == "ComputeDomain"]
    pods = keep_running([o for o in objs if o["kind"] == "Pod"])
    workloads = [p["metadata"]["name"] for p in pods]
    assert len(workloads) == 2
    job.uid = cluster.rest.create(f"{CD_API}/namespaces/{ns}/{DOMAIN_PLURAL}",
                                  domain)["metadata"]["uid"]  # fmt: skip
    template = f"{RESOURCE_API}/namespaces/{ns}/resourceclaimtemplates/two-node-job-channel"
    job.wait(lambda: get_or_none(cluster, template), "the controller's workload template")
    cluster.apply(pods)
    try:
        # One channel 0 per node: the scheduler puts the two pods on the two nodes; each
        # prepare labels its node, the DaemonSet follows the labels.
        placed = job.wait(lambda: {cluster.rest.get(f"/api/v1/namespaces/{ns}/pods/{p}")
                                   ["spec"].get("nodeName") for p in workloads} == set(names)
                          or None, "the two pods on the two nodes")  # fmt: skip
        assert placed
        job.wait(lambda: all(job.node_label(n) == job.uid for n in names), "both nodes labelled")
        ips = job.wait(job.peers_agree, "both daemons' peers: two IPs, indices 0 and 1")
        for ip, subnet in zip(sorted(ips, key=ipaddress.IPv4Address), SUBNETS, strict=True):
            assert ipaddress.IPv4Address(ip) in ipaddress.IPv4Network(subnet)
        daemons = job.daemons()
        assert {p["metadata"]["labels"][CLIQUE_LABEL] for p in daemons.values()} == {CLIQUE}
        assert not any(ready(p) for p in daemons.values())  # READY withheld
        assert all(job.waiting(p) for p in workloads)
        assert job.domain_status() == "NotReady"

        # A daemon force-deleted before quorum: the DaemonSet makes another; the clique
        # and both nodes' files follow its new pod; the workload still waits.
        gone = job.force_delete_daemon(names[1])
        job.wait(lambda: job.replaced(names[1], gone), f"a new daemon pod on {names[1]}")
        job.wait(lambda: job.peers_agree() and job.replaced(names[1], gone),
                 "peers listing the new daemon")  # fmt: skip
        assert all(job.waiting(p) for p in workloads)

        # Quorum: both daemons Ready, both prepares answered (one through the new daemon).
        for node in cd_nodes:
            hold_file(node).unlink()
        job.wait(lambda: all(ready(p) for p in job.daemons().values()), "both daemons Ready")
        for pod in workloads:
            where = cluster.rest.get(f"/api/v1/namespaces/{ns}/pods/{pod}")["spec"]["nodeName"]
            out = job.nodes[where].run_pod(ns, pod, timeout=WAIT).containers["main"].stdout
            assert channel_line(out).startswith("crw"), out
            assert "509,   0" in channel_line(out), out  # char device 509:0
            print(f"{time.monotonic() - job.t0:6.1f} s  {pod} ran on {where}: {channel_line(out)}")
        job.wait(lambda: job.domain_status() == "Ready", "the domain Ready")

        # A daemon force-deleted under a running workload: it returns and is Ready again;
        # the workload's container is not touched.
        first = cluster.rest.get(f"/api/v1/namespaces/{ns}/pods/{workloads[0]}")
        node = first["spec"]["nodeName"]
        (before,) = first["status"]["containerStatuses"]
        gone = job.force_delete_daemon(node)
        job.wait(lambda: job.replaced(node, gone) and ready(job.daemons()[node]),
                 f"the daemon on {node} back and Ready")  # fmt: skip
        job.wait(job.peers_agree, "peers listing the returned daemon")
        job.wait(lambda: job.domain_status() == "Ready", "the domain Ready again")
        now = cluster.rest.get(f"/api/v1/namespaces/{ns}/pods/{workloads[0]}")
        (after,) = now["status"]["containerStatuses"]
        assert after["containerID"] == before["containerID"]
        assert after["restartCount"] == 0 and "running" in after["state"]
    finally:
        # As `kubectl delete -f compute-domain.yaml`: the domain and its pods at once.
        for pod in workloads:
            try:
                cluster.rest.delete(f"/api/v1/namespaces/{ns}/pods/{pod}")
            except ApiError as err:
                if err.status != 404:
                    raise
        try:
            cluster.rest.delete(job.domain_path)
        except ApiError as err:
            if err.status != 404:
                raise
        for pod in workloads:
            cd_nodes[0].delete_pod(ns, pod, timeout=WAIT)
        job.wait(lambda: get_or_none(cluster, job.domain_path) is None, "the domain gone")
    assert_nothing_left(job)


def assert_nothing_left(job: Job) -> None:
    """No label, pod, template, clique, claim or file of the domain on either node."""
    cluster, uid = job.cluster, job.uid
    selector = {"labelSelector": f"{DOMAIN_LABEL}={uid}"}
    job.wait(lambda: not cluster.rest.get(f"/api/v1/namespaces/{job.driver_ns}/pods",
                                          selector)["items"], "the daemon pods gone")  # fmt: skip
    for name in job.nodes:
        assert job.node_label(name) is None
    for path in (f"/apis/apps/v1/namespaces/{job.driver_ns}/daemonsets",
                 f"{RESOURCE_API}/namespaces/{job.driver_ns}/resourceclaimtemplates",
                 f"{RESOURCE_API}/namespaces/{job.ns}/resourceclaimtemplates",
                 f"{CD_API}/namespaces/{job.driver_ns}/computedomaincliques"):  # fmt: skip
        assert cluster.rest.get(path, selector)["items"] == [], path
    for ns in (job.ns, job.driver_ns):
        job.wait(lambda ns=ns: not cluster.rest.get(
            f"{RESOURCE_API}/namespaces/{ns}/resourceclaims", selector)["items"],
            f"the domain's claims in {ns} gone")  # fmt: skip
    for name, node in job.nodes.items():
        assert not job.domain_dir(name).exists()
        assert [p.name for p in node.cdi_dir.glob(f"k8s.{DRIVER_NAME}-*.json")] == []
