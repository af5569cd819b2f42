"""MPS slots on the real scheduler: one L4 of an emulated l4-x4 node is published with
``--mps-slots <its UUID>=4`` (``mpsSlots: 4``, one-slot request policies). Four claims
that ask for nothing get four distinct slots of it; the fifth stays pending with the
scheduler's reason; a claim asking for more than a slot is never allocated; deleting a
slot frees exactly one."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.devcluster import Cluster
from dra_driver.gpu.hardware.consumable import MpsSlots
from tests.cluster.test_allocation import (
    DRIVER,
    GPU,
    apply_deviceclasses,
    emulated_inventory,
    stays_unallocated,
)
from tests.cluster.test_consumable import claim_and_pod, delete, published_node, result

SLOT = {"memory": "5758Mi", "computeShare": "25"}
"""One of four slots of an L4 (23034 MiB / 4, rounded down to a MiB; 100 % / 4)."""


@pytest.fixture(scope="module")
def slot_gpu(cluster: Cluster) -> tuple[str, str]:
    """``(node name, published name of its one slot GPU)``."""
    apply_deviceclasses(cluster)
    inventory = emulated_inventory("l4-x4")
    gpu = inventory.gpus[1]
    name = published_node(cluster, inventory, "slots", slots=MpsSlots.parse(f"{gpu.uuid}=4"))
    return name, f"gpu-{gpu.minor}"


def slot(
    cluster: Cluster, ns: str, name: str, node: str, capacity: dict[str, str] | None = None
) -> None:
    """A claim for a slot (any GPU of ``node`` split into 4, by the CEL attribute) and a
    pod using it."""
    attrs = f"device.attributes['{DRIVER}']"
    # A GPU without the attribute: "in" first (a missing key is an error, not false).
    cel = f"'mpsSlots' in {attrs} && {attrs}.mpsSlots == 4"
    exactly: dict[str, Any] = {"deviceClassName": GPU, "selectors": [{"cel": {"expression": cel}}]}
    claim_and_pod(cluster, ns, name, node, exactly, capacity)


def test_four_slots_then_the_fifth_waits_with_the_schedulers_reason(
    cluster: Cluster, cluster_namespace: str, slot_gpu: tuple[str, str]
) -> None:
    node, device = slot_gpu
    ns = cluster_namespace
    slots = {}
    for i in range(4):
        slot(cluster, ns, f"slot-{i}", node)
        slots[i] = result(cluster, ns, f"slot-{i}")
    assert {r["device"] for r in slots.values()} == {device}
    assert len({r["shareID"] for r in slots.values()}) == 4  # four distinct shares
    assert all(r["consumedCapacity"] == SLOT for r in slots.values())  # one slot, not the GPU

    slot(cluster, ns, "slot-4", node)
    reason = stays_unallocated(cluster, ns, "slot-4")
    assert "cannot allocate all claims" in reason, reason

    delete(cluster, ns, "slot-2")  # one slot free: the fifth gets it
    assert result(cluster, ns, "slot-4")["consumedCapacity"] == SLOT
    slot(cluster, ns, "big", node, {"memory": "8Gi"})  # more than a slot: never
    delete(cluster, ns, "slot-3")
    reason = stays_unallocated(cluster, ns, "big")
    assert "cannot allocate all claims" in reason, reason
    slot(cluster, ns, "small", node, {"memory": "1Gi"})  # less: rounded up to one slot
    assert result(cluster, ns, "small")["consumedCapacity"] == SLOT
    for name in ("slot-0", "slot-1", "slot-4", "big", "small"):
        delete(cluster, ns, name)
