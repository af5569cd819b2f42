"""Benchmark: our kubelet plugin side by side with the Go reference plugin (not a test).

The reference is ``sigs.k8s.io/dra-example-driver`` v0.4.0,
``cmd/dra-example-kubeletplugin`` (built from Go modules by
``bench/build-reference-plugin.sh``), with 16 devices and its client-go rate
limit raised to 1000 QPS (the default 5 QPS would dominate). Ours is the shipped
``dra-driver kubelet-plugin`` on 16 emulated L4 GPUs. Both run against the same
real control plane (``dra_driver.devcluster``) with the same admin kubeconfig,
and one client in this process plays the kubelet for both: registration
(``GetInfo``, ``NotifyRegistrationStatus``) and ``v1.DRAPlugin`` calls on claims
whose ``status.allocation`` was written beforehand. Every prepare includes the
plugin's GET of the claim.

Trials alternate between the two plugins (ours, Go, ours, ...); each trial starts
the plugin fresh and measures: start to registration socket, start to all 16
devices in the API server, idle RSS, prepare of 1 claim and unprepare (p50 of 50),
16 concurrent prepares on 16 devices (p50 of 16 x 5), the API server's and etcd's
CPU per burst of 16 prepares and 16 unprepares (the 5 bursts and 2.5 s after them,
so calls a plugin defers count too), and CPU time per 1,000
prepare+unprepare cycles (from ``/proc/<pid>/stat``, over 300 cycles). The
figures are medians of the per-trial values; ratios are ours / Go. Ours runs as the
image runs it: bytecode compiled first, optimized, and ``PYTHONOPTIMIZE=2``
(:mod:`bench.bytecode`), and both plugins get the admin kubeconfig as JSON.
``--soak N`` then runs N prepare+unprepare cycles on ours alone and samples RSS,
open file descriptors and threads every N/10 cycles.

Run: ``.venv/bin/python -m bench.reference_plugin [--trials 10] [--soak 10000]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.bytecode import PLUGIN_ENV, compile_package

REPO = Path(__file__).resolve().parents[1]
DEVICES = 16
PROFILE = REPO / "bench" / "profiles" / "l4-x16.yaml"
CLK_TCK = os.sysconf("SC_CLK_TCK")
BURSTS = 5
BURST_SETTLE_S = 2.5


@dataclass
class Plugin:
    label: str
    driver: str
    node: str
    argv: Callable[[Path, Path], list[str]]
    env: dict[str, str] = field(default_factory=dict)


def ours(node: str) -> Plugin:
    def argv(work: Path, kubeconfig: Path) -> list[str]:
        return [sys.executable, "-m", "dra_driver", "kubelet-plugin", f"--node-name={node}",
                f"--emulate={PROFILE}", f"--host-root={work / 'host'}",
                f"--cdi-dir={work / 'cdi'}", f"--state-dir={work / 'state'}",
                f"--kubelet-registry-dir={work / 'registry'}",
                f"--kubelet-plugins-dir={work / 'plugins'}", f"--kubeconfig={kubeconfig}",
                "--rediscover-interval=0", "--log-level=warning"]  # fmt: skip

    return Plugin("ours", "gpu.nvidia.com", node, argv, dict(PLUGIN_ENV))


def reference(node: str, binary: Path) -> Plugin:
    def argv(work: Path, kubeconfig: Path) -> list[str]:
        return [str(binary), f"--node-name={node}", f"--num-devices={DEVICES}",
                f"--cdi-root={work / 'cdi'}",
                f"--kubelet-registrar-directory-path={work / 'registry'}",
                f"--kubelet-plugins-directory-path={work / 'plugins'}",
                f"--kubeconfig={kubeconfig}", "--kube-api-qps=1000",
                "--kube-api-burst=1000"]  # fmt: skip

    return Plugin("go", "gpu.example.com", node, argv)


# -- the fake kubelet ------------------------------------------------------------------


class Kubelet:
    """Registration and v1.DRAPlugin calls, exactly the same for both plugins."""

    def __init__(self, registration: Path) -> None:
        import grpc

        from dra_driver.plugin._proto import (
            dra_v1_pb2,
            dra_v1_pb2_grpc,
            pluginregistration_pb2,
            pluginregistration_pb2_grpc,
        )

        self._pb = dra_v1_pb2
        with grpc.insecure_channel(f"unix:{registration}") as ch:
            reg = pluginregistration_pb2_grpc.RegistrationStub(ch)
            info = reg.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=10)
            reg.NotifyRegistrationStatus(
                pluginregistration_pb2.RegistrationStatus(plugin_registered=True), timeout=10
            )
        self._channel = grpc.insecure_channel(f"unix:{info.endpoint}")
        self._stub = dra_v1_pb2_grpc.DRAPluginStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def prepare(self, claim: Any) -> float:
        start = time.perf_counter()
        resp = self._stub.NodePrepareResources(
            self._pb.NodePrepareResourcesRequest(claims=[claim]), timeout=45
        )
        took = (time.perf_counter() - start) * 1000
        if resp.claims[claim.uid].error or not resp.claims[claim.uid].devices:
            raise SystemExit(f"prepare failed: {resp.claims[claim.uid].error}")
        return took

    def unprepare(self, claim: Any) -> float:
        start = time.perf_counter()
        resp = self._stub.NodeUnprepareResources(
            self._pb.NodeUnprepareResourcesRequest(claims=[claim]), timeout=45
        )
        took = (time.perf_counter() - start) * 1000
        if resp.claims[claim.uid].error:
            raise SystemExit(f"unprepare failed: {resp.claims[claim.uid].error}")
        return took


# -- one trial -------------------------------------------------------------------------


def _proc_stat(pid: int) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return {
        "rss_mb": int(status.split("VmRSS:")[1].split()[0]) / 1024,
        "cpu_s": (int(fields[11]) + int(fields[12])) / CLK_TCK,
        "threads": sum(1 for _ in Path(f"/proc/{pid}/task").iterdir()),
        "fds": sum(1 for _ in Path(f"/proc/{pid}/fd").iterdir()),
    }


def _control_plane_cpu_s(cluster: Any) -> float:
    """CPU time of the API server and etcd so far: what the plugin's calls cost them."""
    total = 0.0
    for component in cluster.components:
        if component.name in ("kube-apiserver", "etcd") and component.pid:
            total += _proc_stat(component.pid)["cpu_s"]
    return total


def _slice_devices(cluster: Any, plugin: Plugin) -> int:
    selector = f"spec.nodeName={plugin.node},spec.driver={plugin.driver}"
    items = cluster.rest.get(
        "/apis/resource.k8s.io/v1/resourceslices", query={"fieldSelector": selector}
    ).get("items", [])
    return sum(len(s["spec"].get("devices") or []) for s in items)


def _delete_slices(cluster: Any, plugin: Plugin) -> None:
    """The previous trial's slices: without this, "start to all slices" of every trial
    after the first measured nothing (the old slices were already there)."""
    selector = f"spec.nodeName={plugin.node},spec.driver={plugin.driver}"
    cluster.rest.request(
        "DELETE", "/apis/resource.k8s.io/v1/resourceslices", query={"fieldSelector": selector}
    )
    deadline = time.monotonic() + 30
    while _slice_devices(cluster, plugin):
        if time.monotonic() > deadline:
            raise SystemExit(f"slices of {plugin.node} not deleted in 30 s")
        time.sleep(0.05)


def _wait(check: Callable[[], bool], proc: subprocess.Popen[bytes], what: str) -> float:
    start = time.perf_counter()
    while not check():
        if proc.poll() is not None:
            raise SystemExit(f"plugin exited while waiting for {what}")
        if time.perf_counter() - start > 60:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.001)
    return time.perf_counter()


def _fresh(work: Path) -> None:
    """Empty dirs, as on a node (the kubelet creates the two kubelet dirs)."""
    for d in ("registry", "plugins", "cdi", "state"):
        subprocess.run(["rm", "-rf", str(work / d)], check=True)
    for d in ("registry", "plugins"):
        (work / d).mkdir()


def trial(
    cluster: Any, plugin: Plugin, claims: list[Any], work: Path, cycles: int, kubeconfig: Path
) -> dict[str, Any]:
    _fresh(work)
    _delete_slices(cluster, plugin)
    registration = work / "registry" / f"{plugin.driver}-reg.sock"
    log = (work / f"{plugin.label}.log").open("ab")
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        plugin.argv(work, kubeconfig), stdout=log, stderr=subprocess.STDOUT,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("DRA_")}, **plugin.env},
    )  # fmt: skip
    try:
        socket_at = _wait(registration.exists, proc, "registration socket")
        slices_at = _wait(lambda: _slice_devices(cluster, plugin) == DEVICES, proc, "slices")
        kubelet = Kubelet(registration)
        single, concurrent = claims[DEVICES], claims[:DEVICES]
        for _ in range(20):  # warm up: connections, caches
            kubelet.prepare(single)
            kubelet.unprepare(single)
        time.sleep(2)
        idle = _proc_stat(proc.pid)
        prep, unprep = [], []
        for _ in range(50):
            prep.append(kubelet.prepare(single))
            unprep.append(kubelet.unprepare(single))
        par: list[float] = []
        control_plane = _control_plane_cpu_s(cluster)
        with ThreadPoolExecutor(DEVICES) as pool:
            for _ in range(BURSTS):
                par += pool.map(kubelet.prepare, concurrent)
                list(pool.map(kubelet.unprepare, concurrent))
        time.sleep(BURST_SETTLE_S)  # API calls a plugin defers past the bursts count too
        control_plane = _control_plane_cpu_s(cluster) - control_plane
        before = _proc_stat(proc.pid)  # threads now: after the bursts
        for _ in range(cycles):
            kubelet.prepare(single)
            kubelet.unprepare(single)
        after = _proc_stat(proc.pid)
        kubelet.close()
        signalled = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        exited = time.perf_counter()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    return {
        "start_to_socket_ms": (socket_at - t0) * 1000,
        "start_to_slices_ms": (slices_at - t0) * 1000,
        "idle_rss_mb": idle["rss_mb"],
        "prepare_1_p50_ms": statistics.median(prep),
        "unprepare_1_p50_ms": statistics.median(unprep),
        "prepare_16_concurrent_p50_ms": statistics.median(par),
        "cpu_s_per_1000_cycles": (after["cpu_s"] - before["cpu_s"]) * 1000 / cycles,
        "control_plane_cpu_ms_per_burst": control_plane * 1000 / BURSTS,
        "threads_idle": idle["threads"],
        "threads_after_bursts": before["threads"],
        "sigterm_to_exit_ms": (exited - signalled) * 1000,
    }


def soak(
    cluster: Any, plugin: Plugin, claim: Any, work: Path, cycles: int, kubeconfig: Path
) -> list[dict[str, Any]]:
    """RSS, fds and threads of ours every cycles/10 prepare+unprepare cycles."""
    _fresh(work)
    registration = work / "registry" / f"{plugin.driver}-reg.sock"
    with (work / "soak.log").open("ab") as log:
        proc = subprocess.Popen(plugin.argv(work, kubeconfig), stdout=log,
                                stderr=subprocess.STDOUT)  # fmt: skip
    try:
        _wait(registration.exists, proc, "registration socket")
        _wait(lambda: _slice_devices(cluster, plugin) == DEVICES, proc, "slices")
        kubelet = Kubelet(registration)
        samples = []
        step = max(1, cycles // 10)
        for done in range(cycles + 1):
            if done % step == 0:
                samples.append({"cycles": done, **_proc_stat(proc.pid)})
            if done < cycles:
                kubelet.prepare(claim)
                kubelet.unprepare(claim)
        kubelet.close()
        return samples
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


# -- claims ----------------------------------------------------------------------------


def json_kubeconfig(path: Path, out: Path) -> Path:
    """The admin kubeconfig as JSON, for both plugins: in a pod neither reads YAML (the
    in-cluster config), and our daemon reads a JSON kubeconfig without importing PyYAML."""
    import yaml

    out.write_text(json.dumps(yaml.safe_load(path.read_text())))
    out.chmod(0o600)
    return out


def make_claims(cluster: Any, plugin: Plugin, namespace: str) -> list[Any]:
    """17 allocated claims: one per device (concurrent round) and one more on gpu-0."""
    from dra_driver.plugin._proto import dra_v1_pb2

    out = []
    for i in range(DEVICES + 1):
        name = f"{plugin.label}-{i}"
        obj = cluster.apply({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "bench"}}]}},
        })  # fmt: skip
        obj["status"] = {"allocation": {"devices": {"results": [{
            "request": "gpu", "driver": plugin.driver, "pool": plugin.node,
            "device": f"gpu-{i % DEVICES}"}]}}}  # fmt: skip
        cluster.rest.request(
            "PUT",
            f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}/status",
            obj,
        )
        out.append(dra_v1_pb2.Claim(namespace=namespace, name=name, uid=obj["metadata"]["uid"]))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--cycles", type=int, default=300, help="cycles for the CPU figure")
    parser.add_argument("--soak", type=int, default=0, help="cycles of the soak run (ours)")
    args = parser.parse_args()

    compile_package(REPO)
    binary = Path(
        subprocess.run(
            [str(REPO / "bench" / "build-reference-plugin.sh")],
            check=True, capture_output=True, text=True,
        ).stdout.strip()
    )  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix="refb-", dir="/tmp"))
    try:
        return _run(args, binary, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(args: argparse.Namespace, binary: Path, work: Path) -> int:
    from dra_driver.devcluster import Cluster, find_binaries

    load = [os.getloadavg()]
    with Cluster(find_binaries(), work / "cluster") as cluster:
        kubeconfig = json_kubeconfig(cluster.kubeconfig, work / "kubeconfig.json")
        plugins = [ours("bench-ours"), reference("bench-go", binary)]
        cluster.create_namespace("bench")
        claims = {}
        for p in plugins:
            cluster.create_node(p.node)
            claims[p.label] = make_claims(cluster, p, "bench")
            (work / p.label).mkdir()
        results: dict[str, list[dict[str, Any]]] = {p.label: [] for p in plugins}
        for t in range(args.trials):
            for p in plugins if t % 2 == 0 else reversed(plugins):
                results[p.label].append(
                    trial(cluster, p, claims[p.label], work / p.label, args.cycles, kubeconfig)
                )
            load.append(os.getloadavg())
            print(f"trial {t + 1}/{args.trials} done, load {load[-1][0]:.2f}", file=sys.stderr)
        soaked = soak(cluster, plugins[0], claims["ours"][0], work / "ours", args.soak,
                      kubeconfig) if args.soak else []  # fmt: skip
    medians = {
        label: {k: round(statistics.median(r[k] for r in runs), 2) for k in runs[0]}
        for label, runs in results.items()
    }
    ratios = {k: round(medians["ours"][k] / medians["go"][k], 2) for k in medians["ours"]}
    report = {
        "trials": args.trials,
        "devices": DEVICES,
        "load_average_1m": [round(x[0], 2) for x in load],
        "median": medians,
        "ratio_ours_to_go": ratios,
        "soak_ours": soaked,
    }
    print(json.dumps(report, indent=2))
    print(f"\n{'metric':32} {'ours':>10} {'go':>10} {'ours/go':>8}")
    for k, v in ratios.items():
        print(f"{k:32} {medians['ours'][k]:10.2f} {medians['go'][k]:10.2f} {v:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
