"""The compute-domain plugin's backend against the real kube-apiserver, under the plugin's
own node-bound ServiceAccount token and the shipped RBAC and admission policies
(deploy/rbac): a workload's channel prepare labels the node, fails retryably until the
node's daemon pod is Ready, then yields the channel's CDI spec; unprepare removes the
label with the domain's last channel claim; the node's nvidia.com/gpu.clique follows its
clique; the token cannot touch other labels or nodes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dra_driver.computedomain.names import DOMAIN_LABEL, GPU_CLIQUE_LABEL
from dra_driver.computedomain.node.backend import ComputeDomainBackend
from dra_driver.computedomain.node.cliquelabel import CliqueNodeLabel
from dra_driver.computedomain.node.kubeapi import NodeLabel
from dra_driver.devcluster import Cluster
from dra_driver.emulation.imexhost import IMEX_CHANNELS_MAJOR
from dra_driver.plugin.claims import PrepareError
from dra_driver.plugin.kubeclient import KubeApiError, KubeClient
from tests.cluster.daemonpods import force_delete
from tests.computedomain import kit
from tests.plugin.clusterkit import apply_rbac, node_bound_kubeconfig, unique

DOMAIN = "5c4e1d2a-7b8f-4e3a-9d61-0f2b3c4d5e6f"
OTHER_DOMAIN = "9a8b7c6d-1111-4222-8333-444455556666"


@dataclass
class Env:
    cluster: Cluster
    node: str
    other_node: str
    client: KubeClient


@pytest.fixture(scope="module")
def env(cluster: Cluster) -> Iterator[Env]:
    apply_rbac(cluster)
    node = cluster.create_node(unique("cd-node"))
    other = cluster.create_node(unique("cd-other"))
    client = KubeClient.from_kubeconfig(str(node_bound_kubeconfig(cluster, node)))
    yield Env(cluster, node["metadata"]["name"], other["metadata"]["name"], client)
    client.close()


def _spec(root: Path, uid: str) -> dict:  # type: ignore[type-arg]
    _, cdi_dir, _ = kit.paths(root)
    return json.loads((cdi_dir / f"k8s.compute-domain.nvidia.com-claim_{uid}.json").read_text())


def _retry_until_enforced(call, timeout: float = 30.0) -> KubeApiError:  # type: ignore[no-untyped-def]
    """The API server loads new policies asynchronously: the refusal, once it comes."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            call()
        except KubeApiError as err:
            return err
        assert time.monotonic() < deadline, "the admission policy never refused the write"
        time.sleep(0.2)


def test_channel_waits_for_the_daemon_then_gets_its_channel(env: Env, tmp_path: Path) -> None:
    cluster, node = env.cluster, env.node
    with kit.backend(tmp_path, env.client, node) as b:
        pool = b.pool()
        assert [(d.name, d.attributes) for d in pool.devices] == [
            ("channel-0", {"type": "channel", "id": 0,
                           "cliqueID": "8f3a2c61-5d0e-4b7a-9c1e-2f6d8b4a0c17.7"}),
            ("daemon-0", {"type": "daemon", "id": 0,
                          "cliqueID": "8f3a2c61-5d0e-4b7a-9c1e-2f6d8b4a0c17.7"}),
        ]  # fmt: skip
        single = kit.channel_claim("11111111-aaaa-4bbb-8ccc-000000000001", DOMAIN, node)
        with pytest.raises(PrepareError) as no_pod:
            b.prepare(single)
        assert not no_pod.value.permanent and "no daemon pod" in str(no_pod.value)
        assert kit.node_label(cluster, node) == DOMAIN  # the DaemonSet can now select it
        pod = kit.daemon_pod(cluster, unique("imex"), DOMAIN, node)
        try:
            kit.set_ready(cluster, pod, False)
            with pytest.raises(PrepareError) as not_ready:
                b.prepare(single)
            assert not not_ready.value.permanent
            assert "not Ready (ContainersNotReady)" in str(not_ready.value)
            assert not list(kit.paths(tmp_path)[1].glob("*.json"))  # no spec before Ready

            kit.set_ready(cluster, pod, True)
            (prepared,) = b.prepare(single)
            assert prepared.device_name == "channel-0" and prepared.pool_name == node
            assert prepared.cdi_device_ids == (
                "k8s.compute-domain.nvidia.com/claim=11111111-aaaa-4bbb-8ccc-000000000001-0",
            )
            (device,) = _spec(tmp_path, single.uid)["devices"]
            assert device["containerEdits"]["deviceNodes"] == [{
                "path": "/dev/nvidia-caps-imex-channels/channel0", "type": "c",
                "major": IMEX_CHANNELS_MAJOR, "minor": 0, "fileMode": 0o666}]  # fmt: skip
            assert b.prepare(single) == [prepared]  # the kubelet's repeat: same answer

            every = kit.channel_claim("11111111-aaaa-4bbb-8ccc-000000000002", DOMAIN, node,
                                      "All", name="all")  # fmt: skip
            b.prepare(every)
            nodes = _spec(tmp_path, every.uid)["devices"][0]["containerEdits"]["deviceNodes"]
            assert [n["minor"] for n in nodes] == list(range(2048))
            assert nodes[2047]["path"] == "/dev/nvidia-caps-imex-channels/channel2047"

            # Another domain cannot take the node while this one has channel claims here.
            intruder = kit.channel_claim("11111111-aaaa-4bbb-8ccc-000000000003", OTHER_DOMAIN,
                                         node, name="intruder")  # fmt: skip
            with pytest.raises(PrepareError) as busy:
                b.prepare(intruder)
            assert not busy.value.permanent and DOMAIN in str(busy.value)
            assert kit.node_label(cluster, node) == DOMAIN
            b.unprepare(intruder.ref)
            assert kit.node_label(cluster, node) == DOMAIN  # not the intruder's to remove

            b.unprepare(single.ref)
            assert kit.node_label(cluster, node) == DOMAIN  # "all" still holds the domain
            b.unprepare(every.ref)
            assert kit.node_label(cluster, node) is None
            assert not list(kit.paths(tmp_path)[1].glob("*"))
            assert list(b.prepared_claims()) == []
        finally:
            force_delete(cluster, kit.NAMESPACE, pod.rsplit("/", 1)[1])


def test_daemon_claim_gets_its_domain_dir_and_identity(env: Env, tmp_path: Path) -> None:
    with kit.backend(tmp_path, env.client, env.node) as b:
        claim = kit.daemon_claim("22222222-aaaa-4bbb-8ccc-000000000001", DOMAIN, env.node)
        b.prepare(claim)
        edits = _spec(tmp_path, claim.uid)["devices"][0]["containerEdits"]
        domain_dir = kit.paths(tmp_path)[2] / "domains" / DOMAIN
        assert domain_dir.is_dir() and (domain_dir.stat().st_mode & 0o777) == 0o700
        assert set(edits["env"]) == {
            f"DOMAIN_UID={DOMAIN}",
            "IMEX_BIN_DIR=/imex-bin",
            "CLIQUE_ID=8f3a2c61-5d0e-4b7a-9c1e-2f6d8b4a0c17.7",
        }
        mounts = {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
        assert mounts["/etc/nvidia-imex"] == str(domain_dir)
        assert Path(mounts["/imex-bin"]).name == "bin"
        assert [n["path"] for n in edits["deviceNodes"]] == ["/dev/nvidia-caps/nvidia-cap4400"]
        assert kit.node_label(env.cluster, env.node) is None  # a daemon never labels
        b.unprepare(claim.ref)
        assert not domain_dir.exists()


def test_no_clique_node_publishes_empty_clique_and_daemon_gets_its_own(
    env: Env, tmp_path: Path
) -> None:
    with kit.backend(tmp_path, env.client, env.node, profile="hgx-h100-no-clique") as b:
        assert {d.attributes["cliqueID"] for d in b.pool().devices} == {""}
        claim = kit.daemon_claim("33333333-aaaa-4bbb-8ccc-000000000001", DOMAIN, env.node)
        b.prepare(claim)
        env_vars = _spec(tmp_path, claim.uid)["devices"][0]["containerEdits"]["env"]
        assert f"CLIQUE_ID=none-{env.node}" in env_vars
        b.unprepare(claim.ref)


def test_the_token_may_change_only_the_domain_label_of_its_own_node(env: Env) -> None:
    merge = "application/merge-patch+json"

    def patch(node: str, labels: dict[str, str | None]) -> None:
        env.client.request(
            "PATCH",
            f"/api/v1/nodes/{node}",
            body={"metadata": {"labels": labels}},
            content_type=merge,
        )

    other = _retry_until_enforced(lambda: patch(env.other_node, {DOMAIN_LABEL: DOMAIN}))
    assert other.status == 422 and "may only change its own Node" in str(other)
    foreign = _retry_until_enforced(lambda: patch(env.node, {"team": "x"}))
    assert foreign.status == 422 and "computeDomain" in str(foreign)
    taint = _retry_until_enforced(lambda: env.client.request(
        "PATCH", f"/api/v1/nodes/{env.node}", content_type=merge,
        body={"spec": {"unschedulable": True}}))  # fmt: skip
    assert taint.status == 422
    patch(env.node, {DOMAIN_LABEL: DOMAIN})  # its own label of its own node: allowed
    patch(env.node, {DOMAIN_LABEL: None})
    assert kit.node_label(env.cluster, env.node) is None


def _labels(env: Env, node: str) -> dict[str, str]:
    labels = env.cluster.rest.get(f"/api/v1/nodes/{node}")["metadata"].get("labels") or {}
    return dict(labels)


def test_the_token_may_set_the_clique_label_only_on_its_own_node(env: Env) -> None:
    merge = "application/merge-patch+json"

    def patch(node: str, labels: dict[str, str | None]) -> None:
        env.client.request("PATCH", f"/api/v1/nodes/{node}",
                           body={"metadata": {"labels": labels}}, content_type=merge)  # fmt: skip

    other = _retry_until_enforced(lambda: patch(env.other_node, {GPU_CLIQUE_LABEL: "c.1"}))
    assert other.status == 422 and "may only change its own Node" in str(other)
    assert GPU_CLIQUE_LABEL not in _labels(env, env.other_node)
    for key in ("nvidia.com/gpu.product", "nvidia.com/gpu.clique-x"):
        foreign = _retry_until_enforced(lambda k=key: patch(env.node, {k: "x"}))  # type: ignore[misc]
        assert foreign.status == 422 and GPU_CLIQUE_LABEL in str(foreign)
    patch(env.node, {GPU_CLIQUE_LABEL: "c.1"})  # its own node's clique label: allowed
    assert _labels(env, env.node)[GPU_CLIQUE_LABEL] == "c.1"
    patch(env.node, {GPU_CLIQUE_LABEL: None})
    assert GPU_CLIQUE_LABEL not in _labels(env, env.node)


def test_the_token_keeps_the_clique_label_of_its_own_node(env: Env, tmp_path: Path) -> None:
    """As the plugin does at start: the emulated host's clique becomes the node's
    nvidia.com/gpu.clique (what NVIDIA's examples select on), and goes with the clique.
    Runs after the test above, which waits until the admission policy is enforced."""
    with kit.backend(tmp_path, env.client, env.node) as b:
        clique = b.host.clique_id
    assert clique == "8f3a2c61-5d0e-4b7a-9c1e-2f6d8b4a0c17.7"
    state = tmp_path / "state-clique"
    state.mkdir()
    label = CliqueNodeLabel(NodeLabel(env.client, env.node, GPU_CLIQUE_LABEL), state)
    label.sync(clique)
    assert _labels(env, env.node)[GPU_CLIQUE_LABEL] == clique
    label.sync("")
    assert GPU_CLIQUE_LABEL not in _labels(env, env.node)
    # a value another writer (GFD, an admin) set is not ours to remove
    env.cluster.rest.merge_patch(f"/api/v1/nodes/{env.node}",
                           {"metadata": {"labels": {GPU_CLIQUE_LABEL: "elsewhere.1"}}})  # fmt: skip
    label.sync("")
    assert _labels(env, env.node)[GPU_CLIQUE_LABEL] == "elsewhere.1"
    env.cluster.rest.merge_patch(f"/api/v1/nodes/{env.node}",
                           {"metadata": {"labels": {GPU_CLIQUE_LABEL: None}}})  # fmt: skip


def test_backend_is_a_device_backend() -> None:
    from dra_driver.plugin.backend import PreparedLookup, StatusReporter

    assert issubclass(ComputeDomainBackend, PreparedLookup)
    assert issubclass(ComputeDomainBackend, StatusReporter)
