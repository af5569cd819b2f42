"""What only the Go kubelet harness (the kubelet's DRA manager and plugin
manager, without a container runtime) can show; every other e2e scenario with pods
runs on the real node, except test_shares_sigkill, which stays on the harness (it
says why).

The harness runs the kubelet's DRA code at -v=4, where it logs each
NodePrepareResources call with its claims: that is how we see that all claims
of a pod go to our plugin in one call. The real node's kubelet runs at -v=2 (at
-v=4 its log would dwarf everything else), and our plugin logs prepared claims,
not calls, so the real node cannot tell one call of two claims from two calls."""

from __future__ import annotations

from dra_driver.demo.runtime import ContainerRuntime
from dra_driver.demo.stack import GpuNode
from dra_driver.devcluster import Cluster
from tests.e2e.scenarios import get_claim, gpu_claim, gpu_device_nodes, pod, wait_deallocated


def test_one_node_prepare_call_for_all_claims_of_a_pod(
    cluster: Cluster,
    cluster_namespace: str,
    a100_node: GpuNode,
    container_runtime: ContainerRuntime,
) -> None:
    """The kubelet batches every claim of a pod into one NodePrepareResources call
    per driver; our plugin answers each claim and the container gets both GPUs."""
    ns, node = cluster_namespace, a100_node
    cluster.apply(gpu_claim("left", ns))
    cluster.apply(gpu_claim("right", ns))
    spec = pod("pair", {"resourceClaimName": "left"}, node.name, ns)
    spec["spec"]["resourceClaims"].append({"name": "other", "resourceClaimName": "right"})
    spec["spec"]["containers"][0]["resources"]["claims"].append({"name": "other"})
    cluster.apply(spec)
    calls_before = harness_calls(node, "Calling NodePrepareResources rpc")
    run = node.run_pod(ns, "pair", container_runtime)
    calls = harness_calls(node, "Calling NodePrepareResources rpc")[len(calls_before) :]
    uids = [get_claim(cluster, ns, n)["metadata"]["uid"] for n in ("left", "right")]
    assert len(calls) == 1, calls
    assert all(uid in calls[0] for uid in uids)
    assert len(run.prepared.containers["main"].cdi_devices) == 2
    assert len(gpu_device_nodes(run.containers["main"].stdout)) == 2
    node.delete_pod(ns, "pair")
    assert node.cdi_specs() == {}
    for name in ("left", "right"):
        wait_deallocated(cluster, ns, name)


def harness_calls(node: GpuNode, text: str) -> list[str]:
    """Lines of the kubelet code's own log (klog -v=4) that contain ``text``."""
    log = node.harness.log_path.read_text(errors="replace")
    return [line for line in log.splitlines() if text in line]
