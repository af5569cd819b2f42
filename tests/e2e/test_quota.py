"""Per-namespace GPU quotas with ResourceQuota (deploy/examples/quota.yaml) on the real
control plane: the API server's quota admission and the controller-manager's quota
controller, with our DeviceClasses as the chart installs them. ResourceQuota counts
a namespace's claimed devices per DeviceClass, and ``requests.nvidia.com/gpu`` counts
both pods asking for the extended resource our ``gpu.nvidia.com`` class maps and claims
of that class. A claim or pod past the limit is refused when it is created, with the
quota's message; deleting one frees its share."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.demo.realgpu import RealGpuNode, keep_running
from dra_driver.demo.stack import RESOURCE_API, load_examples, pin_to_node
from dra_driver.devcluster import Cluster, wait_until
from dra_driver.devcluster.api import ApiError
from tests.e2e.scenarios import EXAMPLES

DEVICES = "gpu.nvidia.com.deviceclass.resource.k8s.io/devices"
EXTENDED = "requests.nvidia.com/gpu"


def gpu_claim(name: str, count: int = 1) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.nvidia.com", "count": count}}]}}}  # fmt: skip


def create_claim(cluster: Cluster, ns: str, claim: dict[str, Any]) -> None:
    cluster.rest.create(f"{RESOURCE_API}/namespaces/{ns}/resourceclaims", claim)


def quota_used(cluster: Cluster, ns: str, name: str = "gpu-quota") -> dict[str, str]:
    quota = cluster.rest.get(f"/api/v1/namespaces/{ns}/resourcequotas/{name}")
    return dict((quota.get("status") or {}).get("used") or {})


def wait_used(cluster: Cluster, ns: str, want: dict[str, str]) -> None:
    def matches() -> bool:
        used = quota_used(cluster, ns)
        return all(used.get(k) == v for k, v in want.items())

    wait_until(matches, timeout=30, what=f"quota usage {want} in {ns}",
               describe=lambda: str(quota_used(cluster, ns)))  # fmt: skip


def apply_quota(cluster: Cluster, ns: str, hard: dict[str, str] | None = None) -> None:
    """The example's ResourceQuota (optionally with other limits), once its controller
    has computed its usage: admission refuses everything it covers until then."""
    objs = load_examples(EXAMPLES / "quota.yaml", ns)
    (quota,) = [o for o in objs if o["kind"] == "ResourceQuota"]
    if hard is not None:
        quota["spec"]["hard"] = hard
    cluster.apply(quota)
    wait_until(lambda: quota_used(cluster, ns), timeout=30, what="quota status computed")


def test_claims_past_the_quota_are_refused_at_creation_until_one_is_deleted(
    cluster: Cluster, cluster_namespace: str, driver_objects: list[str]
) -> None:
    ns = cluster_namespace
    objs = load_examples(EXAMPLES / "quota.yaml", ns)
    assert [o["kind"] for o in objs] == ["ResourceQuota", "ResourceClaim", "ResourceClaim"]
    apply_quota(cluster, ns)
    for claim in objs[1:]:
        cluster.apply(claim)
    # Both ways of counting a GPU: devices of the class, and the extended resource it maps.
    wait_used(cluster, ns, {DEVICES: "2", EXTENDED: "2"})

    with pytest.raises(ApiError) as refused:
        create_claim(cluster, ns, gpu_claim("one-too-many"))
    err = refused.value
    assert err.status == 403, err
    assert str(err).endswith(
        f'"one-too-many" is forbidden: exceeded quota: gpu-quota, '
        f"requested: {DEVICES}=1,{EXTENDED}=1, used: {DEVICES}=2,{EXTENDED}=2, "
        f"limited: {DEVICES}=2,{EXTENDED}=2"
    ), err
    with pytest.raises(ApiError, match="404"):  # nothing was stored
        cluster.rest.get(f"{RESOURCE_API}/namespaces/{ns}/resourceclaims/one-too-many")
    # A MIG claim is another class: its own limit, untouched by the full GPUs.
    mig = gpu_claim("a-mig")
    mig["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "mig.nvidia.com"
    create_claim(cluster, ns, mig)

    # Deleting a claim frees its device: the controller recounts, admission lets it in.
    cluster.rest.delete(f"{RESOURCE_API}/namespaces/{ns}/resourceclaims/team-gpu-1")

    def admitted() -> bool:
        try:
            create_claim(cluster, ns, gpu_claim("one-too-many"))
        except ApiError as again:
            if again.status == 403 and "exceeded quota" in str(again):
                return False
            raise
        return True

    wait_until(admitted, timeout=30, what="the claim admitted once another was deleted",
               describe=lambda: str(quota_used(cluster, ns)))  # fmt: skip
    wait_used(cluster, ns, {DEVICES: "2", EXTENDED: "2"})

    # A claim of two devices counts as two.
    cluster.rest.delete(f"{RESOURCE_API}/namespaces/{ns}/resourceclaims/team-gpu-2")
    wait_used(cluster, ns, {DEVICES: "1"})
    with pytest.raises(ApiError, match="exceeded quota: gpu-quota"):
        create_claim(cluster, ns, gpu_claim("pair", count=2))

    # A claim from a template is checked when the controller creates it for the pod:
    # the pod waits, and its event carries the quota's message.
    cluster.apply([
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
         "metadata": {"name": "pair", "namespace": ns},
         "spec": {"spec": gpu_claim("pair", count=2)["spec"]}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pair-user", "namespace": ns},
         "spec": {"resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "pair"}],
                  "containers": [{"name": "main", "image": "busybox:1.36",
                                  "resources": {"claims": [{"name": "gpus"}]}}]}},
    ])  # fmt: skip

    def refused_for_pod() -> str:
        events = cluster.rest.get(
            f"/api/v1/namespaces/{ns}/events",
            {"fieldSelector": "involvedObject.name=pair-user,reason=FailedResourceClaimCreation"},
        )
        return " ".join(e.get("message", "") for e in events["items"])

    message = wait_until(refused_for_pod, timeout=30, what="the template claim refused")
    assert "exceeded quota: gpu-quota" in message, message
    assert cluster.rest.get(f"/api/v1/namespaces/{ns}/pods/pair-user")["status"]["phase"] == (
        "Pending"
    )
    cluster.rest.delete(f"/api/v1/namespaces/{ns}/pods/pair-user")


def test_pods_asking_for_nvidia_com_gpu_share_the_quota_with_claims(
    cluster: Cluster, cluster_namespace: str, l4_node: RealGpuNode
) -> None:
    """One GPU for the namespace: a plain ``nvidia.com/gpu`` pod runs on the real node
    with a GPU our plugin prepared, and then neither a claim of the class nor another
    such pod fits; once the pod is gone, a claim does."""
    ns, node = f"{cluster_namespace}-ext", l4_node
    cluster.create_namespace(ns)
    apply_quota(cluster, ns, {DEVICES: "1", EXTENDED: "1"})
    pod = load_examples(EXAMPLES / "extended-resource.yaml", ns)
    cluster.apply(keep_running(pin_to_node(pod, node.name)))
    run = node.run_pod(ns, "plain-gpu-pod")
    assert run.containers["main"].returncode is None
    assert len(node.cdi_specs()) == 1  # our plugin prepared its GPU
    wait_used(cluster, ns, {EXTENDED: "1", DEVICES: "1"})

    with pytest.raises(ApiError, match="exceeded quota: gpu-quota") as refused:
        create_claim(cluster, ns, gpu_claim("after-pod"))
    assert EXTENDED in str(refused.value) or DEVICES in str(refused.value)
    second = load_examples(EXAMPLES / "extended-resource.yaml", ns)[0]
    second["metadata"]["name"] = "second-gpu-pod"
    with pytest.raises(ApiError) as pod_refused:
        cluster.rest.create(f"/api/v1/namespaces/{ns}/pods", pin_to_node([second], node.name)[0])
    assert pod_refused.value.status == 403
    assert f"exceeded quota: gpu-quota, requested: {EXTENDED}=1" in str(pod_refused.value)

    node.delete_pod(ns, "plain-gpu-pod")
    wait_until(lambda: node.cdi_specs() == {}, timeout=30, what="the pod's GPU unprepared")

    def admitted() -> bool:
        try:
            create_claim(cluster, ns, gpu_claim("after-pod"))
        except ApiError as again:
            if again.status == 403:
                return False
            raise
        return True

    wait_until(admitted, timeout=30, what="a claim admitted once the pod was gone",
               describe=lambda: str(quota_used(cluster, ns)))  # fmt: skip
