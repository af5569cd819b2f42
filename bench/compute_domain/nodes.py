"""What the nodes of a ComputeDomain bench write, played here: their slices, the
workload's pods, and per node the label a channel prepare puts on the node and the
daemon pod's clique label, IP and Ready."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from dra_driver.computedomain import names
from dra_driver.computedomain.controller.informers import Informer
from dra_driver.computedomain.controller.kubeapi import ControllerApi, Obj, Resource
from dra_driver.devcluster import Cluster

DRIVER_NS = "dra-driver"
WORK_NS = "imex-job"
"""The driver's namespace and the job's, each behind ``--prefix``."""
TEMPLATE = "imex-job-channel"


def node_slice(node: str, clique: str) -> Obj:
    def device(name: str, kind: str) -> Obj:
        attributes = {
            "type": {"string": kind},
            "id": {"int": 0},
            names.CLIQUE_ATTRIBUTE: {"string": clique},
        }
        return {"name": name, "attributes": attributes}

    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-compute-domain"},
        "spec": {
            "driver": names.DRIVER_NAME,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                device(names.CHANNEL_DEVICE, "channel"),
                device(names.DAEMON_DEVICE, "daemon"),
            ],
        },
    }


BENCH_LABEL = "bench.dra-driver.io/compute-domain"
"""On the bench's nodes; its workload pods select it, so a channel-0 some other node
publishes (a real node, or another test's) never takes one of them."""


def workload_pod(i: int, run: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"rank-{i:04d}"},
        "spec": {
            "resourceClaims": [{"name": "imex", "resourceClaimTemplateName": TEMPLATE}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/pause:1",
                    "resources": {"claims": [{"name": "imex"}]},
                }
            ],
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": {BENCH_LABEL: run},
        },
    }


class NodePlayer:
    """Plays the nodes' writes as their triggers show up in two pod caches."""

    def __init__(
        self,
        cluster: Cluster,
        api: ControllerApi,
        uid: str,
        clique_of: Callable[[str], str],
        workers: int,
        *,
        namespaces: tuple[str, str] = (DRIVER_NS, WORK_NS),
    ) -> None:
        driver_ns, work_ns = namespaces
        self._driver_ns = driver_ns
        self._cluster = cluster
        self._uid = uid
        self._clique_of = clique_of
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="node")
        self._lock = threading.Lock()
        self._labelled: set[str] = set()
        self._ready: set[str] = set()
        self._seen: set[str] = set()
        self.times: dict[str, list[float]] = {
            "labelled": [],
            "daemon_created": [],
            "daemon_bound": [],
        }
        """When each node's label, daemon pod and bound daemon pod was first seen
        (``time.monotonic``): how the stages overlap."""
        pods = Resource("/api/v1", "pods", True)
        self.workload = Informer(
            api, pods, namespace=work_ns, on_change=self._workload, resync_s=3600
        )
        self.daemons = Informer(
            api,
            pods,
            namespace=driver_ns,
            on_change=self._daemon,
            label_selector=f"{names.DOMAIN_LABEL}={uid}",
            resync_s=3600,
        )

    def progress(self) -> dict[str, int]:
        """Nodes labelled, daemon pods seen, daemon pods seen bound (played Ready)."""
        with self._lock:
            labelled, bound = len(self._labelled), len(self._ready)
        return {
            "nodes_labelled": labelled,
            "daemon_pods_created": len(self.daemons.items()),
            "daemon_pods_bound": bound,
        }

    def start(self) -> None:
        self.workload.start()
        self.daemons.start()

    def stop(self) -> None:
        self.workload.stop()
        self.daemons.stop()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _once(self, done: set[str], node: str, stage: str = "") -> bool:
        with self._lock:
            if node in done:
                return False
            done.add(node)
            if stage:
                self.times[stage].append(time.monotonic())
            return True

    def _workload(self, pod: Obj) -> None:
        node = pod.get("spec", {}).get("nodeName")
        if node and self._once(self._labelled, node, "labelled"):
            label = {"metadata": {"labels": {names.DOMAIN_LABEL: self._uid}}}
            self._pool.submit(self._cluster.rest.merge_patch, f"/api/v1/nodes/{node}", label)

    def _daemon(self, pod: Obj) -> None:
        self._once(self._seen, pod["metadata"]["name"], "daemon_created")
        node = pod.get("spec", {}).get("nodeName")
        deleting = pod["metadata"].get("deletionTimestamp")
        if node and not deleting and self._once(self._ready, node, "daemon_bound"):
            self._pool.submit(self._kubelet, pod, node)

    def _kubelet(self, pod: Obj, node: str) -> None:
        path = f"/api/v1/namespaces/{self._driver_ns}/pods/{pod['metadata']['name']}"
        rest = self._cluster.rest
        rest.merge_patch(
            path, {"metadata": {"labels": {names.CLIQUE_LABEL: self._clique_of(node)}}}
        )
        number = int(node.rsplit("-", 1)[1])
        ip = f"10.{64 + number // 65536}.{number // 256 % 256}.{number % 256}"
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        rest.merge_patch(
            f"{path}/status",
            {
                "status": {
                    "phase": "Running",
                    "podIP": ip,
                    "podIPs": [{"ip": ip}],
                    "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
                }
            },
        )
