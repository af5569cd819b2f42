"""SIGKILL of the compute-domain plugin at every step of a channel prepare and unprepare
(the real API server holds the node label and the daemon pod): a retried prepare then
an unprepare, or an unprepare alone, leave exactly nothing behind: no CDI spec or temp
file, no checkpoint entry, no node label."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dra_driver.devcluster import Cluster
from dra_driver.plugin.kubeclient import KubeClient
from tests.cluster.daemonpods import force_delete
from tests.computedomain import kit
from tests.computedomain.crashing import CRASH_UID, DOMAIN
from tests.plugin.clusterkit import apply_rbac, node_bound_kubeconfig, unique

REPO = Path(__file__).parents[2]
PREPARE_STEPS = ["checkpoint-started", "node-labelled", "daemon-ready", "cdi-spec",
                 "checkpoint-completed"]  # fmt: skip
UNPREPARE_STEPS = [
    "checkpoint-unpreparing",
    "cdi-spec-removed",
    "label-released",
    "checkpoint-removed",
]


@dataclass
class Env:
    cluster: Cluster
    node: str
    kubeconfig: Path
    client: KubeClient


@pytest.fixture(scope="module")
def env(cluster: Cluster) -> Iterator[Env]:
    apply_rbac(cluster)
    node = cluster.create_node(unique("cd-crash"))
    name = node["metadata"]["name"]
    kubeconfig = node_bound_kubeconfig(cluster, node)
    pod = kit.daemon_pod(cluster, unique("imex"), DOMAIN, name)
    kit.set_ready(cluster, pod, True)
    client = KubeClient.from_kubeconfig(str(kubeconfig))
    yield Env(cluster, name, kubeconfig, client)
    client.close()
    force_delete(cluster, kit.NAMESPACE, pod.rsplit("/", 1)[1])


def run_child(env: Env, root: Path, call: str, kill_at: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.computedomain.crashing", str(root), str(env.kubeconfig),
         env.node, call],
        env={**os.environ, "DRA_TEST_KILL_AT": str(kill_at), "PYTHONPATH": str(REPO)},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def assert_clean(env: Env, root: Path) -> None:
    _, cdi_dir, state_dir = kit.paths(root)
    assert not list(cdi_dir.glob("*")), "a CDI spec or temp file was left"
    checkpoint = json.loads((state_dir / "checkpoint.json").read_text())
    assert checkpoint["claims"] == {}
    assert kit.node_label(env.cluster, env.node) is None


def test_steps_are_the_ones_killed_at(env: Env, tmp_path: Path) -> None:
    done = run_child(env, tmp_path / "p", "prepare", 0)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == PREPARE_STEPS
    done = run_child(env, tmp_path / "p", "unprepare", 0)  # the claim is prepared: a repeat
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == UNPREPARE_STEPS
    assert_clean(env, tmp_path / "p")


@pytest.mark.parametrize("retry", ["prepare-then-unprepare", "unprepare"])
@pytest.mark.parametrize("kill_at", range(1, len(PREPARE_STEPS) + 1),
                         ids=PREPARE_STEPS)  # fmt: skip
def test_kill_during_prepare(env: Env, tmp_path: Path, kill_at: int, retry: str) -> None:
    killed = run_child(env, tmp_path, "prepare", kill_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    claim = kit.channel_claim(CRASH_UID, DOMAIN, env.node)
    with kit.backend(tmp_path, env.client, env.node) as backend:
        # Whatever the kill left is on record: the stale-claim cleanup would find it.
        assert [r.uid for r in backend.prepared_claims()] == [CRASH_UID]
        if retry == "prepare-then-unprepare":
            (device,) = backend.prepare(claim)
            spec = kit.paths(tmp_path)[1] / f"k8s.compute-domain.nvidia.com-claim_{CRASH_UID}.json"
            assert json.loads(spec.read_text())["devices"][0]["name"] == f"{CRASH_UID}-0"
            assert device.cdi_device_ids == (f"k8s.compute-domain.nvidia.com/claim={CRASH_UID}-0",)
            assert kit.node_label(env.cluster, env.node) == DOMAIN
            assert backend.prepared_devices(claim.ref) == [device]
        backend.unprepare(claim.ref)
    assert_clean(env, tmp_path)


@pytest.mark.parametrize("kill_at", range(1, len(UNPREPARE_STEPS) + 1),
                         ids=UNPREPARE_STEPS)  # fmt: skip
def test_kill_during_unprepare(env: Env, tmp_path: Path, kill_at: int) -> None:
    killed = run_child(env, tmp_path, "unprepare", kill_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    claim = kit.channel_claim(CRASH_UID, DOMAIN, env.node)
    with kit.backend(tmp_path, env.client, env.node) as backend:
        if kill_at < len(UNPREPARE_STEPS):
            assert [r.uid for r in backend.prepared_claims()] == [CRASH_UID]
            assert backend.prepared_devices(claim.ref) is None  # never half-torn "prepared"
        backend.unprepare(claim.ref)
    assert_clean(env, tmp_path)
