"""MPS slots (``--mps-slots``): the flag, and what a slot GPU is published as."""

from __future__ import annotations

import logging

import pytest

from dra_driver.allocation.capacity import consumption, fits, violates_policy
from dra_driver.allocation.model import CapacityPolicy as ModelPolicy
from dra_driver.allocation.model import DeviceCapacity
from dra_driver.gpu.hardware.consumable import ConsumableGpus, MpsSlots
from dra_driver.gpu.hardware.devices import build_pool
from dra_driver.gpu.sharing.slots import Slot, capacities, fractional_pool, say_fractional
from dra_driver.plugin.resources import Capacity, CapacityPolicy
from dra_driver.plugin.slices import validate_pool
from dra_driver.quantity import Quantity
from dra_driver.quantity import parse as parse_quantity

DRIVER = "gpu.nvidia.com"
MIB = 1024 * 1024


def test_the_flag_is_none_or_name_equals_count() -> None:
    assert MpsSlots.parse("none") == MpsSlots() == MpsSlots.parse("")
    assert not MpsSlots.parse("none")
    parsed = MpsSlots.parse("NVIDIA L4=4, GPU-0c9f=2")
    assert parsed.counts == (("NVIDIA L4", 4), ("GPU-0c9f", 2))


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("NVIDIA L4", "is not <product name or GPU UUID>=<N>"),
        ("=4", "is not <product name or GPU UUID>=<N>"),
        ("NVIDIA L4=1", "NVIDIA L4=1: the number of slots must be a whole number from 2 to 64"),
        ("NVIDIA L4=65", "from 2 to 64"),
        ("NVIDIA L4=four", "NVIDIA L4=four: the number of slots must be"),
        ("NVIDIA L4=2.5", "must be a whole number"),
        ("NVIDIA L4=4,NVIDIA L4=2", "NVIDIA L4 is named twice"),
        ("NVIDIA L4=4,,GPU-1=2", "'' is not"),
    ],
)
def test_a_bad_value_names_the_flag_and_what_is_allowed(text: str, why: str) -> None:
    with pytest.raises(ValueError, match="--mps-slots") as err:
        MpsSlots.parse(text)
    assert why in str(err.value)


def test_a_uuid_wins_over_the_product_name(make_node, discover_node) -> None:
    inventory = discover_node(make_node("l4-x4"))
    first, other = inventory.gpus[0], inventory.gpus[1]
    slots = MpsSlots.parse(f"NVIDIA L4=4,{first.uuid}=2")
    assert slots.slots_of(first) == 2 and slots.slots_of(other) == 4


def test_slot_gpus_publish_one_slot_policies_and_the_count(make_node, discover_node) -> None:
    inventory = discover_node(make_node("l4-x4"))
    pool = build_pool(inventory, driver_name=DRIVER)
    published = fractional_pool(pool, inventory, ConsumableGpus(), MpsSlots.parse("NVIDIA L4=4"))
    validate_pool(published)
    for device in published.devices:
        assert device.allow_multiple_allocations
        assert device.attributes["mpsSlots"] == 4
        assert "multiprocessors" not in device.capacity
        memory, compute = device.capacity["memory"], device.capacity["computeShare"]
        assert memory.value == "23034Mi"  # L4: 23034 MiB
        assert memory.policy == CapacityPolicy(default="5758Mi", valid_values=("5758Mi",))
        assert compute.value == "100"
        assert compute.policy == CapacityPolicy(default="25", valid_values=("25",))


def _model(cap: Capacity) -> DeviceCapacity:
    """A published capacity as the allocator reads it."""
    p = cap.policy
    assert p is not None and p.default is not None
    return DeviceCapacity(
        Quantity(parse_quantity(cap.value)),
        ModelPolicy(
            default=Quantity(parse_quantity(p.default)),
            valid_values=tuple(Quantity(parse_quantity(v)) for v in p.valid_values),
        ),
    )


@pytest.mark.parametrize("n", range(2, 65))
def test_n_slots_fit_and_one_more_never_does(n: int) -> None:
    """The published policies under the allocator's capacity rules (the scheduler's): a
    claim asking nothing gets one slot, not the whole GPU; N fit, N + 1 never do."""
    gpu_memory = 23034 * MIB  # the smallest GPU we model (L4); bigger ones only fit better
    slot = Slot(count=n, gpu_memory=gpu_memory)
    assert slot.exact
    caps = {name: _model(c) for name, c in capacities(slot).items()}
    one = consumption(None, caps)
    assert one is not None
    assert one["memory"].value == slot.memory and one["computeShare"].value == 100 // n
    taken = {name: q.value * (n - 1) for name, q in one.items()}
    assert fits(None, caps, taken)  # the N-th slot
    taken = {name: q.value * n for name, q in one.items()}
    assert not fits(None, caps, taken)  # no N + 1-th
    more = consumption({"memory": Quantity(parse_quantity("40Gi"))}, caps)
    assert more is not None and violates_policy(more["memory"], caps["memory"])


def test_a_gpu_too_small_for_its_count_is_not_split() -> None:
    assert not Slot(count=64, gpu_memory=4031 * MIB).exact  # 62 MiB slots: 65 x 62 = 4030
    assert Slot(count=64, gpu_memory=4029 * MIB).exact  # 62 MiB slots: a 65th does not fit
    assert Slot(count=64, gpu_memory=8192 * MIB).exact


def test_slots_win_over_consumable_and_mig_gpus_are_never_slots(
    make_node, discover_node, caplog: pytest.LogCaptureFixture
) -> None:
    inventory = discover_node(make_node("dgx-a100-mig"))
    full = [g for g in inventory.gpus if not g.mig_enabled]
    mig = [g for g in inventory.gpus if g.mig_enabled]
    assert full and mig
    product = full[0].product_name
    slots = MpsSlots.parse(f"{product}=8,{mig[0].uuid}=2,NVIDIA T4=4")
    consumable = ConsumableGpus(all=True)
    pool = build_pool(inventory, driver_name=DRIVER)
    published = fractional_pool(pool, inventory, consumable, slots)
    validate_pool(published)
    by_name = {d.name: d for d in published.devices}
    for gpu in full:
        device = by_name[f"gpu-{gpu.minor}"]
        assert device.attributes.get("mpsSlots") == 8
        assert device.capacity["computeShare"].policy == CapacityPolicy("12", ("12",))
    for gpu in mig:
        device = by_name.get(f"gpu-{gpu.minor}")
        assert device is None or "mpsSlots" not in device.attributes
    with caplog.at_level(logging.WARNING):
        say_fractional(consumable, slots, inventory, logging.getLogger("test"))
    said = caplog.text
    assert "--mps-slots names no GPU of this node: NVIDIA T4" in said
    assert f"{mig[0].uuid} is in MIG mode; it is not split into slots" in said
    assert f"{full[0].uuid} is selected by --consumable-gpus and --mps-slots" in said


def test_slot_memory_is_rounded_down_to_a_mib() -> None:
    slot = Slot(count=3, gpu_memory=80 * 1024 * MIB)
    assert slot.memory == 27306 * MIB and slot.percent == 33
    assert parse_quantity("27306Mi") == slot.memory
