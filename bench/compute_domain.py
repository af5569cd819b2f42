"""``python -m bench.compute_domain``: one ComputeDomain across ``--nodes`` kubelet-less
nodes on the fleet bench's control plane (its client QPS for kube-scheduler and
kube-controller-manager), from the domain's creation to every workload claim allocated
and every node's IMEX daemon Ready in its clique object.

    python -m bench.compute_domain --nodes 16
    python -m bench.compute_domain --nodes 256 --clique-size 18 -o json

The real controller runs (``dra-driver compute-domain-controller``, its own process).
Every node publishes what the compute-domain kubelet plugin publishes (``channel-0``
and ``daemon-0`` with its clique); ``--nodes`` workload pods claim a channel from the
domain's template, so the scheduler places one per node. What the nodes would write is
played here, per node, as soon as its trigger is seen: a workload pod bound to a node
labels the node (the plugin's prepare), and a daemon pod bound to a node gets its clique
label (the daemon) and Ready with an IP (the kubelet). Writes and 409s are the API
server's own counts (``apiserver_request_total``, every client), and the controller's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench.fleet.run import CLIENT_BURST, CLIENT_QPS
from dra_driver.computedomain import names
from dra_driver.computedomain.controller.informers import Informer
from dra_driver.computedomain.controller.kubeapi import ControllerApi, Obj, Resource
from dra_driver.devcluster import Cluster, ClusterOptions, find_binaries
from dra_driver.plugin import kubeauth

ROOT = Path(__file__).resolve().parents[1]
CD_API = f"/apis/{names.API_GROUP}/{names.API_VERSION}"
RESOURCE_API = "/apis/resource.k8s.io/v1"
DRIVER_NS = "dra-driver"
WORK_NS = "imex-job"
TEMPLATE = "imex-job-channel"
WRITES = frozenset({"POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"})
CONTROLLER_RESOURCES = (
    "computedomains",
    "computedomains/status",
    "computedomaincliques",
    "daemonsets",
    "resourceclaimtemplates",
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.compute_domain", description=__doc__.split("\n")[0]
    )
    p.add_argument("--nodes", type=int, default=16, help="nodes in the domain (default 16)")
    p.add_argument(
        "--clique-size",
        type=int,
        default=18,
        help="nodes per NVLink clique (an NVL72 rack: 18) (default 18)",
    )
    p.add_argument("--workers", type=int, default=16, help="threads playing the nodes' writes")
    p.add_argument("--controller-workers", type=int, default=4)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for Ready")
    p.add_argument("-o", "--output", choices=("text", "json"), default="text")
    return p


def install(cluster: Cluster) -> None:
    for path in sorted((ROOT / "deploy" / "chart" / "crds").glob("*.yaml")):
        cluster.apply(yaml.safe_load(path.read_text()))
    for path in sorted((ROOT / "deploy" / "deviceclasses").glob("compute-domain-*.yaml")):
        cluster.apply(yaml.safe_load(path.read_text()))
    deadline = time.monotonic() + 60
    while True:
        try:
            cluster.rest.get(f"{CD_API}/{names.DOMAIN_PLURAL}")
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    cluster.create_namespace(DRIVER_NS)
    cluster.create_namespace(WORK_NS)


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


def workload_pod(i: int) -> Obj:
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
        },
    }


def request_counts(cluster: Cluster) -> dict[tuple[str, str, str], float]:
    """``apiserver_request_total`` by (verb, resource[/subresource], code)."""
    out: dict[tuple[str, str, str], float] = {}
    text = cluster.fetch("kube-apiserver", "/metrics").decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "apiserver_request_total":
                sub = s.labels.get("subresource", "")
                resource = s.labels.get("resource", "") + (f"/{sub}" if sub else "")
                key = (s.labels.get("verb", ""), resource, s.labels.get("code", ""))
                out[key] = out.get(key, 0.0) + s.value
    return out


class NodePlayer:
    """Plays the nodes' writes as their triggers show up in two pod caches."""

    def __init__(
        self,
        cluster: Cluster,
        api: ControllerApi,
        uid: str,
        clique_of: Callable[[str], str],
        workers: int,
    ) -> None:
        self._cluster = cluster
        self._uid = uid
        self._clique_of = clique_of
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="node")
        self._lock = threading.Lock()
        self._labelled: set[str] = set()
        self._ready: set[str] = set()
        pods = Resource("/api/v1", "pods", True)
        self.workload = Informer(
            api, pods, namespace=WORK_NS, on_change=self._workload, resync_s=3600
        )
        self.daemons = Informer(
            api,
            pods,
            namespace=DRIVER_NS,
            on_change=self._daemon,
            label_selector=f"{names.DOMAIN_LABEL}={uid}",
            resync_s=3600,
        )

    def start(self) -> None:
        self.workload.start()
        self.daemons.start()

    def stop(self) -> None:
        self.workload.stop()
        self.daemons.stop()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _once(self, done: set[str], node: str) -> bool:
        with self._lock:
            if node in done:
                return False
            done.add(node)
            return True

    def _workload(self, pod: Obj) -> None:
        node = pod.get("spec", {}).get("nodeName")
        if node and self._once(self._labelled, node):
            label = {"metadata": {"labels": {names.DOMAIN_LABEL: self._uid}}}
            self._pool.submit(self._cluster.rest.merge_patch, f"/api/v1/nodes/{node}", label)

    def _daemon(self, pod: Obj) -> None:
        node = pod.get("spec", {}).get("nodeName")
        if node and not pod["metadata"].get("deletionTimestamp") and self._once(self._ready, node):
            self._pool.submit(self._kubelet, pod, node)

    def _kubelet(self, pod: Obj, node: str) -> None:
        path = f"/api/v1/namespaces/{DRIVER_NS}/pods/{pod['metadata']['name']}"
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


def run(cluster: Cluster, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    install(cluster)
    nodes = [f"cd-{i:04d}" for i in range(args.nodes)]
    cliques = {
        n: f"5b4f6e2a-0000-4000-8000-0000000000aa.{i // args.clique_size}"
        for i, n in enumerate(nodes)
    }
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(cluster.create_node, nodes))
        list(
            pool.map(
                lambda n: cluster.rest.create(
                    f"{RESOURCE_API}/resourceslices", node_slice(n, cliques[n])
                ),
                nodes,
            )
        )
    log = work / "controller.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with log.open("wb") as out:
        controller = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dra_driver",
                "--log-format=json",
                "compute-domain-controller",
                f"--kubeconfig={cluster.kubeconfig}",
                f"--namespace={DRIVER_NS}",
                "--image=img:bench",
                f"--workers={args.controller_workers}",
            ],
            stdout=out,
            stderr=out,
            env=env,
        )
    api = ControllerApi(kubeauth.kubeconfig(str(cluster.kubeconfig)), pool_size=32)
    player: NodePlayer | None = None
    try:
        time.sleep(2.0)  # the controller's caches (its import and lists)
        before = request_counts(cluster)
        t0 = time.monotonic()
        domain = {
            "apiVersion": f"{names.API_GROUP}/{names.API_VERSION}",
            "kind": names.DOMAIN_KIND,
            "metadata": {"name": "imex-job"},
            "spec": {
                "numNodes": args.nodes,
                "channel": {"resourceClaimTemplate": {"name": TEMPLATE}},
            },
        }
        uid = cluster.rest.create(f"{CD_API}/namespaces/{WORK_NS}/{names.DOMAIN_PLURAL}", domain)[
            "metadata"
        ]["uid"]
        player = NodePlayer(cluster, api, uid, cliques.__getitem__, args.workers)
        player.start()
        marks: dict[str, float] = {}
        template = f"{RESOURCE_API}/namespaces/{WORK_NS}/resourceclaimtemplates/{TEMPLATE}"
        while "template" not in marks:
            try:
                cluster.rest.get(template)
                marks["template"] = time.monotonic() - t0
            except Exception:
                time.sleep(0.05)
        with ThreadPoolExecutor(16) as pool:
            list(
                pool.map(
                    lambda i: cluster.rest.create(
                        f"/api/v1/namespaces/{WORK_NS}/pods", workload_pod(i)
                    ),
                    range(args.nodes),
                )
            )
        marks["pods_created"] = time.monotonic() - t0
        deadline = t0 + args.timeout
        while time.monotonic() < deadline and not {"claims", "daemons", "domain"} <= marks.keys():
            now = time.monotonic() - t0
            if "claims" not in marks:
                claims = cluster.rest.get(f"{RESOURCE_API}/namespaces/{WORK_NS}/resourceclaims")
                allocated = [c for c in claims["items"] if c.get("status", {}).get("allocation")]
                if len(allocated) == args.nodes:
                    marks["claims"] = now
            if "daemons" not in marks:
                found = cluster.rest.get(f"{CD_API}/namespaces/{DRIVER_NS}/{names.CLIQUE_PLURAL}")
                ready = sum(
                    1
                    for c in found["items"]
                    for d in c.get("daemons") or []
                    if d.get("status") == "Ready"
                )
                if ready == args.nodes:
                    marks["daemons"] = now
            if "domain" not in marks:
                status = cluster.rest.get(
                    f"{CD_API}/namespaces/{WORK_NS}/{names.DOMAIN_PLURAL}/imex-job"
                ).get("status", {})
                if status.get("status") == "Ready" and len(status.get("nodes", [])) == args.nodes:
                    marks["domain"] = now
            time.sleep(0.25)
        time.sleep(1.0)  # writes still in flight
        after = request_counts(cluster)
    finally:
        if player is not None:
            player.stop()
        api.close()
        controller.terminate()
        controller.wait(30)
    diff = {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)}
    writes = {
        f"{verb} {res}": round(
            sum(v for (vb, rs, _), v in diff.items() if vb == verb and rs == res)
        )
        for (verb, res, _) in diff
        if verb in WRITES
    }
    conflicts = {
        f"{verb} {res}": round(v) for (verb, res, code), v in diff.items() if code == "409"
    }
    own = [
        json.loads(line)
        for line in log.read_text().splitlines()
        if line.startswith("{") and '"api writes"' in line
    ]
    return {
        "nodes": args.nodes,
        "cliques": len(set(cliques.values())),
        **{f"{k}_s": round(v, 2) for k, v in marks.items()},
        "ready": {"claims", "daemons", "domain"} <= marks.keys(),
        "api_writes": sum(writes.values()),
        "api_writes_by_resource": dict(sorted(writes.items())),
        "conflicts_409": sum(conflicts.values()),
        "conflicts_by_resource": conflicts,
        "controller_writes": own[-1]["writes"] if own else None,
        "controller_conflicts": own[-1]["conflicts"] if own else None,
        "controller_resources_writes": sum(
            v for k, v in writes.items() if k.split(" ", 1)[1] in CONTROLLER_RESOURCES
        ),
        "client_qps": cluster.options.client_qps,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    options = ClusterOptions(client_qps=CLIENT_QPS, client_burst=CLIENT_BURST)
    with (
        tempfile.TemporaryDirectory(prefix="dra-cd-bench-") as work,
        Cluster(find_binaries(), Path(work), options) as cluster,
    ):
        summary = run(cluster, args, Path(work))
    if args.output == "json":
        print(json.dumps(summary, indent=2))
    else:
        for key, value in summary.items():
            print(f"{key:28} {value}")
    return 0 if summary["ready"] else 1


if __name__ == "__main__":
    sys.exit(main())
