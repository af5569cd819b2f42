"""MPS daemons outlive the plugin container, on a real node (kubelet + containerd) with
the chart's DaemonSet pod from the locally built image and ``mpsDaemons: pod``.

Two whole-GPU MPS claims (two daemons), and, on a 580-driver node with ``mpsSlots``,
two MPS slots of one GPU claimed from two namespaces (the GPU's one daemon), each with
a client pod that acts as a CUDA client of the emulated daemon and keeps allocating.
Then (a) the plugin container is SIGKILLed (the kubelet restarts it) and (b) a rolling
update replaces the plugin pod. Throughout, each daemon keeps its PID and its pod
(sampled every 15 ms: the longest time a client was without its daemon is the figure
docs/benchmarks.md reports, expected 0), the clients keep running and keep allocating
through the same daemon, each new plugin logs that it adopted the daemons, and the
limits still hold afterwards. Unprepare removes the daemon pods; nothing is left: no
pod, process, mount or dir. Last, an MPS claim's first prepare with the daemon as a pod
vs as the plugin's child (the other figure).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.demo.realgpu import DONE_MARKER
from dra_driver.demo.realgpupod import RealGpuNodePod
from dra_driver.devcluster import Cluster, wait_until
from dra_driver.devcluster.binaries import NodeBinaries
from dra_driver.devcluster.node import parse_cri_log
from tests.e2e.helm import chart_pod_node
from tests.e2e.scenarios import pids_alive, plugin_records
from tests.e2e.shares import claim_and_pod, daemons, gpu_request

CLIENT = (
    'P=$CUDA_MPS_PIPE_DIRECTORY; echo "client $POD - -" > $P/control; '
    f"echo $P; echo {DONE_MARKER}; "
    'while true; do echo "alloc $POD 1" > $P/control; sleep 0.2; done'
)
"""A CUDA client of its claim's daemon (the emulated daemon's client protocol,
:mod:`dra_driver.emulation.mpsclients`): it connects without limits of its own,
then allocates 1 MiB every 200 ms (an open of the pipe blocks while no daemon holds
it); the daemon answers in ``clients/<pod>`` under the pipe dir."""
LIMIT = "1Gi"
SLOT_PROFILE = Path(__file__).parent / "data" / "l4-r580.yaml"


@pytest.fixture(scope="module")
def node(
    cluster: Cluster,
    driver_objects: list[str],
    node_binaries: NodeBinaries,
    helm_binary: Path,
    plugin_image: tuple[Path, str],
) -> Iterator[RealGpuNodePod]:
    with chart_pod_node(cluster, node_binaries, helm_binary, plugin_image, "dgx-a100") as gpu:
        yield gpu


@pytest.fixture(scope="module")
def slot_node(
    cluster: Cluster,
    driver_objects: list[str],
    node_binaries: NodeBinaries,
    helm_binary: Path,
    plugin_image: tuple[Path, str],
) -> Iterator[RealGpuNodePod]:
    """Four L4s on a 580 driver, each split into four MPS slots (one daemon per GPU)."""
    with chart_pod_node(cluster, node_binaries, helm_binary, plugin_image, SLOT_PROFILE,
                    {"mpsSlots": "NVIDIA L4=4"}) as gpu:  # fmt: skip
        yield gpu


def mps_objects(ns: str, name: str, node: str, pct: int | None) -> list[dict[str, Any]]:
    """A claim (whole-GPU MPS with limits; ``pct`` None: one MPS slot, no config) and its
    client pod."""
    config = {
        "driver": "gpu.nvidia.com",
        "parameters": {
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "GpuConfig",
            "sharing": {
                "strategy": "MPS",
                "mpsConfig": {
                    "defaultActiveThreadPercentage": pct,
                    "defaultPinnedDeviceMemoryLimit": LIMIT,
                },
            },
        },
    }
    exactly: dict[str, Any] = {"deviceClassName": "gpu.nvidia.com"}
    devices: dict[str, Any] = {"requests": [gpu_request(exactly)]}
    if pct is None:  # a slot: the policy's one slot of a slot GPU's gpu-0
        attrs = "device.attributes['gpu.nvidia.com']"
        exactly["selectors"] = [{"cel": {"expression": f"'mpsSlots' in {attrs} && "
                                                       f"{attrs}.index == 0"}}]  # fmt: skip
    else:
        devices["config"] = [{"requests": ["gpu"], "opaque": config}]
    return claim_and_pod(node, ns, name, devices, CLIENT, env={"POD": name}, grace_s=1)


class Sampler:
    """Every ``period_s``: are these daemon PIDs all alive? The longest run of samples
    where one was not is how long a client was without its daemon."""

    def __init__(self, pids: set[int], period_s: float = 0.015) -> None:
        self.pids = pids
        self.period_s = period_s
        self.samples = 0
        self.longest_gap_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        gap_start = None
        while not self._stop.is_set():
            now = time.monotonic()
            alive = set(pids_alive(sorted(self.pids))) == self.pids
            self.samples += 1
            if not alive and gap_start is None:
                gap_start = now
            elif alive and gap_start is not None:
                self.longest_gap_s = max(self.longest_gap_s, now - gap_start)
                gap_start = None
            self._stop.wait(self.period_s)
        if gap_start is not None:
            self.longest_gap_s = max(self.longest_gap_s, time.monotonic() - gap_start)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def answer(node: RealGpuNodePod, client: str) -> dict[str, str]:
    """The daemon's answer to ``client`` (``key=value`` lines), {} before the first."""
    for found in (node.state_dir / "mps").glob(f"*/pipe/clients/{client}"):
        with contextlib.suppress(OSError):
            lines = found.read_text().splitlines()
            return dict(line.split("=", 1) for line in lines if "=" in line)
    return {}


def allocating(node: RealGpuNodePod, client: str, pid: int, beyond: int) -> bool:
    """``client`` allocated more than ``beyond`` MiB, all from daemon ``pid``."""
    said = answer(node, client)
    return said.get("daemon") == str(pid) and int(said.get("allocated_mib", 0)) > beyond


def allocated(node: RealGpuNodePod, client: str) -> int:
    return int(answer(node, client).get("allocated_mib", 0))


def send(pipe_dir: Path, *lines: str) -> None:
    """Lines into a daemon's control pipe, from the host (as a client would)."""
    fd = os.open(pipe_dir / "control", os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(fd, "".join(f"{line}\n" for line in lines).encode())
    finally:
        os.close(fd)


def adoptions(node: RealGpuNodePod, pod_uid: str) -> list[str]:
    """Daemon ids the plugin pod ``pod_uid`` logged as adopted, all its containers' logs
    (a deleted pod's logs go with it: each pod is asked about its own)."""
    found = []
    for directory in node.node.paths.pod_logs.glob(f"{node.namespace}_*_{pod_uid}"):
        for log in sorted((directory / "plugin").glob("*.log")):
            for line in parse_cri_log(log.read_text(errors="replace")).splitlines():
                with contextlib.suppress(ValueError):
                    rec = json.loads(line)
                    if isinstance(rec, dict) and rec.get("msg") == "adopted MPS daemon":
                        found.append(str(rec["daemon"]))
    return found


def wait_replaced(node: RealGpuNodePod, old: dict[str, Any]) -> None:
    """Until the plugin pod ``old`` is replaced by a single Ready new one."""

    def replaced() -> bool:
        pods = node.plugin_pods()
        return (
            len(pods) == 1
            and pods[0]["metadata"]["uid"] != old["metadata"]["uid"]
            and (node.pod_ready(pods[0]))
        )

    wait_until(
        replaced,
        timeout=120,
        what="the old plugin pod replaced by a Ready new one",
        describe=node.describe_plugin,
    )


def adopted_and_serving(
    node: RealGpuNodePod, ids: list[str], served: dict[str, int], plugin: str, after: str
) -> None:
    """Until ``plugin`` (the current plugin pod) logged adopting the daemons ``ids`` and
    each client of ``served`` (name -> its daemon's PID) allocates through it again."""
    wait_until(
        lambda: sorted(adoptions(node, node.pod_uid)) == ids,
        timeout=30,
        what=f"{plugin} adopted both daemons",
    )
    now = {n: allocated(node, n) for n in served}
    wait_until(
        lambda: all(allocating(node, n, served[n], now[n]) for n in served),
        timeout=15,
        what=f"clients still allocate through the same daemons after {after}",
    )


def host_mounts_under(path: Path) -> list[str]:
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return [p for p in (line.split()[4] for line in lines) if p.startswith(f"{path}/")]


def test_daemons_survive_plugin_sigkill_and_rolling_update(
    cluster: Cluster, cluster_namespace: str, node: RealGpuNodePod
) -> None:
    """Two whole-GPU MPS claims: two daemons, two pods."""
    ns = cluster_namespace
    for i, name in enumerate(("mps-one", "mps-two")):
        cluster.apply(mps_objects(ns, name, node.name, pct=30 + 10 * i))
    survive(cluster, node, {"mps-one": ns, "mps-two": ns}, daemon_count=2, limit_mib="1024")


def test_slot_daemon_survives_plugin_sigkill_and_rolling_update(
    cluster: Cluster, slot_node: RealGpuNodePod
) -> None:
    """Two MPS slots of one L4 (580 driver), claims in two namespaces: the GPU's one
    daemon, in one pod, serves both."""
    clients = {"slot-a": f"slots-a-{secrets.token_hex(3)}",
               "slot-b": f"slots-b-{secrets.token_hex(3)}"}  # fmt: skip
    for name, ns in clients.items():
        cluster.create_namespace(ns)
        cluster.apply(mps_objects(ns, name, slot_node.name, pct=None))
    survive(cluster, slot_node, clients, daemon_count=1, limit_mib="5758")


def survive(
    cluster: Cluster,
    node: RealGpuNodePod,
    clients: dict[str, str],
    *,
    daemon_count: int,
    limit_mib: str,
) -> None:
    """The clients (pod name -> namespace) run; through a plugin SIGKILL and a rolling
    update their daemons keep their PIDs and pods, the clients keep allocating through
    them, the limits hold; after unprepare nothing is left."""
    names = tuple(clients)
    for name, ns in clients.items():
        node.run_pod(ns, name)
    wait_until(
        lambda: len(node.daemon_pods()) == daemon_count and len(daemons(node)) == daemon_count,
        timeout=30,
        what=f"{daemon_count} MPS daemon pod(s) and their daemons",
    )
    before = daemons(node)  # daemon dir -> PID
    pids = set(before.values())
    assert all(node.pod_ready(p) or p["status"]["phase"] == "Running" for p in node.daemon_pods())
    assert {p["spec"]["nodeName"] for p in node.daemon_pods()} == {node.name}
    wait_until(
        lambda: all(allocated(node, n) > 0 for n in names),
        timeout=15,
        what="both clients allocate through their daemons",
    )
    served = {n: int(answer(node, n)["daemon"]) for n in names}
    assert set(served.values()) == pids
    assert {answer(node, n)["memory_limit_mib"] for n in names} == {limit_mib}  # the claim's
    daemon_pod_uids = {p["metadata"]["uid"] for p in node.daemon_pods()}
    ids = sorted(Path(d).name for d in before)

    with Sampler(pids) as sampler:
        # (a) SIGKILL: the kubelet restarts the plugin container in the same pod.
        restarts = node.restart_count()
        node.kill_plugin()
        wait_until(
            lambda: node.restart_count() > restarts,
            timeout=60,
            what="the kubelet restarted the plugin container",
            describe=node.describe_plugin,
        )
        node.wait_ready()
        adopted_and_serving(node, ids, served, "the restarted plugin", "the SIGKILL")

        # (b) Rolling update: a new plugin pod beside the old one (surge), then alone.
        (old_pod,) = node.plugin_pods()
        node.roll()
        wait_replaced(node, old_pod)
        adopted_and_serving(node, ids, served, "the new plugin pod", "the rolling update")
    assert daemons(node) == before  # same daemons, same PIDs
    assert {p["metadata"]["uid"] for p in node.daemon_pods()} == daemon_pod_uids
    for name, ns in clients.items():
        assert node.pod(ns, name)["status"]["phase"] == "Running"
    print(
        f"\nMEASURE longest time a client was without its daemon: "
        f"{sampler.longest_gap_s * 1000:.1f} ms over {sampler.samples} samples "
        f"({sampler.period_s * 1000:.0f} ms apart)"
    )
    assert sampler.samples > 100 and sampler.longest_gap_s == 0.0
    # The adopted daemons still hold the claims' limits: a new client gets 1 GiB, no more.
    for d in before:
        send(Path(d) / "pipe", "client probe - -", f"alloc probe {int(limit_mib) + 1}")
        wait_until(lambda: answer(node, "probe").get("last", "").startswith("out of memory"),
                   timeout=10, what="the daemon refused an allocation over its limit")  # fmt: skip
        assert answer(node, "probe")["memory_limit_mib"] == limit_mib
        send(Path(d) / "pipe", "exit probe")
        wait_until(lambda: answer(node, "probe") == {}, timeout=10, what="probe client gone")

    # Unprepare (by the new plugin): the daemon pods go, and everything else with them.
    for name, ns in clients.items():
        node.delete_pod(ns, name)
    wait_until(
        lambda: node.daemon_pods() == [] and node.cdi_specs() == {},
        timeout=60,
        what="daemon pods deleted at unprepare",
        describe=node.describe_plugin,
    )
    assert pids_alive(sorted(pids)) == []
    assert daemons(node) == {}
    mps = node.state_dir / "mps"
    assert host_mounts_under(mps) == []
    assert not mps.exists() or list(mps.iterdir()) == []
    uids = {
        str(
            cluster.rest.get(f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{n}")[
                "metadata"
            ]["uid"]
        )
        for n, ns in clients.items()
    }
    assert all(plugin_records(node, uid, "unprepared") for uid in uids)  # type: ignore[arg-type]


def test_first_prepare_latency_pod_vs_process(
    cluster: Cluster, cluster_namespace: str, node: RealGpuNodePod
) -> None:
    """The figure docs/benchmarks.md reports: an MPS claim's prepare (plugin log,
    ``duration_ms``) with the daemon started as a pod vs as the plugin's child, one
    claim at a time, on this node. The mode is switched as ``helm upgrade`` would."""
    ns = cluster_namespace
    results: dict[str, list[float]] = {}
    for mode in ("pod", "process"):
        if node.values.get("mpsDaemons", "pod") != mode:
            node.values["mpsDaemons"] = mode
            (old,) = node.plugin_pods()
            cluster.apply(node.render())
            wait_replaced(node, old)
        for i in range(5):
            name = f"lat-{mode}-{i}"
            cluster.apply(mps_objects(ns, name, node.name, pct=50))
            node.run_pod(ns, name)
            uid = cluster.rest.get(
                f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}"
            )["metadata"]["uid"]
            (rec,) = plugin_records(node, uid, "prepared")  # type: ignore[arg-type]
            results.setdefault(mode, []).append(float(rec["duration_ms"]))
            assert len(node.daemon_pods()) == (1 if mode == "pod" else 0)
            node.delete_pod(ns, name)
            wait_until(
                lambda: node.cdi_specs() == {} and node.daemon_pods() == [],
                timeout=60,
                what="unprepared",
            )
    for mode, values in results.items():
        print(
            f"\nMEASURE first prepare of an MPS claim, daemon as {mode}: p50 "
            f"{statistics.median(values):.0f} ms, all {sorted(round(v) for v in values)}"
        )
    assert statistics.median(results["process"]) < statistics.median(results["pod"])
