"""The chart's ComputeDomain CRDs on the real kube-apiserver: manifests written for
NVIDIA's driver (the shape of its imex channel-injection examples) and our examples are
accepted, defaults are filled in, and bad domains are refused naming the field."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from dra_driver.computedomain import names
from dra_driver.devcluster import ApiError, Cluster
from tests.cluster.computedomains import CD_API, ROOT, domain, install_crds

EXAMPLES = ROOT / "deploy" / "examples"


@pytest.fixture(scope="module")
def crds(cluster: Cluster, cluster_namespace: str) -> Iterator[None]:
    """The CRDs; the domains made here are deleted after (no controller runs meanwhile,
    so none has a finalizer), or a later module's controller would set them up."""
    install_crds(cluster)
    yield
    cluster.rest.request("DELETE", f"{CD_API}/namespaces/{cluster_namespace}/{names.DOMAIN_PLURAL}")


def create(cluster: Cluster, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
    return cluster.rest.create(f"{CD_API}/namespaces/{namespace}/{names.DOMAIN_PLURAL}", obj)


@pytest.mark.parametrize("mode", [None, "All"], ids=["single", "all"])
def test_nvidia_s_channel_injection_domains_are_accepted(
    cluster: Cluster, cluster_namespace: str, crds: None, mode: str | None
) -> None:
    """NVIDIA's channel-injection(-all).yaml: numNodes 1, a template name, All or no mode."""
    channel: dict[str, Any] = {"resourceClaimTemplate": {"name": "imex-channel-0"}}
    if mode:
        channel["allocationMode"] = mode
    obj = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
           "metadata": {"name": f"imex-channel-injection-{mode or 'single'}".lower()},
           "spec": {"numNodes": 1, "channel": channel}}  # fmt: skip
    stored = create(cluster, cluster_namespace, obj)
    assert stored["spec"]["numNodes"] == 1
    assert stored["spec"]["channel"]["allocationMode"] == (mode or "Single")  # the default


@pytest.mark.parametrize("example", ["compute-domain.yaml", "compute-domain-all-channels.yaml"])
def test_our_examples_domains_are_accepted(
    cluster: Cluster, cluster_namespace: str, crds: None, example: str
) -> None:
    for obj in yaml.safe_load_all((EXAMPLES / example).read_text()):
        if obj and obj["kind"] == names.DOMAIN_KIND:
            stored = create(cluster, cluster_namespace, obj)
            assert stored["spec"]["channel"]["allocationMode"] in ("Single", "All")
        elif obj:  # the pods: valid for the API server as written (dry run)
            cluster.rest.request(
                "POST", f"/api/v1/namespaces/{cluster_namespace}/pods", obj,
                query={"dryRun": "All"},
            )  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "field", "says"),
    [
        pytest.param({"numNodes": 1, "channel": {}}, "spec.channel.resourceClaimTemplate",
                     "Required value", id="no-template"),
        pytest.param({"numNodes": 1, "channel": {"resourceClaimTemplate": {}}},
                     "spec.channel.resourceClaimTemplate.name", "Required value", id="no-name"),
        pytest.param({"numNodes": 1}, "spec.channel", "Required value", id="no-channel"),
        pytest.param({"numNodes": -1, "channel": {"resourceClaimTemplate": {"name": "t"}}},
                     "spec.numNodes", "greater than or equal to 0", id="negative-nodes"),
        pytest.param({"numNodes": "two", "channel": {"resourceClaimTemplate": {"name": "t"}}},
                     "spec.numNodes", "integer", id="nodes-not-int"),
        pytest.param({"channel": {"resourceClaimTemplate": {"name": "t"},
                                  "allocationMode": "Many"}},
                     "spec.channel.allocationMode", '"Single", "All"', id="bad-mode"),
        pytest.param({"channel": {"resourceClaimTemplate": {"name": "Not_A_Name"}}},
                     "spec.channel.resourceClaimTemplate.name", "should match", id="bad-name"),
    ],
)  # fmt: skip
def test_bad_domains_are_refused_naming_the_field(
    cluster: Cluster, cluster_namespace: str, crds: None, spec: dict[str, Any], field: str,
    says: str,
) -> None:  # fmt: skip
    obj = {**domain("bad", "t"), "spec": spec}
    with pytest.raises(ApiError) as err:
        create(cluster, cluster_namespace, obj)
    assert err.value.status == 422
    assert field in str(err.value), err.value
    assert says in str(err.value), err.value


def test_a_domain_s_spec_cannot_change(
    cluster: Cluster, cluster_namespace: str, crds: None
) -> None:
    create(cluster, cluster_namespace, domain("fixed", "fixed-channel"))
    path = f"{CD_API}/namespaces/{cluster_namespace}/{names.DOMAIN_PLURAL}/fixed"
    with pytest.raises(ApiError) as err:
        cluster.rest.merge_patch(path, {"spec": {"channel": {"allocationMode": "All"}}})
    assert err.value.status == 422
    assert "spec is immutable" in str(err.value)


def test_status_is_a_subresource(cluster: Cluster, cluster_namespace: str, crds: None) -> None:
    """A write to the object ignores status; only /status sets it (the controller's)."""
    create(cluster, cluster_namespace, domain("sub", "sub-channel"))
    path = f"{CD_API}/namespaces/{cluster_namespace}/{names.DOMAIN_PLURAL}/sub"
    cluster.rest.merge_patch(path, {"status": {"status": "Ready"}})
    assert "status" not in cluster.rest.get(path)
    cluster.rest.merge_patch(f"{path}/status", {"status": {"status": "Ready", "nodes": []}})
    assert cluster.rest.get(path)["status"]["status"] == "Ready"
    with pytest.raises(ApiError) as err:
        cluster.rest.merge_patch(f"{path}/status", {"status": {"status": "Fine"}})
    assert "status.status" in str(err.value)


def test_the_deviceclasses_select_the_node_side_s_devices(cluster: Cluster, crds: None) -> None:
    for name, kind in ((names.DAEMON_CLASS, "daemon"), (names.CHANNEL_CLASS, "channel")):
        stored = cluster.rest.get(f"/apis/resource.k8s.io/v1/deviceclasses/{name}")
        expression = stored["spec"]["selectors"][0]["cel"]["expression"]
        assert f"device.driver == '{names.DRIVER_NAME}'" in expression
        assert f".type == '{kind}'" in expression
