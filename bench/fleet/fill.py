"""``--fill``: occupy a fraction of the fleet before the timed pods.

Two ways, same state for the scheduler (it counts a device as taken when any
claim's ``status.allocation`` names it, whether or not a pod uses the claim):

``allocated`` (default)
    The bench creates each fill claim and writes its ``status.allocation`` itself,
    as the project's allocator placed it on one node (:func:`~bench.fleet.capacity.
    node_allocations`, first fit in the scheduler's order), claim ``i`` on node
    ``i mod N``. No pods: kube-controller-manager deallocates a claim only when its
    last consumer leaves ``reservedFor``, never one that had none. Two writes per
    claim, in parallel: 7,200 fill claims at 1,000 nodes take about a minute.
``scheduled``
    Fill pods scheduled one by one through kube-scheduler like the timed pods: what
    the rows before 2026-11-29 07:00 UTC used, and hours for a 90 % fill of a large
    or finely shared fleet on two cores (docs/scale.md).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any, Literal

from bench.fleet.pools import DRIVER
from dra_driver.allocation.model import AllocatedDevice
from dra_driver.devcluster import Cluster

FillMode = Literal["allocated", "scheduled"]
RESOURCE = "/apis/resource.k8s.io/v1"


def allocation(node: str, held: Sequence[AllocatedDevice]) -> dict[str, Any]:
    """``status.allocation`` for devices of ``node``'s pool as the scheduler writes it:
    one result per device, a fresh ``shareID`` and ``consumedCapacity`` on shared ones,
    and a node selector on ``metadata.name``."""
    results = []
    for dev in held:
        result: dict[str, Any] = {
            "request": dev.request,
            "driver": DRIVER,
            "pool": node,
            "device": dev.device.device,
        }
        if dev.admin_access:
            result["adminAccess"] = True
        if dev.share_id:
            result["shareID"] = str(uuid.uuid4())
        if dev.consumed:
            result["consumedCapacity"] = {k: str(q) for k, q in dev.consumed.items()}
        results.append(result)
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return {"devices": {"results": results}, "nodeSelector": {"nodeSelectorTerms": [term]}}


def fill_allocated(
    cluster: Cluster,
    namespace: str,
    names: Sequence[str],
    nodes: Sequence[str],
    per_node: Sequence[Sequence[AllocatedDevice]],
    spec: dict[str, Any],
    in_parallel: Callable[[Callable[[str], None], Sequence[str]], None],
) -> None:
    """Create claims ``names`` with ``spec``, each already allocated: ``names[i]`` gets
    allocation ``i // len(nodes)`` of ``per_node`` on node ``i % len(nodes)``."""
    if len(names) > len(nodes) * len(per_node):
        raise ValueError(
            f"--fill: {len(names)} claims exceed the fleet's capacity of "
            f"{len(nodes) * len(per_node)}"
        )
    index = {name: i for i, name in enumerate(names)}
    base = f"{RESOURCE}/namespaces/{namespace}/resourceclaims"

    def make(name: str) -> None:
        i = index[name]
        node, held = nodes[i % len(nodes)], per_node[i // len(nodes)]
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": namespace}, "spec": spec}  # fmt: skip
        cluster.rest.create(base, body)
        cluster.rest.merge_patch(
            f"{base}/{name}/status", {"status": {"allocation": allocation(node, held)}}
        )

    in_parallel(make, names)
