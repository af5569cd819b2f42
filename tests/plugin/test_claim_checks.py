"""The claim reference is validated once, at the edge, by Kubernetes' rules; results from
another node's pool are refused; names never escape their URL path segment.

Regression tests for defects found by hostile probing (issue 11): D4 (another node's
pool prepared as the local device of the same name), D5 (``../`` in a name fetched a
claim of another namespace, or the Node object), D6 (the two layers validated UIDs with
different rules: upper case gave "not found" on prepare, another message on unprepare).
"""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.plugin._proto import dra_v1_pb2, dra_v1_pb2_grpc
from dra_driver.plugin.claims import ClaimError, ClaimRef, validate_ref
from dra_driver.plugin.kubeclient import KubeError
from tests.plugin.conftest import RunningPlugin, StartPlugin
from tests.plugin.fakes import DRIVER, FakeApiServer, claim_object

UID = "7777aaaa-0000-4000-8000-00000000000b"


def _call(run: RunningPlugin, method: str, namespace: str, name: str, uid: str) -> Any:
    claims = [dra_v1_pb2.Claim(namespace=namespace, name=name, uid=uid)]
    with run.channel() as ch:
        stub = dra_v1_pb2_grpc.DRAPluginStub(ch)
        if method == "prepare":
            req = dra_v1_pb2.NodePrepareResourcesRequest(claims=claims)
            return stub.NodePrepareResources(req, timeout=45).claims[uid]
        req2 = dra_v1_pb2.NodeUnprepareResourcesRequest(claims=claims)
        return stub.NodeUnprepareResources(req2, timeout=45).claims[uid]


def test_d4_a_result_from_another_nodes_pool_is_refused(start_plugin: StartPlugin) -> None:
    run = start_plugin()
    foreign = {"request": "gpu", "driver": DRIVER, "pool": "node-b", "device": "gpu-0"}
    run.api.add_claim(claim_object("c1", UID, results=[foreign]))
    outcome = _call(run, "prepare", "default", "c1", UID)
    assert "allocated from pool 'node-b', but this node's pool is 'node-a'" in outcome.error
    assert "'gpu-0'" in outcome.error and "request 'gpu'" in outcome.error
    assert run.backend.seen_claims == []  # never reached the GPU layer


@pytest.mark.parametrize(
    ("namespace", "name"),
    [
        ("default", "../../../api/v1/nodes/node-a"),
        ("../other-ns/resourceclaims", "c1"),
        ("default", "c1/../c2"),
        ("default", ".."),
        ("Default", "c1"),
        ("default", "C1"),
        ("default", "c" * 254),
        ("n" * 64, "c1"),
    ],
)
@pytest.mark.parametrize("method", ["prepare", "unprepare"])
def test_d5_names_that_are_not_kubernetes_names_never_reach_a_path(
    start_plugin: StartPlugin, namespace: str, name: str, method: str
) -> None:
    run = start_plugin()
    run.api.add_claim(claim_object("c2", UID))
    outcome = _call(run, method, namespace, name, UID)
    assert "is invalid: expected a DNS" in outcome.error
    publisher = ("/apis/resource.k8s.io/v1/resourceslices", "/api/v1/nodes/node-a")
    assert [p for _, p in run.api.requests if p not in publisher] == []  # no claim GET at all
    assert run.backend.seen_claims == [] and run.backend.unprepared == []


def test_d5_the_client_escapes_every_path_segment(api: FakeApiServer) -> None:
    client = api.client()
    try:
        assert client.get_resource_claim("default", "a/../../b") is None
        assert api.requests[-1][1].endswith("/namespaces/default/resourceclaims/a%2F..%2F..%2Fb")
        for bad in ("..", ".", ""):
            with pytest.raises(KubeError, match="cannot be an object name"):
                client.get_resource_claim("default", bad)
    finally:
        client.close()


@pytest.mark.parametrize("method", ["prepare", "unprepare"])
def test_d6_one_uid_rule_and_one_message_for_both_calls(
    start_plugin: StartPlugin, method: str
) -> None:
    run = start_plugin()
    upper = UID.upper()
    outcome = _call(run, method, "default", "c1", upper)
    assert outcome.error.startswith(f"claim uid {upper!r} is invalid: expected lower-case"), (
        outcome.error
    )
    assert not [p for _, p in run.api.requests if "resourceclaims" in p]


@pytest.mark.parametrize(
    ("ref", "field"),
    [
        (ClaimRef("default", "c1", "-bad"), "uid"),
        (ClaimRef("default", "c1", "a" * 64), "uid"),
        (ClaimRef("default", "c1", "x_y"), "uid"),
        (ClaimRef("kube-system.", "c1", "abc"), "namespace"),
        (ClaimRef("default", "c1.", "abc"), "name"),
    ],
)
def test_validate_ref_names_the_bad_field(ref: ClaimRef, field: str) -> None:
    with pytest.raises(ClaimError, match=rf"{field} '.*' is invalid"):
        validate_ref(ref)


def test_valid_kubernetes_names_pass() -> None:
    validate_ref(ClaimRef("kube-system", "my.claim-0", "0a1b2c3d-0000-4000-8000-000000000001"))
    validate_ref(ClaimRef("a", "b" * 253, "c" * 63))


def test_malformed_allocation_fields_are_named(start_plugin: StartPlugin) -> None:
    run = start_plugin()
    bad = {"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": 7}
    run.api.add_claim(claim_object("c1", UID, results=[bad]))
    outcome = _call(run, "prepare", "default", "c1", UID)
    assert "status.allocation.devices.results[0].device: expected str, got 7" in outcome.error
