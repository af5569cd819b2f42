"""``dra-driver compute-domain-plugin`` as a process on an emulated node against the real
API server, under the plugin's node-bound token and the shipped slice and node-label
policies: it serves its own sockets, labels its node nvidia.com/gpu.clique, publishes
channel-0 and daemon-0 with the node's clique, lacks nothing for readiness but a
kubelet's registration, and stops cleanly on SIGTERM."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.devcluster import Cluster
from tests.plugin.clusterkit import apply_rbac, node_bound_kubeconfig, our_slices, unique
from tests.test_daemon import free_port

REPO = Path(__file__).parents[2]
DRIVER = "compute-domain.nvidia.com"


def _readyz(port: int) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())
    except (urllib.error.URLError, OSError):
        return 0, {}


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """Unix socket paths must stay under 108 bytes; pytest's tmp_path is too deep."""
    path = Path(tempfile.mkdtemp(prefix="cdp-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_plugin_registers_publishes_its_devices_and_stops(
    cluster: Cluster, short_dir: Path
) -> None:
    tmp_path = short_dir
    apply_rbac(cluster)
    node = cluster.create_node(unique("cd-proc"))
    name = node["metadata"]["name"]
    port = free_port()
    argv = [sys.executable, "-m", "dra_driver", "compute-domain-plugin",
            "--emulate=hgx-h100-fabric-clique8", f"--host-root={tmp_path / 'host'}",
            f"--node-name={name}", "--namespace=dra-driver",
            f"--kubeconfig={node_bound_kubeconfig(cluster, node)}",
            f"--cdi-dir={tmp_path / 'cdi'}", f"--kubelet-registry-dir={tmp_path / 'registry'}",
            f"--kubelet-plugins-dir={tmp_path / 'plugins'}", f"--health-port={port}",
            "--claim-status=false"]  # fmt: skip
    log = (tmp_path / "plugin.log").open("w")
    proc = subprocess.Popen(argv, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not our_slices(cluster, DRIVER, name):
            assert proc.poll() is None, (tmp_path / "plugin.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "plugin.log").read_text()
            time.sleep(0.2)
        (slice_,) = our_slices(cluster, DRIVER, name)
        status, body = _readyz(port)  # no kubelet here: only the registration is missing
        assert status == 503 and body["problems"] == ["not registered with the kubelet: pending"], (
            body
        )
        devices = {d["name"]: d["attributes"] for d in slice_["spec"]["devices"]}
        clique = {"string": "8f3a2c61-5d0e-4b7a-9c1e-2f6d8b4a0c17.8"}
        assert devices == {
            "channel-0": {"type": {"string": "channel"}, "id": {"int": 0}, "cliqueID": clique},
            "daemon-0": {"type": {"string": "daemon"}, "id": {"int": 0}, "cliqueID": clique},
        }
        # Labelled before it published: pods selecting nvidia.com/gpu.clique find the node.
        labels = cluster.rest.get(f"/api/v1/nodes/{name}")["metadata"].get("labels") or {}
        assert labels.get("nvidia.com/gpu.clique") == clique["string"]
        sockets = {p.name for p in (tmp_path / "registry").iterdir()}
        assert sockets == {f"{DRIVER}-reg.sock"}
        assert (tmp_path / "plugins" / DRIVER / "dra.sock").exists()
        imex = tmp_path / "host" / "run/nvidia/driver/usr/bin/nvidia-imex"
        assert "imextools" in imex.read_text()  # the emulated daemon binaries, for its daemons
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
        # The session's control plane is shared: leave no node publishing a channel-0.
        for leftover in our_slices(cluster, DRIVER, name):
            cluster.rest.delete(
                f"/apis/resource.k8s.io/v1/resourceslices/{leftover['metadata']['name']}"
            )
        cluster.rest.delete(f"/api/v1/nodes/{name}")
    assert json.loads((tmp_path / "plugins" / DRIVER / "checkpoint.json").read_text()
                      if (tmp_path / "plugins" / DRIVER / "checkpoint.json").exists()
                      else '{"claims": {}}')["claims"] == {}  # fmt: skip


def test_a_restart_without_a_clique_removes_the_clique_label_it_set(
    cluster: Cluster, short_dir: Path
) -> None:
    """The node's clique went away between two runs (same state dir): the second run
    removes the value the first one set, and the first run had set it at start."""
    apply_rbac(cluster)
    node = cluster.create_node(unique("cd-relabel"))
    name = node["metadata"]["name"]
    kubeconfig = node_bound_kubeconfig(cluster, node)
    path = f"/api/v1/nodes/{name}"

    def clique_label() -> str | None:
        labels = cluster.rest.get(path)["metadata"].get("labels") or {}
        return labels.get("nvidia.com/gpu.clique")

    def run_until(profile: str, host: str, done: object) -> None:
        log_path = short_dir / f"{host}.log"
        argv = [sys.executable, "-m", "dra_driver", "compute-domain-plugin",
                f"--emulate={profile}", f"--host-root={short_dir / host}",
                f"--node-name={name}", "--namespace=dra-driver", f"--kubeconfig={kubeconfig}",
                f"--cdi-dir={short_dir / 'cdi'}", f"--kubelet-registry-dir={short_dir / 'reg'}",
                f"--kubelet-plugins-dir={short_dir / 'plugins'}",
                "--claim-status=false"]  # fmt: skip
        with log_path.open("w") as log:
            proc = subprocess.Popen(argv, env={**os.environ, "PYTHONPATH": str(REPO)},
                                    stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
            try:
                deadline = time.monotonic() + 60
                while not (our_slices(cluster, DRIVER, name) and clique_label() == done):
                    assert proc.poll() is None, log_path.read_text()
                    assert time.monotonic() < deadline, log_path.read_text()
                    time.sleep(0.2)
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(timeout=30) == 0
            finally:
                if proc.poll() is None:
                    proc.kill()

    try:
        run_until("hgx-h100-fabric-clique8", "h1", "8f3a2c61-5d0e-4b7a-9c1e-2f6d8b4a0c17.8")
        assert (short_dir / "plugins" / DRIVER / "clique-label").exists()
        run_until("hgx-h100-no-clique", "h2", None)
        assert not (short_dir / "plugins" / DRIVER / "clique-label").exists()
    finally:
        for leftover in our_slices(cluster, DRIVER, name):
            cluster.rest.delete(
                f"/apis/resource.k8s.io/v1/resourceslices/{leftover['metadata']['name']}"
            )
        cluster.rest.delete(path)
