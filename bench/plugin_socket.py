"""What the benchmarks that act as the kubelet on the shipped plugin's socket share
(:mod:`bench.prepare_socket`, :mod:`bench.share_prepare`, :mod:`bench.slot_prepare`):
the node, claims allocated as the scheduler records them, the plugin started as a host
process, timed gRPC calls, and the figures. Heavy imports (gRPC, the dev cluster) wait
for the first call, so ``--help`` stays quick.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

DRIVER = "gpu.nvidia.com"


def summary(ms: list[float], digits: int = 1) -> dict[str, float]:
    """Count, median and p99 of ``ms``, rounded to ``digits``."""
    ordered = sorted(ms)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {
        "n": len(ms),
        "p50_ms": round(statistics.median(ms), digits),
        "p99_ms": round(p99, digits),
    }


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise SystemExit(f"no VmRSS for {pid}")


def cpu_ms(pid: int) -> float:
    """User + system CPU time of the process itself (not its children), ms."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def bench_node(cluster: Any, node_name: str, ns: str) -> Path:
    """The shipped RBAC, the node, its namespace; the node-bound kubeconfig."""
    from tests.plugin.clusterkit import apply_rbac, node_bound_kubeconfig

    apply_rbac(cluster)
    node = cluster.create_node(node_name)
    kubeconfig: Path = node_bound_kubeconfig(cluster, node)
    cluster.create_namespace(ns)
    return kubeconfig


def allocated_claim(
    cluster: Any,
    ns: str,
    name: str,
    exactly: dict[str, Any],
    results: list[dict[str, Any]],
    config: list[dict[str, Any]] | None = None,
) -> str:
    """A claim with one request ``gpu`` (``exactly``), its allocation (``results``, and
    ``config`` when given) written as the scheduler would; its UID."""
    obj = cluster.apply(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
        }
    )
    allocation: dict[str, Any] = {"devices": {"results": results}}
    if config is not None:
        allocation["devices"]["config"] = config
    obj["status"] = {"allocation": allocation}
    cluster.rest.request(
        "PUT", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}/status", obj
    )
    return str(obj["metadata"]["uid"])


class Kubelet:
    """Timed prepare/unprepare of one claim at a time over the plugin's socket."""

    def __init__(self, sock: Path, ns: str) -> None:
        import grpc

        from dra_driver.plugin._proto import dra_v1_pb2, dra_v1_pb2_grpc

        self._pb = dra_v1_pb2
        self._stub = dra_v1_pb2_grpc.DRAPluginStub(grpc.insecure_channel(f"unix:{sock}"))
        self._ns = ns

    def call(self, kind: str, claim: tuple[str, str]) -> float:
        """``kind`` ("prepare" or "unprepare") of ``claim`` (name, UID), ms; a claim's
        error ends the benchmark."""
        ref = self._pb.Claim(namespace=self._ns, name=claim[0], uid=claim[1])
        start = time.perf_counter()
        if kind == "prepare":
            resp: Any = self._stub.NodePrepareResources(
                self._pb.NodePrepareResourcesRequest(claims=[ref]), timeout=45
            )
        else:
            resp = self._stub.NodeUnprepareResources(
                self._pb.NodeUnprepareResourcesRequest(claims=[ref]), timeout=45
            )
        elapsed = (time.perf_counter() - start) * 1000
        if resp.claims[claim[1]].error:
            raise SystemExit(f"{kind} {claim[0]}: {resp.claims[claim[1]].error}")
        return elapsed


@contextmanager
def running_plugin(
    work: Path, node_name: str, kubeconfig: Path, flags: Sequence[str], ns: str, stop_s: float = 60
) -> Iterator[tuple[subprocess.Popen[bytes], Kubelet]]:
    """The shipped ``dra-driver kubelet-plugin`` (``flags`` beside the node's and the
    paths under ``work``), up to its socket; terminated on leaving."""
    plugins = work / "plugins"
    child = subprocess.Popen(
        [
            sys.executable, "-m", "dra_driver", "kubelet-plugin",
            f"--node-name={node_name}", f"--driver-name={DRIVER}", *flags,
            f"--host-root={work / 'host'}", f"--cdi-dir={work / 'cdi'}",
            f"--state-dir={work / 'state'}", f"--kubelet-registry-dir={work / 'registry'}",
            f"--kubelet-plugins-dir={plugins}", f"--kubeconfig={kubeconfig}",
        ],
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        sock = plugins / DRIVER / "dra.sock"
        deadline = time.monotonic() + 60
        while not sock.exists():
            if time.monotonic() > deadline or child.poll() is not None:
                raise SystemExit("plugin did not start")
            time.sleep(0.1)
        yield child, Kubelet(sock, ns)
    finally:
        child.terminate()
        child.wait(timeout=stop_s)


def finish(report: dict[str, Any], work: Path) -> int:
    """The report, with the load average, printed; ``work`` removed (a failed run, which
    does not get here, keeps it: its logs). The exit status."""
    report["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(report, indent=2))
    shutil.rmtree(work, ignore_errors=True)
    return 0
