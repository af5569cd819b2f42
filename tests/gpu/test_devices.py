"""Inventory -> published devices: NVIDIA's names and shapes, our extras, the API limits."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from dra_driver.emulation import BUILTIN_PROFILES
from dra_driver.gpu.hardware.devices import build_pool, driver_semver, quantity, semver
from dra_driver.plugin.resources import Capacity, DeviceTaint, Version
from dra_driver.plugin.slices import MAX_ATTRIBUTES_AND_CAPACITIES, validate_pool

DRIVER = "gpu.nvidia.com"


def _pool(make_node, discover_node, profile, **kw):
    return build_pool(discover_node(make_node(profile)), driver_name=DRIVER, **kw)


def test_full_gpu_device_is_nvidia_compatible_plus_extras(make_node, discover_node) -> None:
    node = make_node("dgx-a100")
    pool = build_pool(discover_node(node), driver_name=DRIVER)
    gpu = pool.devices[5]
    assert gpu.name == "gpu-5"
    assert gpu.attributes == {
        "type": "gpu",
        "uuid": node.profile.gpus[5].uuid,
        "productName": "NVIDIA A100-SXM4-80GB",
        "brand": "Nvidia",
        "architecture": "Ampere",
        "cudaComputeCapability": Version("8.0.0"),
        "driverVersion": Version("580.95.5"),
        "cudaDriverVersion": Version("13.0.0"),
        "resource.kubernetes.io/pciBusID": "0000:90:00.0",
        "resource.kubernetes.io/pcieRoot": "pci0000:80",
        "numaNode": 1,
        "resource.kubernetes.io/numaNode": 1,
        "index": 5,
        "minor": 5,
        "migCapable": True,
        "pcieGeneration": 4,
        "pcieLinkWidth": 16,
    }
    assert gpu.capacity == {"memory": Capacity("80Gi"), "multiprocessors": Capacity("108")}
    assert gpu.taints == () and gpu.consumes_counters == ()


def test_static_mig_device_is_nvidia_compatible(make_node, discover_node) -> None:
    node = make_node("dgx-a100-mig")
    pool = build_pool(discover_node(node), driver_name=DRIVER)
    by_name = {d.name: d for d in pool.devices}
    mig = by_name["gpu-4-mig-3g40gb-9-4"]
    parent = node.profile.gpus[4]
    assert mig.attributes == {
        "type": "mig",
        "uuid": parent.mig_instances[1].uuid,
        "parentUUID": parent.uuid,
        "profile": "3g.40gb",
        "productName": "NVIDIA A100-SXM4-80GB",
        "brand": "Nvidia",
        "architecture": "Ampere",
        "cudaComputeCapability": Version("8.0.0"),
        "driverVersion": Version("580.95.5"),
        "cudaDriverVersion": Version("13.0.0"),
        "resource.kubernetes.io/pciBusID": "0000:87:00.0",
        "resource.kubernetes.io/pcieRoot": "pci0000:80",
        "numaNode": 1,
        "resource.kubernetes.io/numaNode": 1,
    }
    assert mig.capacity == {
        "memory": Capacity("40192Mi"),
        "multiprocessors": Capacity("42"),
        "copyEngines": Capacity("3"),
        "decoders": Capacity("2"),
        "encoders": Capacity("0"),
        "jpegEngines": Capacity("0"),
        "ofaEngines": Capacity("0"),
        **{f"memorySlice{i}": Capacity("1") for i in range(4, 8)},
    }


def test_mig_mode_gpus_publish_their_mig_devices_instead_of_themselves(
    make_node, discover_node
) -> None:
    pool = _pool(make_node, discover_node, "dgx-a100-mig")
    names = [d.name for d in pool.devices]
    assert names == [
        "gpu-0-mig-3g40gb-9-0", "gpu-0-mig-2g20gb-14-4", "gpu-0-mig-1g10gb-19-6",
        *[f"gpu-1-mig-1g10gb-19-{s}" for s in range(7)],
        "gpu-2", "gpu-3",
        "gpu-4-mig-4g40gb-5-0", "gpu-4-mig-3g40gb-9-4",
        # GPU 5 is in MIG mode without instances: nothing usable to publish.
        "gpu-6", "gpu-7",
    ]  # fmt: skip
    assert sum(d.attributes["type"] == "gpu" for d in pool.devices) == 4


def test_names_use_minor_and_order_follows_it(make_node, discover_node) -> None:
    pool = _pool(make_node, discover_node, "l4-x4")
    assert [(d.name, d.attributes["index"], d.attributes["minor"]) for d in pool.devices] == [
        ("gpu-0", 2, 0), ("gpu-1", 3, 1), ("gpu-2", 0, 2), ("gpu-3", 1, 3)
    ]  # fmt: skip
    assert pool.devices[0].attributes["cudaComputeCapability"] == Version("8.9.0")
    assert pool.devices[0].capacity == {
        "memory": Capacity("23034Mi"),
        "multiprocessors": Capacity("58"),
    }


def test_unknown_facts_are_left_out_not_guessed(make_node, discover_node) -> None:
    pool = _pool(make_node, discover_node, "t4")  # firmware reports no NUMA node
    (t4,) = pool.devices
    assert "numaNode" not in t4.attributes
    assert "resource.kubernetes.io/numaNode" not in t4.attributes
    assert t4.attributes["migCapable"] is False and t4.attributes["brand"] == "Tesla"
    node = make_node("dgx-h100")
    node.library.inject_fault(1, "nvmlDeviceGetMaxPcieLinkWidth", pynvml.NVML_ERROR_UNKNOWN)
    h100 = build_pool(discover_node(node), driver_name=DRIVER).devices[1]
    assert "pcieLinkWidth" not in h100.attributes and h100.attributes["pcieGeneration"] == 5


def test_degraded_gpus_are_left_out_or_tainted(make_node, discover_node) -> None:
    node = make_node("dgx-a100-mig")
    node.library.inject_fault(3, "nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_GPU_IS_LOST)
    node.library.inject_fault(4, "nvmlDeviceGetCudaComputeCapability", pynvml.NVML_ERROR_UNKNOWN)
    node.library.inject_fault(6, "*", pynvml.NVML_ERROR_UNKNOWN)  # not even identifiable
    inventory = discover_node(node)
    omitted = [d.name for d in build_pool(inventory, driver_name=DRIVER).devices]
    assert "gpu-3" not in omitted and "gpu-6" not in omitted
    assert not any(n.startswith("gpu-4-") for n in omitted)
    assert {"gpu-2", "gpu-7", "gpu-0-mig-3g40gb-9-0"} <= set(omitted)
    tainted = build_pool(inventory, driver_name=DRIVER, taint_degraded=True).devices
    taint = DeviceTaint(key="gpu.nvidia.com/degraded", value="nvml-error", effect="NoSchedule")
    assert {d.name for d in tainted if d.taints == (taint,)} == {
        "gpu-3", "gpu-4-mig-4g40gb-5-0", "gpu-4-mig-3g40gb-9-4"
    }  # fmt: skip
    assert "gpu-6" not in {d.name for d in tainted}  # no UUID/minor: cannot be named
    validate_pool(build_pool(inventory, driver_name=DRIVER, taint_degraded=True))


@pytest.mark.parametrize("profile", BUILTIN_PROFILES)
def test_every_device_passes_the_api_limits(make_node, discover_node, profile: str) -> None:
    pool = _pool(make_node, discover_node, profile)
    validate_pool(pool)  # the plugin layer's own checks: names, qualified names, 32 limit, semver
    for device in pool.devices:
        assert len(device.attributes) + len(device.capacity) <= MAX_ATTRIBUTES_AND_CAPACITIES


def test_largest_devices_stay_within_32_attributes_and_capacities(
    make_node, discover_node, tmp_path: Path
) -> None:
    """Worst cases: a full GPU with every fact known (fabric member, NUMA node), and a
    7-slice MIG device (8 memory slices)."""
    profile = tmp_path / "h100-7g.yaml"
    profile.write_text(
        'name: h100-7g\ndriverVersion: "580.95.05"\ncudaDriverVersion: 13000\n'
        "fabric: {clusterUuid: 8f3a2c61-5d0e-4b7a-9c1e-2f6d8b4a0c17, cliqueId: 7}\ngpus:\n"
        "  - {model: H100-SXM5-80GB, busId: '0000:1b:00.0', pcieRoot: pci0000:16, numaNode: 0}\n"
        "  - model: H100-SXM5-80GB\n    busId: '0000:43:00.0'\n    pcieRoot: pci0000:3f\n"
        "    numaNode: 0\n"
        "    migEnabled: true\n    migInstances: [{profile: 7g.80gb, start: 0, giId: 0, ciId: 0}]\n"
    )
    full, mig = _pool(make_node, discover_node, profile).devices
    assert (len(full.attributes), len(full.capacity)) == (20, 2)
    assert full.attributes["nvlinkDomain"] == "8f3a2c61-5d0e-4b7a-9c1e-2f6d8b4a0c17.7"
    assert (len(mig.attributes), len(mig.capacity)) == (14, 15)
    assert "nvlinkDomain" not in mig.attributes  # MIG instances cannot use NVLink P2P
    assert len(mig.attributes) + len(mig.capacity) == 29 <= MAX_ATTRIBUTES_AND_CAPACITIES
    assert mig.capacity["multiprocessors"] == Capacity("132") and mig.capacity[
        "memory"
    ] == Capacity("81152Mi")


@pytest.mark.parametrize(
    ("value", "binary", "text"),
    [(85899345920, True, "80Gi"), (40192 * 2**20, True, "40192Mi"), (9728 * 2**20, True, "9728Mi"),
     (1536, True, "1536"), (1000, True, "1k"), (1023, True, "1023"), (108, False, "108"),
     (2000, False, "2k"), (0, False, "0"), (2**40, True, "1Ti")],
)  # fmt: skip
def test_quantities_are_canonical(value: int, binary: bool, text: str) -> None:
    assert quantity(value, binary=binary) == text


def test_versions_are_strict_semver() -> None:
    assert driver_semver("580.95.05") == Version("580.95.5")
    assert driver_semver("535.104.05") == Version("535.104.5")
    assert driver_semver("590.12") == Version("590.12.0")
    assert driver_semver("580.95.05-beta.1") == Version("580.95.5")
    assert semver(9, 0) == Version("9.0.0")
    assert semver(13, 0) == Version("13.0.0")


def test_me_profiles_are_named_as_nvidia_names_them(make_node, discover_node, tmp_path) -> None:
    profile = tmp_path / "me.yaml"
    profile.write_text(
        'name: me\ndriverVersion: "580.95.05"\ncudaDriverVersion: 13000\ngpus:\n'
        "  - model: A100-SXM4-80GB\n    busId: '0000:07:00.0'\n    pcieRoot: pci0000:00\n"
        "    migEnabled: true\n    migInstances: [{profile: 1g.10gb+me, start: 0, giId: 7}]\n"
    )
    (me,) = _pool(make_node, discover_node, profile).devices
    assert me.name == "gpu-0-mig-1g10gb-me-20-0"
    assert me.attributes["profile"] == "1g.10gb+me"
