"""``dra-driver compute-domain-daemon`` as a process against the real API server with the
emulated ``nvidia-imex``: it labels its pod with its clique, writes the IMEX config and
the nodes file from its ComputeDomainClique (peers in index order), starts nvidia-imex,
rewrites the nodes file and sends SIGUSR1 when the peers change, and ``check`` answers
from ``nvidia-imex-ctl -q``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.computedomain.names import CLIQUE_LABEL, CLIQUE_PLURAL, DOMAIN_LABEL
from dra_driver.computedomain.node.imexdaemon import config_text, peer_ips
from dra_driver.devcluster import ApiError, Cluster
from dra_driver.emulation import imextools
from tests.cluster.daemonpods import force_delete
from tests.computedomain import kit
from tests.plugin.clusterkit import unique

REPO = Path(__file__).parents[2]
DOMAIN = "c0ffee00-1234-4abc-8def-000000000001"
CLIQUE = "8f3a2c61-5d0e-4b7a-9c1e-2f6d8b4a0c17.7"
CLIQUES_PATH = "/apis/resource.nvidia.com/v1beta1/namespaces/{namespace}/" + CLIQUE_PLURAL
CLIQUES = CLIQUES_PATH.format(namespace=kit.NAMESPACE)
CRD = {
    # Only what this test needs to store the object; the real CRD ships with the controller.
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": f"{CLIQUE_PLURAL}.resource.nvidia.com"},
    "spec": {"group": "resource.nvidia.com", "scope": "Namespaced",
             "names": {"plural": CLIQUE_PLURAL, "singular": "computedomainclique",
                       "kind": "ComputeDomainClique"},
             "versions": [{"name": "v1beta1", "served": True, "storage": True,
                           "schema": {"openAPIV3Schema": {
                               "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]},
}  # fmt: skip


def wait(predicate: Callable[[], object], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_peer_ips_follow_index_order_and_include_us() -> None:
    clique = {"daemons": [{"ipAddress": "10.0.0.3", "index": 2}, {"ipAddress": "10.0.0.1",
              "index": 0}, {"nodeName": "pending", "index": 1}]}  # fmt: skip
    assert peer_ips(clique, "10.0.0.1") == ["10.0.0.1", "10.0.0.3"]
    assert peer_ips(clique, "10.0.0.9") == ["10.0.0.1", "10.0.0.3", "10.0.0.9"]
    assert peer_ips(None, "10.0.0.9") == ["10.0.0.9"]


@pytest.fixture(scope="module")
def crd(cluster: Cluster) -> Iterator[None]:
    cluster.create_namespace(kit.NAMESPACE)
    try:
        cluster.apply(CRD)
    except ApiError as err:  # the controller's own CRD may be installed: fine
        if err.status != 409:
            raise
    wait(lambda: _served(cluster))
    yield


def _served(cluster: Cluster) -> bool:
    try:
        cluster.rest.get(CLIQUES)
        return True
    except ApiError:
        return False


def test_daemon_follows_its_clique(cluster: Cluster, crd: None, tmp_path: Path) -> None:
    from dra_driver.commands.discover import install_emulated_imex_tools
    from dra_driver.emulation import EmulatedNode

    node = EmulatedNode.create("hgx-h100-fabric", tmp_path / "host")
    install_emulated_imex_tools(node)
    record = node.host.root / "emulation" / "imex.jsonl"
    pod_name = unique("imex")
    pod_path = kit.daemon_pod(cluster, pod_name, DOMAIN, "n1")
    name = f"{DOMAIN}.{CLIQUE}"
    cluster.rest.create(CLIQUES, {"apiVersion": "resource.nvidia.com/v1beta1",
                                  "kind": "ComputeDomainClique", "metadata": {"name": name},
                                  "daemons": [{"nodeName": "n1", "ipAddress": "127.0.0.1",
                                               "cliqueID": CLIQUE, "index": 0,
                                               "status": "NotReady"}]})  # fmt: skip
    imex_dir = tmp_path / "domain"
    environ = {**os.environ, "PYTHONPATH": str(REPO), "NODE_NAME": "n1", "POD_NAME": pod_name,
               "POD_NAMESPACE": kit.NAMESPACE, "POD_IP": "127.0.0.1", "DOMAIN_UID": DOMAIN,
               "CLIQUE_ID": CLIQUE, "IMEX_BIN_DIR": str(node.bin_dir)}  # fmt: skip
    base = [sys.executable, "-m", "dra_driver", "compute-domain-daemon"]
    daemon = subprocess.Popen([*base, "run", "--imex-dir", str(imex_dir),
                               "--kubeconfig", str(cluster.kubeconfig)], env=environ)  # fmt: skip

    def check() -> subprocess.CompletedProcess[str]:
        return subprocess.run([*base, "check", "--imex-dir", str(imex_dir)], env=environ,
                              capture_output=True, text=True, timeout=60)  # fmt: skip

    try:
        Path(f"{record}.imex.hold").touch()  # the IMEX domain has no quorum yet
        wait(lambda: any(e.get("event") == "started" for e in imextools.read_record(record)))
        labels = cluster.rest.get(pod_path)["metadata"]["labels"]
        assert labels == {DOMAIN_LABEL: DOMAIN, CLIQUE_LABEL: CLIQUE}
        assert (imex_dir / "config.cfg").read_text().count("IMEX_NODE_CONFIG_FILE=") == 1
        assert (imex_dir / "nodes_config.cfg").read_text() == "127.0.0.1\n"
        held = check()
        assert held.returncode == 1 and "NOT_READY" in held.stderr
        Path(f"{record}.imex.hold").unlink()
        assert check().returncode == 0

        # A peer joins with index 1, then one takes index 0's place before us: the nodes
        # file follows the indices and nvidia-imex is told (SIGUSR1) each time.
        cluster.rest.merge_patch(f"{CLIQUES}/{name}", {"daemons": [
            {"nodeName": "n1", "ipAddress": "127.0.0.1", "index": 0},
            {"nodeName": "n2", "ipAddress": "127.0.0.2", "index": 1}]})  # fmt: skip
        wait(lambda: (imex_dir / "nodes_config.cfg").read_text() == "127.0.0.1\n127.0.0.2\n")
        wait(lambda: _reloads(record) == [["127.0.0.1", "127.0.0.2"]])
        cluster.rest.merge_patch(f"{CLIQUES}/{name}", {"daemons": [
            {"nodeName": "n3", "ipAddress": "127.0.0.3", "index": 0},
            {"nodeName": "n1", "ipAddress": "127.0.0.1", "index": 2}]})  # fmt: skip
        wait(lambda: _reloads(record)[-1:] == [["127.0.0.3", "127.0.0.1"]])
        assert daemon.poll() is None
    finally:
        daemon.terminate()
        code = daemon.wait(timeout=30)
        force_delete(cluster, kit.NAMESPACE, pod_name)
        cluster.rest.delete(f"{CLIQUES}/{name}")
    assert code == 0
    assert imextools.read_record(record)[-1]["event"] == "terminated"  # stopped with us


def _reloads(record: Path) -> list[list[str]]:
    return [[p["host"] for p in e["peers"]] for e in imextools.read_record(record)
            if e.get("event") == "reloaded"]  # fmt: skip


def test_config_names_the_nodes_file_and_runs_in_the_foreground(tmp_path: Path) -> None:
    from dra_driver.computedomain.node.imexdaemon import ImexDaemonSettings

    s = ImexDaemonSettings("n", "p", "ns", "10.0.0.1", DOMAIN, CLIQUE, tmp_path, tmp_path)
    cfg = imextools.read_config(_write(tmp_path / "c.cfg", config_text(s)))
    assert cfg[imextools.NODES_KEY] == str(tmp_path / "nodes_config.cfg")
    assert cfg["DAEMONIZE"] == "0"


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_catches_reads_whether_a_process_handles_the_signal(tmp_path: Path) -> None:
    from dra_driver.computedomain.node.imexdaemon import catches

    plain = subprocess.Popen(["sleep", "30"])
    handler = ("import signal, sys, time; signal.signal(signal.SIGUSR1, lambda *_: None); "
               "print('set', flush=True); time.sleep(30)")  # fmt: skip
    handling = subprocess.Popen([sys.executable, "-c", handler], stdout=subprocess.PIPE)
    try:
        assert handling.stdout is not None and handling.stdout.readline() == b"set\n"
        assert catches(handling.pid, signal.SIGUSR1)
        assert not catches(handling.pid, signal.SIGUSR2)
        assert not catches(plain.pid, signal.SIGUSR1)
    finally:
        for proc in (plain, handling):
            proc.kill()
            proc.wait()
        if handling.stdout is not None:
            handling.stdout.close()
    assert not catches(plain.pid, signal.SIGUSR1)  # gone: nothing to read


def _run_daemon(cluster: Cluster, tmp_path: Path, bin_dir: Path, pod_name: str,
                ) -> tuple[subprocess.Popen[bytes], Path]:  # fmt: skip
    imex_dir = tmp_path / "domain"
    environ = {**os.environ, "PYTHONPATH": str(REPO), "NODE_NAME": "n1", "POD_NAME": pod_name,
               "POD_NAMESPACE": kit.NAMESPACE, "POD_IP": "127.0.0.1", "DOMAIN_UID": DOMAIN,
               "CLIQUE_ID": CLIQUE, "IMEX_BIN_DIR": str(bin_dir)}  # fmt: skip
    argv = [sys.executable, "-m", "dra_driver", "compute-domain-daemon", "run",
            "--imex-dir", str(imex_dir), "--kubeconfig", str(cluster.kubeconfig)]  # fmt: skip
    return subprocess.Popen(argv, env=environ), imex_dir


def _clique(*ips: str) -> dict[str, Any]:
    daemons = [{"nodeName": f"n{i + 1}", "ipAddress": ip, "cliqueID": CLIQUE, "index": i,
                "status": "NotReady"} for i, ip in enumerate(ips)]  # fmt: skip
    return {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainClique",
            "metadata": {"name": f"{DOMAIN}.{CLIQUE}"}, "daemons": daemons}  # fmt: skip


@pytest.mark.parametrize("joins", ["before-start", "while-nvidia-imex-starts"])
def test_a_peer_listed_as_the_daemon_starts_never_kills_nvidia_imex(
    cluster: Cluster, crd: None, tmp_path: Path, joins: str
) -> None:
    """Two daemons of a two-node domain: the clique lists the peer before ours starts, or
    while ``nvidia-imex`` has not set its SIGUSR1 handler yet (a wrapper sleeps before it
    execs the emulated tool). SIGUSR1's default action would kill it; the daemon starts it
    with the peers listed, and holds a reload signal until it is caught."""
    from dra_driver.commands.discover import install_emulated_imex_tools
    from dra_driver.emulation import EmulatedNode

    node = EmulatedNode.create("hgx-h100-fabric", tmp_path / "host")
    install_emulated_imex_tools(node)
    record = node.host.root / "emulation" / "imex.jsonl"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-imex-ctl").symlink_to(node.bin_dir / "nvidia-imex-ctl")
    launched = tmp_path / "launched"
    slow = bin_dir / "nvidia-imex"  # no handler for 3 s, then the emulated tool (same PID)
    slow.write_text(f'#!/bin/sh\ntouch {launched}\nsleep 3\nexec {node.bin_dir}/nvidia-imex "$@"\n')
    slow.chmod(0o755)
    pod_name = unique("imex")
    kit.daemon_pod(cluster, pod_name, DOMAIN, "n1")
    both = ["127.0.0.1", "127.0.0.2"]
    cluster.rest.create(CLIQUES, _clique(*(both if joins == "before-start" else both[:1])))
    daemon, imex_dir = _run_daemon(cluster, tmp_path, bin_dir, pod_name)
    try:
        wait(launched.exists)
        if joins == "while-nvidia-imex-starts":
            cluster.rest.merge_patch(f"{CLIQUES}/{DOMAIN}.{CLIQUE}", _clique(*both))
        wait(lambda: (imex_dir / "nodes_config.cfg").read_text() == "127.0.0.1\n127.0.0.2\n")
        # Started with both listed, or started alone and told by SIGUSR1 once it catches it
        # (the emulated tool reads the file the daemon rewrote meanwhile: told twice).
        events = ["started"] if joins == "before-start" else ["started", "reloaded"]
        wait(lambda: [e["event"] for e in imextools.read_record(record)
                      if e.get("event")] == events)  # fmt: skip
        last = [e for e in imextools.read_record(record) if e.get("event")][-1]
        assert [p["host"] for p in last["peers"]] == both
        time.sleep(0.5)
        assert daemon.poll() is None
    finally:
        daemon.terminate()
        code = daemon.wait(timeout=30)
        force_delete(cluster, kit.NAMESPACE, pod_name)
        cluster.rest.delete(f"{CLIQUES}/{DOMAIN}.{CLIQUE}")
    assert code == 0
