"""One timed ComputeDomain on a started control plane (:func:`run`), for
``python -m bench.compute_domain`` and its test."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench.compute_domain.nodes import (
    BENCH_LABEL,
    DRIVER_NS,
    TEMPLATE,
    WORK_NS,
    NodePlayer,
    node_slice,
    workload_pod,
)
from dra_driver.computedomain import names
from dra_driver.computedomain.controller.informers import Informer
from dra_driver.computedomain.controller.kubeapi import ControllerApi, Resource
from dra_driver.devcluster import Cluster
from dra_driver.plugin import kubeauth

ROOT = Path(__file__).resolve().parents[2]
CD_API = f"/apis/{names.API_GROUP}/{names.API_VERSION}"
RESOURCE_API = "/apis/resource.k8s.io/v1"
CLK_TCK = os.sysconf("SC_CLK_TCK")
WRITES = frozenset({"POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"})
CONTROLLER_RESOURCES = (
    "computedomains",
    "computedomains/status",
    "computedomaincliques",
    "daemonsets",
    "resourceclaimtemplates",
)


def install(cluster: Cluster, prefix: str) -> None:
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
    cluster.create_namespace(prefix + DRIVER_NS)
    cluster.create_namespace(prefix + WORK_NS)


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


def cpu_seconds(pids: dict[str, int | None]) -> dict[str, float]:
    """User+system CPU seconds of each live process so far (``/proc/<pid>/stat``)."""
    out: dict[str, float] = {}
    for name, pid in pids.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, TypeError):
            continue
        out[name] = (int(fields[11]) + int(fields[12])) / CLK_TCK
    return out


def run(cluster: Cluster, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One timed domain on ``cluster``; every name starts with ``args.prefix``."""
    p = args.prefix
    driver_ns, work_ns = p + DRIVER_NS, p + WORK_NS
    install(cluster, p)
    nodes = [f"{p}cd-{i:04d}" for i in range(args.nodes)]
    cliques = {
        n: f"5b4f6e2a-0000-4000-8000-0000000000aa.{i // args.clique_size}"
        for i, n in enumerate(nodes)
    }
    with ThreadPoolExecutor(16) as pool:
        list(
            pool.map(lambda n: cluster.create_node(n, {BENCH_LABEL: p.strip("-_.") or "cd"}), nodes)
        )
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
                f"--namespace={driver_ns}",
                "--image=img:bench",
                f"--workers={args.controller_workers}",
                f"--daemon-priority-class={args.daemon_priority_class}",
            ],
            stdout=out,
            stderr=out,
            env=env,
        )
    api = ControllerApi(kubeauth.kubeconfig(str(cluster.kubeconfig)), pool_size=32)
    player: NodePlayer | None = None
    claims: Informer | None = None
    try:
        time.sleep(2.0)  # the controller's caches (its import and lists)
        pids = {c.name: c.pid for c in cluster.components}
        pids |= {"controller": controller.pid, "bench": os.getpid()}
        cpu_before = cpu_seconds(pids)
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
        uid = cluster.rest.create(f"{CD_API}/namespaces/{work_ns}/{names.DOMAIN_PLURAL}", domain)[
            "metadata"
        ]["uid"]
        player = NodePlayer(
            cluster, api, uid, cliques.__getitem__, args.workers, namespaces=(driver_ns, work_ns)
        )
        player.start()
        claims = Informer(
            api, Resource(RESOURCE_API, "resourceclaims", True), namespace=work_ns,
            on_change=lambda _: None, resync_s=3600,
        )  # fmt: skip
        claims.start()
        marks: dict[str, float] = {}
        template = f"{RESOURCE_API}/namespaces/{work_ns}/resourceclaimtemplates/{TEMPLATE}"
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
                        f"/api/v1/namespaces/{work_ns}/pods",
                        workload_pod(i, p.strip("-_.") or "cd"),
                    ),
                    range(args.nodes),
                )
            )
        marks["pods_created"] = time.monotonic() - t0
        deadline = t0 + args.timeout
        while time.monotonic() < deadline and not {"claims", "daemons", "domain"} <= marks.keys():
            now = time.monotonic() - t0
            for what, count in player.progress().items():
                if what not in marks and count == args.nodes:
                    marks[what] = now
            if "claims" not in marks:
                allocated = sum(1 for c in claims.items() if c.get("status", {}).get("allocation"))
                if allocated == args.nodes:
                    marks["claims"] = now
            if "daemons" not in marks:
                found = cluster.rest.get(f"{CD_API}/namespaces/{driver_ns}/{names.CLIQUE_PLURAL}")
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
                    f"{CD_API}/namespaces/{work_ns}/{names.DOMAIN_PLURAL}/imex-job"
                ).get("status", {})
                if status.get("status") == "Ready" and len(status.get("nodes", [])) == args.nodes:
                    marks["domain"] = now
            time.sleep(0.25)
        time.sleep(1.0)  # writes still in flight
        after = request_counts(cluster)
        cpu_after = cpu_seconds(pids)
    finally:
        if player is not None:
            player.stop()
        if claims is not None:
            claims.stop()
        api.close()
        controller.terminate()
        controller.wait(30)
    stages = {
        what: [round(min(ts) - t0, 2), round(max(ts) - t0, 2)] if ts else None
        for what, ts in (player.times.items() if player is not None else ())
    }
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
        "stages_s": stages,
        "cpu_s": {k: round(v - cpu_before.get(k, 0.0), 1) for k, v in sorted(cpu_after.items())},
        "client_qps": cluster.options.client_qps,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
