"""deploy/examples/portable-selectors.yaml on every emulated node profile, on the real
scheduler: it schedules wherever a fitting GPU exists and is cleanly "cannot allocate"
elsewhere; the same selector without the guard aborts scheduling on a node whose GPU lacks
numaNode; and an "80Gi" threshold misses the "80GB" H100, as the README next to it warns."""

from __future__ import annotations

import copy
from typing import Any

from dra_driver.demo.stack import load_examples
from dra_driver.devcluster import Cluster, wait_until
from dra_driver.emulation import BUILTIN_PROFILES
from tests.cluster.test_allocation import (
    GPU,
    allocation,
    apply_deviceclasses,
    claim_and_pod,
    publish_node,
    request,
    stays_unallocated,
)
from tests.e2e.scenarios import EXAMPLES

# h100-l4-mixed fits with its third H100 (MIG off); dgx-a100-mig-on has no whole GPU in
# static MIG mode.
FITS = {"dgx-a100", "dgx-a100-mig", "dgx-h100", "h200", "a100-pcie-nvlink", "hgx-h100-fabric",
        "h100-l4-mixed", "hgx-h100-fabric-clique8", "hgx-h100-no-clique"}  # fmt: skip


def pinned_pod(pod: dict[str, Any], name: str, node: str) -> dict[str, Any]:
    out = copy.deepcopy(pod)
    out["metadata"]["name"] = name
    out["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return out


def scheduling(cluster: Cluster, ns: str, name: str) -> str | None:
    """``bound``, ``unschedulable``, or None while the scheduler has not decided."""
    pod = cluster.rest.get(f"/api/v1/namespaces/{ns}/pods/{name}")
    if pod["spec"].get("nodeName"):
        return "bound"
    for cond in pod.get("status", {}).get("conditions", []):
        if cond["type"] == "PodScheduled" and cond["status"] == "False":
            return "unschedulable"
    return None


def test_portable_example_schedules_on_every_profile(
    cluster: Cluster, cluster_namespace: str
) -> None:
    apply_deviceclasses(cluster)
    ns = cluster_namespace
    template, pod = load_examples(EXAMPLES / "portable-selectors.yaml", ns)
    cluster.apply(template)
    nodes = {p: publish_node(cluster, p).name for p in BUILTIN_PROFILES}
    for profile, node in nodes.items():
        cluster.apply(pinned_pod(pod, f"p-{profile}", node))
    for profile in nodes:
        decision = wait_until(
            lambda p=profile: scheduling(cluster, ns, f"p-{p}"), timeout=60,
            what=f"scheduling decision for {profile}",
        )  # fmt: skip
        assert decision == ("bound" if profile in FITS else "unschedulable"), profile
        if profile not in FITS:
            message = stays_unallocated_pod(cluster, ns, f"p-{profile}")
            assert "cannot allocate all claims" in message, message
            assert "CEL" not in message and "no such key" not in message, message


def stays_unallocated_pod(cluster: Cluster, ns: str, name: str) -> str:
    pod = cluster.rest.get(f"/api/v1/namespaces/{ns}/pods/{name}")
    (cond,) = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
    return str(cond.get("message", ""))


def test_unguarded_selector_aborts_scheduling_where_the_attribute_is_missing(
    cluster: Cluster, cluster_namespace: str
) -> None:
    apply_deviceclasses(cluster)
    ns = cluster_namespace
    t4 = publish_node(cluster, "t4")  # the T4's firmware reports no NUMA node
    unguarded = "device.attributes['gpu.nvidia.com'].numaNode >= 0"
    claim_and_pod(cluster, ns, "unguarded", [request("gpu", GPU, unguarded)],
                  {"kubernetes.io/hostname": t4.name})  # fmt: skip
    message = stays_unallocated(cluster, ns, "unguarded")
    assert "numaNode" in message, message  # a CEL runtime error, not "no fitting device"
    guarded = f"!('numaNode' in device.attributes['gpu.nvidia.com']) || {unguarded}"
    claim_and_pod(cluster, ns, "guarded", [request("gpu", GPU, guarded)],
                  {"kubernetes.io/hostname": t4.name})  # fmt: skip
    assert allocation(cluster, ns, "guarded") == [("gpu", t4.name, "gpu-0")]


def test_80gi_misses_the_80gb_h100(cluster: Cluster, cluster_namespace: str) -> None:
    apply_deviceclasses(cluster)
    ns = cluster_namespace
    h100 = publish_node(cluster, "dgx-h100")
    on = {"kubernetes.io/hostname": h100.name}
    mem = "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('{}')) >= 0"
    claim_and_pod(cluster, ns, "eighty", [request("gpu", GPU, mem.format("80Gi"))], on)
    stays_unallocated(cluster, ns, "eighty")
    claim_and_pod(cluster, ns, "seventy-nine", [request("gpu", GPU, mem.format("79Gi"))], on)
    assert allocation(cluster, ns, "seventy-nine")[0][1] == h100.name
