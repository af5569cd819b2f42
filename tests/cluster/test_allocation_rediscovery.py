"""``dra-driver kubelet-plugin`` as a real process on an emulated node, against the API server.

It runs under the shipped ServiceAccount/RBAC with a Node-bound token, as in a
DaemonSet. Checks: the complete pool appears; after a GPU is unplugged and the
plugin gets SIGHUP, the published pool no longer has it; SIGTERM stops it
cleanly and leaves the slices for the next instance.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.devcluster import Cluster, wait_until
from tests.plugin.clusterkit import apply_rbac, node_bound_kubeconfig, our_slices, unique

DRIVER = "gpu.nvidia.com"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))  # unix socket paths <= 108 bytes
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _devices(cluster: Cluster, node: str) -> tuple[int, list[str]] | None:
    slices = our_slices(cluster, DRIVER, node)
    if not slices:
        return None
    pools = {
        (s["spec"]["pool"]["generation"], s["spec"]["pool"]["resourceSliceCount"]) for s in slices
    }
    if len(pools) != 1 or next(iter(pools))[1] != len(slices):
        return None  # an incomplete pool, mid-update
    names = [d["name"] for s in slices for d in s["spec"].get("devices", [])]
    return next(iter(pools))[0], names


def test_plugin_publishes_and_drops_an_unplugged_gpu(cluster: Cluster, short_dir: Path) -> None:
    apply_rbac(cluster)
    node: dict[str, Any] = cluster.create_node(unique("plugin-l4"))
    name = node["metadata"]["name"]
    root = short_dir / "host"
    argv = [
        sys.executable, "-m", "dra_driver", "kubelet-plugin", "--node-name", name,
        "--emulate", "l4-x4", "--host-root", str(root), "--cdi-dir", str(short_dir / "cdi"),
        "--kubelet-registry-dir", str(short_dir / "registry"),
        "--kubelet-plugins-dir", str(short_dir / "plugins"),
        "--kubeconfig", str(node_bound_kubeconfig(cluster, node)), "--rediscover-interval", "0",
    ]  # fmt: skip
    log = (short_dir / "plugin.log").open("w")
    proc = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "DRA_NODE_NAME": ""}
    )
    try:
        describe = lambda: (short_dir / "plugin.log").read_text()[-3000:]  # noqa: E731
        generation, names = wait_until(
            lambda: _devices(cluster, name), timeout=30, what="pool published", describe=describe
        )
        assert names == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
        (root / "emulation" / "unplugged").write_text("2\n")  # profile index 2 is minor 0
        proc.send_signal(signal.SIGHUP)
        later = wait_until(
            lambda: (r := _devices(cluster, name)) and len(r[1]) == 3 and r,
            timeout=30,
            what="pool without the unplugged GPU",
            describe=describe,
        )
        # A device that disappears leaves the pool in the next generation.
        assert later[0] == generation + 1
        assert later[1] == ["gpu-1", "gpu-2", "gpu-3"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, describe()
        assert _devices(cluster, name) == later  # slices stay for the next instance
        assert (root / "run/nvidia/driver/usr/bin/nvidia-smi").read_text().startswith("#!")
        assert "Emulated nvidia-smi" in (root / "run/nvidia/driver/usr/bin/nvidia-smi").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
