"""Dynamic MIG publishing: counters and every profile x placement, as the hardware allows."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest

from dra_driver.commands.slices import resource_slices
from dra_driver.emulation import load_profile
from dra_driver.emulation.migrules import MigRuleError
from dra_driver.emulation.migstate import MigState
from dra_driver.gpu.hardware.devices import build_pool
from dra_driver.gpu.hardware.partitions import (
    MigPartition,
    available,
    capacity,
    partitions,
    partitions_by_name,
)
from dra_driver.plugin.resources import Capacity, CounterConsumption, Device
from dra_driver.plugin.slices import (
    MAX_ATTRIBUTES_AND_CAPACITIES,
    MAX_DEVICES_RESTRICTED,
    split_pool,
    validate_pool,
)
from dra_driver.quantity import parse

DRIVER = "gpu.nvidia.com"
A100_GPU0 = [
    *[f"gpu-0-mig-1g10gb-19-{s}" for s in (6, 5, 4, 3, 2, 1, 0)],
    *[f"gpu-0-mig-1g10gb-me-20-{s}" for s in (6, 5, 4, 3, 2, 1, 0)],
    *[f"gpu-0-mig-1g20gb-15-{s}" for s in (6, 4, 2, 0)],
    *[f"gpu-0-mig-2g20gb-14-{s}" for s in (4, 2, 0)],
    "gpu-0-mig-3g40gb-9-4", "gpu-0-mig-3g40gb-9-0", "gpu-0-mig-4g40gb-5-0", "gpu-0-mig-7g80gb-0-0",
    "gpu-0",
]  # fmt: skip


def _dynamic(make_node, discover_node, profile: str | Path, **kw):  # type: ignore[no-untyped-def]
    inventory = discover_node(make_node(profile))
    return inventory, build_pool(inventory, driver_name=DRIVER, mig_mode="dynamic", **kw)


def test_dgx_a100_in_mig_mode_offers_26_devices_per_gpu(make_node, discover_node) -> None:
    _, pool = _dynamic(make_node, discover_node, "dgx-a100-mig-on")
    assert len(pool.devices) == 208 and len(pool.counter_sets) == 8
    names = [d.name for d in pool.devices]
    assert names[:26] == A100_GPU0
    assert names[26:52] == [n.replace("gpu-0", "gpu-1", 1) for n in A100_GPU0]
    (gpu0_set, *_) = pool.counter_sets
    assert gpu0_set.name == "gpu-0-counter-set"
    # SMs, copy engines and memory are left out: no set of placements on distinct memory
    # slices can overdraw them (the exhaustive test below proves nothing is lost).
    # Decoders stay: seven +me placements would take 7 of 5 (their instance counter
    # forbids that, but the bound ignores other counters and only keeps too much).
    assert gpu0_set.counters == {
        **{f"memory-slice-{i}": "1" for i in range(8)},
        "decoders": "5", "jpeg-engines": "1", "ofa-engines": "1", "profile-20-instances": "1",
    }  # fmt: skip
    by_name = {d.name: d for d in pool.devices}
    assert by_name["gpu-0-mig-2g20gb-14-2"].consumes_counters == (
        CounterConsumption(
            "gpu-0-counter-set", {"decoders": "1", "memory-slice-2": "1", "memory-slice-3": "1"}
        ),
    )
    assert by_name["gpu-0-mig-1g10gb-19-6"].consumes_counters == (
        CounterConsumption("gpu-0-counter-set", {"memory-slice-6": "1"}),
    )
    # No memorySlice<i> capacities on dynamic devices: the counters place them.
    assert not any(c.startswith("memorySlice") for d in pool.devices for c in d.capacity)
    # The whole GPU takes every counter of its own set, nothing of another GPU's.
    (whole,) = by_name["gpu-3"].consumes_counters
    assert whole.counter_set == "gpu-3-counter-set" and whole.counters == gpu0_set.counters
    me = by_name["gpu-0-mig-1g10gb-me-20-3"].consumes_counters[0].counters
    assert me["ofa-engines"] == me["jpeg-engines"] == me["profile-20-instances"] == "1"


def test_dynamic_devices_carry_the_static_attributes_without_a_uuid(
    make_node, discover_node
) -> None:
    inventory = discover_node(make_node("dgx-a100-mig"))
    static = {d.name: d for d in build_pool(inventory, driver_name=DRIVER).devices}
    dynamic = {
        d.name: d for d in build_pool(inventory, driver_name=DRIVER, mig_mode="dynamic").devices
    }
    # GPU 5 is in MIG mode and empty; GPU 4 has a static 3g.40gb at 4 to compare with.
    made, offered = static["gpu-4-mig-3g40gb-9-4"], dynamic["gpu-5-mig-3g40gb-9-4"]
    expected = {k: v for k, v in made.attributes.items() if k != "uuid"}
    expected.update(parentUUID=inventory.gpus[5].uuid, numaNode=1)
    expected["resource.kubernetes.io/numaNode"] = 1
    expected["resource.kubernetes.io/pciBusID"] = "0000:90:00.0"
    assert offered.attributes == expected and "uuid" not in offered.attributes
    # memory, SMs, engines; the static device's memorySlice4..7 are the counters' job here
    assert offered.capacity == {
        k: v for k, v in made.capacity.items() if not k.startswith("memorySlice")
    }
    assert len(offered.attributes) + len(offered.capacity) <= MAX_ATTRIBUTES_AND_CAPACITIES
    # The whole GPU: a plain GPU's attributes, the figures of the instance that spans it.
    whole = dynamic["gpu-5"]
    assert whole.attributes == static["gpu-2"].attributes | {
        k: whole.attributes[k]
        for k in ("uuid", "index", "minor", PCI_BUS_ID, PCIE_ROOT, "numaNode", STD_NUMA, "profile")
    }
    assert whole.attributes["type"] == "gpu" and whole.attributes["uuid"] == inventory.gpus[5].uuid
    # It says what it is prepared as: the full-GPU instance, picked from NVML's profiles.
    assert whole.attributes["profile"] == "7g.80gb"
    assert whole.capacity == {"memory": Capacity("79Gi"), "multiprocessors": Capacity("98")}


PCI_BUS_ID, PCIE_ROOT = "resource.kubernetes.io/pciBusID", "resource.kubernetes.io/pcieRoot"
STD_NUMA = "resource.kubernetes.io/numaNode"


def test_gpus_without_mig_mode_stay_plain_on_a_mixed_node(make_node, discover_node) -> None:
    inventory, pool = _dynamic(make_node, discover_node, "h100-l4-mixed")
    static = build_pool(inventory, driver_name=DRIVER)
    assert [s.name for s in pool.counter_sets] == ["gpu-0-counter-set", "gpu-1-counter-set"]
    names = [d.name for d in pool.devices]
    assert len(names) == 26 + 26 + 3 and names[-3:] == ["gpu-2", "gpu-3", "gpu-4"]
    plain = {d.name: d for d in static.devices}
    for device in pool.devices[-3:]:  # the H100 with MIG off and the two L4s: untouched
        assert device == plain[device.name] and not device.consumes_counters
    assert {d.attributes["productName"] for d in pool.devices[-2:]} == {"NVIDIA L4"}
    h100 = capacity(inventory.gpus[0])
    assert (h100["multiprocessors"], h100["decoders"], h100["jpeg-engines"]) == (132, 7, 7)
    published = pool.counter_sets[0].counters  # what can bind, at the same figures
    assert published == {c: str(v) for c, v in h100.items() if c in published}
    assert "multiprocessors" not in published and "memory-slice-7" in published
    validate_pool(pool)


def test_instances_we_did_not_create_are_kept_and_worked_around(
    make_node, discover_node, tmp_path: Path
) -> None:
    profile = tmp_path / "partly.yaml"
    profile.write_text(
        'name: partly\ndriverVersion: "580.95.05"\ncudaDriverVersion: 13000\ngpus:\n'
        "  - model: A100-SXM4-80GB\n    busId: '0000:07:00.0'\n    pcieRoot: pci0000:00\n"
        "    migEnabled: true\n"
        "    migInstances: [{profile: 1g.10gb+me, start: 1, giId: 8}, "
        "{profile: 2g.20gb, start: 4, giId: 5}]\n"
    )
    inventory, pool = _dynamic(make_node, discover_node, profile)
    names = [d.name for d in pool.devices]
    # Someone else's instances stay published as they are (static devices with UUIDs) ...
    assert names[:2] == ["gpu-0-mig-1g10gb-me-20-1", "gpu-0-mig-2g20gb-14-4"]
    assert all("uuid" in d.attributes and not d.consumes_counters for d in pool.devices[:2])
    # ... and only what fits around them is offered: no slice 1, 4 or 5, no second +me,
    # no whole GPU, nothing that needs slice 0..3 or 4..7 whole.
    assert names[2:] == [
        "gpu-0-mig-1g10gb-19-6", "gpu-0-mig-1g10gb-19-3", "gpu-0-mig-1g10gb-19-2",
        "gpu-0-mig-1g10gb-19-0", "gpu-0-mig-1g20gb-15-6", "gpu-0-mig-1g20gb-15-2",
        "gpu-0-mig-2g20gb-14-2",
    ]  # fmt: skip
    (counters,) = pool.counter_sets
    left = available(inventory.gpus[0]).counters
    assert "ofa-engines" not in left  # the +me instance holds the only one
    assert left["decoders"] == 3  # 5 - 1 (+me) - 1 (2g.20gb)
    # What fits around them takes at most 2 decoders: the counter is not published.
    assert "decoders" not in counters.counters
    assert set(counters.counters) == {f"memory-slice-{i}" for i in (0, 2, 3, 6, 7)}
    # Once those instances are known as ours (in the checkpoint) they are partitions again.
    owned = [(inventory.gpus[0].uuid, 20, 1), (inventory.gpus[0].uuid, 14, 4)]
    mine = build_pool(inventory, driver_name=DRIVER, mig_mode="dynamic", owned=owned)
    assert [d.name for d in mine.devices] == A100_GPU0
    assert set(partitions_by_name(inventory.gpus, owned)) == set(A100_GPU0)


@pytest.mark.parametrize("model", ["A100-SXM4-80GB", "H100-SXM5-80GB", "H200-SXM5-141GB"])
def test_counters_allow_exactly_what_the_hardware_allows(
    make_node, discover_node, tmp_path: Path, model: str
) -> None:
    """Every set of partitions the counters let the scheduler allocate together can be
    created on the (emulated) GPU, and every set the GPU can hold fits the counters."""
    profile = tmp_path / "one.yaml"
    profile.write_text(
        'name: one\ndriverVersion: "580.95.05"\ncudaDriverVersion: 13000\ngpus:\n'
        f"  - {{model: {model}, busId: '0000:07:00.0', pcieRoot: pci0000:00, migEnabled: true}}\n"
    )
    inventory = discover_node(make_node(profile))
    (gpu,) = inventory.gpus
    parts = [p for p in partitions(gpu) if not p.whole_gpu]
    # What is published, not the model: the counters left after the ones no set of
    # slice-disjoint placements can overdraw were dropped.
    pool = build_pool(inventory, driver_name=DRIVER, mig_mode="dynamic")
    (counter_set,) = pool.counter_sets
    cap = {c: int(parse(v)) for c, v in counter_set.counters.items()}
    published = {
        d.name: {c: int(parse(v)) for c, v in d.consumes_counters[0].counters.items()}
        for d in pool.devices
    }
    assert set(capacity(gpu)) - set(cap)  # some counter was dropped, or this proves nothing

    by_counters: set[frozenset[str]] = set()

    def fit(i: int, used: dict[str, int], chosen: tuple[str, ...]) -> None:
        by_counters.add(frozenset(chosen))
        for j in range(i, len(parts)):
            need = published[parts[j].name]
            if all(used.get(c, 0) + v <= cap[c] for c, v in need.items()):
                more = {c: used.get(c, 0) + need.get(c, 0) for c in cap}
                fit(j + 1, more, (*chosen, parts[j].name))

    fit(0, {}, ())
    state = MigState(load_profile(profile))
    egpu = state.profile.gpus[0]
    emulated = {p.id: p for p in egpu.model.mig_profiles}
    by_hardware: set[frozenset[str]] = set()

    def create(i: int, chosen: tuple[str, ...]) -> None:
        by_hardware.add(frozenset(chosen))
        for j in range(i, len(parts)):
            part: MigPartition = parts[j]
            try:
                gi = state.create_gpu_instance(
                    egpu, emulated[part.profile.gi_profile_id], part.placement.start,
                    part.placement.size,
                )  # fmt: skip
            except MigRuleError:
                continue
            create(j + 1, (*chosen, part.name))
            state.destroy_gpu_instance(egpu, gi.gi_id)

    create(0, ())
    assert len(by_hardware) > 1000  # the enumeration is real, not trivially small
    assert by_counters == by_hardware
    # The largest sets use all memory slices; no set fits an eighth memory slice of 1g.10gb.
    assert max(len(s) for s in by_hardware) == 7


def test_dynamic_pool_splits_within_the_api_limits(make_node, discover_node) -> None:
    inventory, pool = _dynamic(make_node, discover_node, "dgx-a100-mig-on")
    validate_pool(pool)
    contents = split_pool(pool)
    # Counter sets in their own slice (<= 8 per slice), then <= 64 counter-consuming devices.
    assert [len(c.counter_sets) for c in contents] == [8, 0, 0, 0, 0]
    assert [len(c.devices) for c in contents] == [0, 64, 64, 64, 16]
    assert all(len(c.devices) <= MAX_DEVICES_RESTRICTED for c in contents)
    slices = resource_slices(
        inventory, driver_name=DRIVER, node_name="node-a", node_uid="u-1", mig_mode="dynamic"
    )
    assert [s["spec"]["pool"]["resourceSliceCount"] for s in slices] == [5] * 5
    assert "devices" not in slices[0]["spec"] and len(slices[0]["spec"]["sharedCounters"]) == 8
    for obj in slices:
        kubernetes_validate.validate(obj, "1.37", strict=True)


def test_degraded_mig_gpu_is_left_out_or_tainted_whole(make_node, discover_node) -> None:
    import pynvml

    node = make_node("h100-l4-mixed")
    node.library.inject_fault(1, "nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_GPU_IS_LOST)
    inventory = discover_node(node)
    pool = build_pool(inventory, driver_name=DRIVER, mig_mode="dynamic")
    assert not any(d.name.startswith("gpu-1") for d in pool.devices)
    assert [s.name for s in pool.counter_sets] == ["gpu-0-counter-set"]
    tainted = build_pool(inventory, driver_name=DRIVER, mig_mode="dynamic", taint_degraded=True)
    gpu1: list[Device] = [d for d in tainted.devices if d.name.startswith("gpu-1")]
    assert len(gpu1) == 26 and all(d.taints for d in gpu1)
    validate_pool(tainted)


def test_compact_placements_carry_eight_attributes_and_the_same_counters(
    make_node, discover_node
) -> None:
    """``compact`` leaves off only what other attributes imply; the Go maps the control
    plane keeps per device stay within their first bucket (8 entries)."""
    inventory = discover_node(make_node("dgx-a100-mig-on"))
    full = build_pool(inventory, driver_name=DRIVER, mig_mode="dynamic")
    compact = build_pool(
        inventory, driver_name=DRIVER, mig_mode="dynamic", placement_attributes="compact"
    )
    assert [d.name for d in compact.devices] == [d.name for d in full.devices]
    assert compact.counter_sets == full.counter_sets
    for small, big in zip(compact.devices, full.devices, strict=True):
        assert (small.capacity, small.consumes_counters) == (big.capacity, big.consumes_counters)
        if big.attributes["type"] == "gpu":  # the whole GPU keeps everything
            assert small.attributes == big.attributes
            continue
        assert small.attributes == {
            k: v
            for k, v in big.attributes.items()
            if k not in ("brand", "architecture", "driverVersion", "cudaDriverVersion", "numaNode")
        }
        assert set(small.attributes) == {
            "type", "parentUUID", "profile", "productName", "cudaComputeCapability",
            PCI_BUS_ID, PCIE_ROOT, STD_NUMA,
        }  # fmt: skip
        assert len(small.capacity) <= 8
    # Static MIG devices are not placements: untouched.
    static = discover_node(make_node("dgx-a100-mig"))
    assert build_pool(static, driver_name=DRIVER, placement_attributes="compact") == build_pool(
        static, driver_name=DRIVER
    )
