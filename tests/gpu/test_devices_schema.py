"""The slices we emit (and our DeviceClasses) against the Kubernetes 1.34 and 1.37 schemas."""

from __future__ import annotations

import copy
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from dra_driver.commands.slices import resource_slices
from dra_driver.emulation import BUILTIN_PROFILES
from dra_driver.gpu.hardware.consumable import ConsumableGpus

VERSIONS = ("1.34", "1.37")
DEVICECLASSES = Path(__file__).parents[2] / "deploy" / "deviceclasses"


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("profile", BUILTIN_PROFILES)
def test_slices_match_the_api_schema(make_node, discover_node, profile: str, version: str) -> None:
    slices = resource_slices(
        discover_node(make_node(profile)),
        driver_name="gpu.nvidia.com",
        node_name="node-a",
        node_uid="8d9c6a5e-6a8a-4d7e-9b9e-2f1a3c4d5e6f",
    )
    # dgx-a100-mig-on has only MIG-mode GPUs without instances: nothing to offer statically.
    has_devices = all(s["spec"].get("devices") for s in slices)
    assert slices and has_devices == (profile != "dgx-a100-mig-on")
    for obj in slices:
        assert kubernetes_validate.validate(obj, version, strict=True) == version


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("profile", ["dgx-h100", "l4-x4"])
def test_consumable_gpus_match_the_api_schema(
    make_node, discover_node, profile: str, version: str
) -> None:
    slices = resource_slices(
        discover_node(make_node(profile)),
        driver_name="gpu.nvidia.com",
        node_name="node-a",
        consumable=ConsumableGpus(all=True),
    )
    devices = [d for s in slices for d in s["spec"]["devices"]]
    assert devices and all(d["allowMultipleAllocations"] for d in devices)
    for obj in slices:
        assert kubernetes_validate.validate(obj, version, strict=True) == version


@pytest.mark.parametrize("version", VERSIONS)
def test_slot_gpus_match_the_api_schema(make_node, discover_node, version: str) -> None:
    from dra_driver.gpu.hardware.consumable import MpsSlots

    slices = resource_slices(
        discover_node(make_node("l4-x4")),
        driver_name="gpu.nvidia.com",
        node_name="node-a",
        slots=MpsSlots.parse("NVIDIA L4=4"),
    )
    devices = [d for s in slices for d in s["spec"]["devices"]]
    assert devices and all(d["attributes"]["mpsSlots"] == {"int": 4} for d in devices)
    for obj in slices:
        assert kubernetes_validate.validate(obj, version, strict=True) == version


@pytest.mark.parametrize("version", VERSIONS)
def test_schema_check_is_not_a_no_op(make_node, discover_node, version: str) -> None:
    (obj,) = resource_slices(
        discover_node(make_node("t4")), driver_name="gpu.nvidia.com", node_name="n"
    )
    broken = copy.deepcopy(obj)
    broken["spec"]["devices"][0]["attributes"]["uuid"] = {"text": "GPU-x"}  # no such member
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, version, strict=True)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", ["gpu.nvidia.com", "mig.nvidia.com"])
def test_deviceclasses_match_the_api_schema(name: str, version: str) -> None:
    obj = yaml.safe_load((DEVICECLASSES / f"{name}.yaml").read_text())
    assert obj["metadata"]["name"] == name
    kind = "gpu" if name.startswith("gpu.") else "mig"
    assert obj["spec"]["selectors"] == [
        {"cel": {"expression": "device.driver == 'gpu.nvidia.com' && "
                 f"device.attributes['gpu.nvidia.com'].type == '{kind}'"}}
    ]  # fmt: skip
    kubernetes_validate.validate(obj, version, strict=True)
