"""Fractional GPUs: which GPUs are consumable, their policies, what an allocation holds."""

from __future__ import annotations

import pytest

from dra_driver.gpu.hardware.consumable import ConsumableGpus
from dra_driver.gpu.hardware.devices import build_pool
from dra_driver.gpu.sharing.shares import (
    ShareError,
    can_enforce,
    consumable_pool,
    memory_max,
    share_of,
)
from dra_driver.plugin.resources import CapacityPolicy
from dra_driver.plugin.slices import validate_pool

DRIVER = "gpu.nvidia.com"
GIB = 1024**3


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("none", ConsumableGpus()),
        ("", ConsumableGpus()),
        ("all", ConsumableGpus(all=True)),
        (
            "NVIDIA L4, GPU-1234",
            ConsumableGpus(names=frozenset({"NVIDIA L4", "GPU-1234"})),
        ),
    ],
)
def test_the_flag_is_none_all_or_a_list_of_names(text: str, expected: ConsumableGpus) -> None:
    assert ConsumableGpus.parse(text) == expected


@pytest.mark.parametrize(
    ("text", "why"), [("a,,b", "an empty name"), ("all,NVIDIA L4", "stand alone")]
)
def test_a_bad_list_says_what_is_wrong(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        ConsumableGpus.parse(text)


def test_mixed_node_shares_only_full_gpus_the_selection_names(make_node, discover_node) -> None:
    inventory = discover_node(make_node("dgx-a100-mig"))
    pool = build_pool(inventory, driver_name=DRIVER)
    shared = consumable_pool(pool, inventory, ConsumableGpus(all=True))
    validate_pool(shared)
    multi = {d.name for d in shared.devices if d.allow_multiple_allocations}
    full = {f"gpu-{g.minor}" for g in inventory.gpus if not g.mig_enabled}
    assert multi == full and full  # MIG devices stay single-allocation
    assert all("-mig-" not in name for name in multi)
    gpu = next(d for d in shared.devices if d.name in multi)
    memory = gpu.capacity["memory"]
    assert memory.value == "80Gi"
    assert memory.policy == CapacityPolicy(
        default="80Gi", valid_range_min="1Mi", valid_range_max="80Gi", valid_range_step="1Mi"
    )
    assert gpu.capacity["computeShare"].value == "100"
    assert "multiprocessors" not in gpu.capacity
    assert consumable_pool(pool, inventory, ConsumableGpus()) is pool
    uuid = inventory.gpus[2].uuid
    one = consumable_pool(pool, inventory, ConsumableGpus(names=frozenset({uuid, "NVIDIA T4"})))
    assert [d.name for d in one.devices if d.allow_multiple_allocations] == ["gpu-2"]
    assert ConsumableGpus(names=frozenset({uuid, "NVIDIA T4"})).unmatched(inventory) == [
        "NVIDIA T4"
    ]


def test_max_memory_is_rounded_down_to_the_step(make_node, discover_node) -> None:
    inventory = discover_node(make_node("dgx-h100"))  # 81559 MiB: a whole number of MiB
    assert memory_max(81559 * 1024**2 + 5) == 81559 * 1024**2
    shared = consumable_pool(
        build_pool(inventory, driver_name=DRIVER), inventory, ConsumableGpus(all=True)
    )
    policy = shared.devices[0].capacity["memory"].policy
    assert policy is not None and policy.valid_range_max == "81559Mi"


def test_a_share_reads_what_the_scheduler_recorded(make_node, discover_node) -> None:
    gpu = discover_node(make_node("dgx-a100")).gpus[0]  # 80Gi
    s = share_of(gpu, {"memory": "20Gi", "computeShare": "0"}, "gpu-0")
    assert (s.memory_mib, s.compute, s.whole) == (20480, 0, False)
    assert s.thread_percentage == 25  # no SMs reserved: limited to its memory fraction
    assert share_of(gpu, {"memory": "10241Mi"}, "w").thread_percentage == 13  # rounded up
    assert share_of(gpu, {"memory": "1Gi", "computeShare": "60"}, "w").thread_percentage == 60
    assert share_of(gpu, {"memory": "80Gi", "computeShare": "0"}, "w").whole
    assert not share_of(gpu, {"memory": "80Gi", "computeShare": "30"}, "w").whole


@pytest.mark.parametrize(
    ("consumed", "why"),
    [
        ({}, "has no consumedCapacity.memory"),
        ({"memory": "1.5Mi"}, "not a whole number of MiB"),
        ({"memory": "16Gi"}, "between 1Mi and the GPU's 15Gi"),
        ({"memory": "1Gi", "computeShare": "101"}, "allowed 0..100"),
        ({"memory": "1Gi", "computeShare": "0.5"}, "not a whole number"),
        ({"memory": "lots"}, "consumedCapacity.memory: 'lots' is not a quantity"),
    ],
)
def test_an_unusable_allocation_is_refused_with_the_reason(
    make_node, discover_node, consumed: dict[str, str], why: str
) -> None:
    gpu = discover_node(make_node("t4")).gpus[0]
    with pytest.raises(ShareError, match=why):
        share_of(gpu, consumed, "gpu-0 share 1")


@pytest.mark.parametrize(
    ("version", "enforced"),
    [("580.95.05", False), ("614.99", False), ("615.10.01", True), ("620.1", True), ("", False)],
)
def test_enforcement_needs_r615(version: str, enforced: bool) -> None:
    assert can_enforce(version) is enforced
