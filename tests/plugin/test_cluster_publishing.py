"""Tier 2: the slice publisher and prepare path against the real control plane.

The plugin runs under the ServiceAccount of deploy/rbac with a token bound to
its Node, so a missing RBAC rule or a wrong admission policy fails here.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from dra_driver.devcluster import Cluster, wait_until
from dra_driver.plugin._proto import dra_v1_pb2, dra_v1_pb2_grpc
from dra_driver.plugin.kubeclient import KubeApiError, KubeClient
from dra_driver.plugin.resources import (
    Capacity,
    CounterConsumption,
    CounterSet,
    Device,
    Version,
)
from tests.plugin.clusterkit import PluginOnNode, our_slices, start_plugin_on_node, unique
from tests.plugin.fakes import FakeBackend

DRIVER = "gpu.tier2.example.com"
TIMEOUT = 30.0


def _gpu(i: int, **kw: Any) -> Device:
    return Device(
        f"gpu-{i}",
        attributes={"index": i, "model": "H100", "driverVersion": Version("580.95.5")},
        capacity={"memory": Capacity("80Gi")},
        **kw,
    )


@pytest.fixture
def running(cluster: Cluster, short_dir: Path) -> Iterator[tuple[PluginOnNode, FakeBackend]]:
    backend = FakeBackend(devices=(_gpu(0), _gpu(1)))
    on_node = start_plugin_on_node(
        cluster, driver=DRIVER, backend=backend, sockets_dir=short_dir, resync_interval_s=60
    )
    yield on_node, backend
    on_node.plugin.stop(grace_s=0, uninstall=True)


def _in_sync(on_node: PluginOnNode) -> Any:
    pub = on_node.plugin.publisher
    assert pub is not None
    return wait_until(
        lambda: pub.status if pub.status.in_sync else None,
        timeout=TIMEOUT,
        what="slices in sync",
        describe=lambda: str(pub.status),
    )


def test_publishes_the_pool_with_owner_and_pool_bookkeeping(
    cluster: Cluster, running: tuple[PluginOnNode, FakeBackend]
) -> None:
    on_node, _ = running
    status = _in_sync(on_node)
    slices = our_slices(cluster, DRIVER, on_node.node_name)
    assert len(slices) == 1 and status.slice_count == 1
    spec = slices[0]["spec"]
    assert spec["pool"] == {
        "name": on_node.node_name,
        "generation": status.generation,
        "resourceSliceCount": 1,
    }
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1"]
    assert spec["devices"][0]["attributes"]["driverVersion"] == {"version": "580.95.5"}
    owner = slices[0]["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "Node",
        on_node.node_name,
        on_node.node["metadata"]["uid"],
    )
    assert status.dropped_fields == ()


def test_slice_deleted_by_someone_else_is_recreated(
    cluster: Cluster, running: tuple[PluginOnNode, FakeBackend]
) -> None:
    on_node, _ = running
    _in_sync(on_node)
    (victim,) = our_slices(cluster, DRIVER, on_node.node_name)
    # What the kubelet does at start: delete every slice of the node.
    cluster.rest.delete(f"/apis/resource.k8s.io/v1/resourceslices/{victim['metadata']['name']}")
    t0 = time.monotonic()
    back = wait_until(
        lambda: [
            s
            for s in our_slices(cluster, DRIVER, on_node.node_name)
            if s["metadata"]["uid"] != victim["metadata"]["uid"]
        ],
        timeout=TIMEOUT,
        what="deleted slice to be re-created",
    )
    assert time.monotonic() - t0 < 10  # via the watch, not the 60 s resync
    assert [d["name"] for d in back[0]["spec"]["devices"]] == ["gpu-0", "gpu-1"]


def test_slice_edited_by_someone_else_is_repaired(
    cluster: Cluster, running: tuple[PluginOnNode, FakeBackend]
) -> None:
    on_node, _ = running
    _in_sync(on_node)
    (s,) = our_slices(cluster, DRIVER, on_node.node_name)
    s["spec"]["devices"] = s["spec"]["devices"][:1]
    cluster.rest.request(
        "PUT", f"/apis/resource.k8s.io/v1/resourceslices/{s['metadata']['name']}", s
    )
    wait_until(
        lambda: len(our_slices(cluster, DRIVER, on_node.node_name)[0]["spec"]["devices"]) == 2,
        timeout=TIMEOUT,
        what="edited slice to be repaired",
    )


def test_generation_kept_for_attribute_change_and_bumped_when_devices_or_slices_change(
    cluster: Cluster, running: tuple[PluginOnNode, FakeBackend]
) -> None:
    on_node, backend = running
    first = _in_sync(on_node)
    pub = on_node.plugin.publisher
    assert pub is not None

    # Same devices, one attribute changed: updated in place, same generation.
    backend.devices = tuple(
        Device(d.name, attributes={**d.attributes, "firmware": "2"}, capacity=d.capacity)
        for d in backend.devices
    )
    on_node.plugin.republish()
    wait_until(
        lambda: all(
            d["attributes"].get("firmware") == {"string": "2"}
            for d in our_slices(cluster, DRIVER, on_node.node_name)[0]["spec"]["devices"]
        ),
        timeout=TIMEOUT,
        what="changed attribute published",
    )
    (s,) = our_slices(cluster, DRIVER, on_node.node_name)
    assert s["spec"]["pool"]["generation"] == first.generation

    # A device appears: the inventory changed, so the pool moves to the next generation.
    backend.devices = (_gpu(0), _gpu(1), _gpu(2))
    on_node.plugin.republish()
    wait_until(
        lambda: len(our_slices(cluster, DRIVER, on_node.node_name)[0]["spec"]["devices"]) == 3,
        timeout=TIMEOUT,
        what="third device published",
    )
    (s,) = our_slices(cluster, DRIVER, on_node.node_name)
    assert s["spec"]["pool"]["generation"] == first.generation + 1

    backend.counter_sets = (CounterSet("gpu-0-mem", {"memory": "80Gi"}),)
    backend.devices = (
        _gpu(0, consumes_counters=(CounterConsumption("gpu-0-mem", {"memory": "80Gi"}),)),
    )
    on_node.plugin.republish()
    slices = wait_until(
        lambda: (
            lambda ss: (
                ss
                if len(ss) == 2
                and all(x["spec"]["pool"]["generation"] == first.generation + 2 for x in ss)
                else None
            )
        )(our_slices(cluster, DRIVER, on_node.node_name)),
        timeout=TIMEOUT,
        what="pool split into counter and device slices at a new generation",
    )
    assert [x["spec"]["pool"]["resourceSliceCount"] for x in slices] == [2, 2]
    assert "sharedCounters" in slices[0]["spec"] and "devices" in slices[1]["spec"]


def _allocated(cluster: Cluster, ns: str, name: str) -> Any:
    claim = cluster.rest.get(f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}")
    return claim if claim.get("status", {}).get("allocation") else None


def test_scheduler_allocates_from_the_published_pool_and_prepare_fetches_the_claim(
    cluster: Cluster, cluster_namespace: str, running: tuple[PluginOnNode, FakeBackend]
) -> None:
    on_node, backend = running
    # Counters force two slices: the device is only allocatable if the
    # scheduler sees the pool complete (counter slice + device slice).
    backend.counter_sets = (CounterSet("gpu-0-mem", {"memory": "80Gi"}),)
    backend.devices = (
        _gpu(0, consumes_counters=(CounterConsumption("gpu-0-mem", {"memory": "80Gi"}),)),
    )
    on_node.plugin.republish()
    wait_until(
        lambda: len(our_slices(cluster, DRIVER, on_node.node_name)) == 2,
        timeout=TIMEOUT,
        what="two slices",
    )
    cls = unique("tier2-class")
    cluster.apply(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": cls},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        }
    )
    ns = cluster_namespace
    cluster.apply(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "gpu", "namespace": ns},
            "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": cls}}]}},
        }
    )
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "namespace": ns},
            "spec": {
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu"}],
                "containers": [
                    {"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}
                ],
            },
        }
    )
    claim = wait_until(
        lambda: _allocated(cluster, ns, "gpu"),
        timeout=TIMEOUT,
        what="claim allocated by the scheduler",
    )
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"], result["device"]) == (
        DRIVER,
        on_node.node_name,
        "gpu-0",
    )

    uid = claim["metadata"]["uid"]
    with grpc.insecure_channel(f"unix:{on_node.plugin.paths.dra}") as ch:
        resp = dra_v1_pb2_grpc.DRAPluginStub(ch).NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(
                claims=[dra_v1_pb2.Claim(namespace=ns, name="gpu", uid=uid)]
            ),
            timeout=45,
        )
    entry = resp.claims[uid]
    assert entry.error == ""
    assert [(d.pool_name, d.device_name, list(d.request_names)) for d in entry.devices] == [
        (on_node.node_name, "gpu-0", ["g"])
    ]


def test_policy_pins_every_write_to_our_driver_our_node_and_our_pool(
    cluster: Cluster, running: tuple[PluginOnNode, FakeBackend]
) -> None:
    """RBAC cannot filter by field; the admission policy does, on the real API server:
    a node's plugin may write only slices of its own driver, on its own node, in the
    pool named after its node, and may not update or delete another node's slice."""
    on_node, _ = running
    _in_sync(on_node)
    node = on_node.node_name
    other = cluster.create_node(unique("other-node"))["metadata"]["name"]
    client = KubeClient.from_kubeconfig(str(on_node.kubeconfig))

    def slice_of(driver: str, node_name: str, pool: str, generation: int = 0) -> dict[str, Any]:
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": unique("s")},
            "spec": {"driver": driver, "nodeName": node_name, "devices": [],
                     "pool": {"name": pool, "generation": generation, "resourceSliceCount": 1}},
        }  # fmt: skip

    def refused(obj: dict[str, Any]) -> KubeApiError | None:
        """The API server loads new policies asynchronously: None while not enforced yet
        (then the slice is removed again as admin)."""
        try:
            created = client.create_resource_slice(obj)
        except KubeApiError as exc:
            return exc
        cluster.rest.delete(
            f"/apis/resource.k8s.io/v1/resourceslices/{created['metadata']['name']}"
        )
        return None

    foreign = "other.tier2.example.com"
    cases = [
        (slice_of(DRIVER, other, other), f"ResourceSlices of that node, not of node '{other}'"),
        (slice_of(foreign, node, node),
         f"of driver {DRIVER} or compute-domain.nvidia.com, not of driver '{foreign}'"),
        (slice_of(DRIVER, node, other, generation=99),
         f"may only write the pool named after its node, not pool '{other}'"),
    ]  # fmt: skip
    for obj, message in cases:
        error = wait_until(lambda o=obj: refused(o), timeout=TIMEOUT, what=f"refusal: {message}")
        assert error.status in (403, 422)
        assert message in error.message, error.message
    # Another node's slice of our driver (written by an admin): no update (its node and
    # pool are immutable anyway), no delete.
    theirs = cluster.rest.create("/apis/resource.k8s.io/v1/resourceslices",
                                 slice_of(DRIVER, other, other))  # fmt: skip
    bumped = {**theirs, "spec": {**theirs["spec"],
                                 "pool": {**theirs["spec"]["pool"], "generation": 99}}}  # fmt: skip
    with pytest.raises(KubeApiError, match=f"not of node '{other}'"):
        client.update_resource_slice(bumped)
    with pytest.raises(KubeApiError, match=f"not of node '{other}'"):
        client.delete_resource_slice(theirs["metadata"]["name"])
    cluster.rest.delete(f"/apis/resource.k8s.io/v1/resourceslices/{theirs['metadata']['name']}")
    # Its own: allowed (the plugin's publishing works: _in_sync above).
    created = client.create_resource_slice(slice_of(DRIVER, node, node))
    client.delete_resource_slice(created["metadata"]["name"])
    # And the plugin's identity has no rights beyond its role.
    for path in (
        "/api/v1/namespaces/kube-system/secrets",
        "/apis/resource.k8s.io/v1/resourceclaims",  # get by name only, no list
        "/api/v1/nodes",
    ):
        with pytest.raises(KubeApiError) as denied:
            client.request("GET", path)
        assert denied.value.status == 403, path
    client.close()


def test_stop_keeps_slices_and_uninstall_deletes_them(cluster: Cluster, short_dir: Path) -> None:
    backend = FakeBackend(devices=(_gpu(0),))
    on_node = start_plugin_on_node(cluster, driver=DRIVER, backend=backend, sockets_dir=short_dir)
    _in_sync(on_node)
    on_node.plugin.stop(grace_s=0)
    assert len(our_slices(cluster, DRIVER, on_node.node_name)) == 1  # restart keeps them
    on_node.plugin.stop(grace_s=0, uninstall=True)
    assert our_slices(cluster, DRIVER, on_node.node_name) == []
