"""Consumable capacity: request policies are checked like the API server does, and sent
in the API's shape (the apiserver tier proves the server accepts what passes here)."""

from __future__ import annotations

import pytest

from dra_driver.plugin.resources import Capacity, CapacityPolicy, Device, Pool
from dra_driver.plugin.slices import SliceValidationError, device_to_api, validate_pool

GPU_MEMORY = Capacity(
    "80Gi",
    CapacityPolicy(
        default="80Gi", valid_range_min="1Mi", valid_range_max="80Gi", valid_range_step="1Mi"
    ),
)
COMPUTE = Capacity("100", CapacityPolicy(default="0", valid_values=("0", "25", "50", "100")))


def shared(**capacity: Capacity) -> Device:
    return Device("gpu-0", capacity=capacity, allow_multiple_allocations=True)


def problems(device: Device) -> list[str]:
    with pytest.raises(SliceValidationError) as err:
        validate_pool(Pool(devices=(device,)))
    return err.value.problems


def test_a_multi_allocatable_device_is_sent_with_its_policies() -> None:
    device = shared(memory=GPU_MEMORY, computeShare=COMPUTE)
    validate_pool(Pool(devices=(device,)))
    assert device_to_api(device) == {
        "name": "gpu-0",
        "capacity": {
            "memory": {
                "value": "80Gi",
                "requestPolicy": {
                    "default": "80Gi",
                    "validRange": {"min": "1Mi", "max": "80Gi", "step": "1Mi"},
                },
            },
            "computeShare": {
                "value": "100",
                "requestPolicy": {"default": "0", "validValues": ["0", "25", "50", "100"]},
            },
        },
        "allowMultipleAllocations": True,
    }


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        pytest.param(
            CapacityPolicy(default="1Gi", valid_values=("1Gi",), valid_range_min="1Mi"),
            "validValues and validRange are exclusive",
            id="both-kinds",
        ),
        pytest.param(
            CapacityPolicy(valid_range_min="1Mi"), "default: required", id="range-without-default"
        ),
        pytest.param(
            CapacityPolicy(default="1Gi", valid_range_max="2Gi"),
            "validRange.min: required",
            id="max-without-min",
        ),
        pytest.param(
            CapacityPolicy(default="1Gi", valid_values=("2Gi", "1Gi")),
            "must be ascending",
            id="values-descending",
        ),
        pytest.param(
            CapacityPolicy(default="3Gi", valid_values=("1Gi", "2Gi")),
            "default: 3Gi is not one of validValues",
            id="default-not-a-value",
        ),
        pytest.param(
            CapacityPolicy(default="1Gi", valid_values=tuple(f"{i}Gi" for i in range(1, 12))),
            "11 values; at most 10",
            id="too-many-values",
        ),
        pytest.param(
            CapacityPolicy(default="1Gi", valid_values=("1Gi", "81Gi")),
            "81Gi is above the capacity",
            id="value-above-capacity",
        ),
        pytest.param(
            CapacityPolicy(default="1Gi", valid_range_min="1Gi", valid_range_max="81Gi"),
            "<= the capacity",
            id="max-above-capacity",
        ),
        pytest.param(
            CapacityPolicy(default="512Mi", valid_range_min="1Gi"),
            "default: 512Mi is outside validRange",
            id="default-below-min",
        ),
        pytest.param(
            CapacityPolicy(
                default="1Gi", valid_range_min="1Mi", valid_range_max="80Gi", valid_range_step="3Mi"
            ),
            "validRange.max: not min (1Mi) plus a whole number of steps (3Mi)",
            id="max-off-step",
        ),
        pytest.param(
            CapacityPolicy(default="1500Ki", valid_range_min="1Mi", valid_range_step="1Mi"),
            "default: not min (1Mi) plus a whole number of steps",
            id="default-off-step",
        ),
        pytest.param(
            CapacityPolicy(default="80Gi", valid_range_min="80Gi", valid_range_step="1Mi"),
            "min + step <= the capacity",
            id="one-step-beyond",
        ),
        pytest.param(
            CapacityPolicy(default="lots", valid_range_min="1Mi"),
            "default: 'lots' is not a quantity",
            id="not-a-quantity",
        ),
    ],
)
def test_invalid_policies_are_refused_naming_the_field(
    policy: CapacityPolicy, expected: str
) -> None:
    found = problems(shared(memory=Capacity("80Gi", policy)))
    assert len(found) == 1, found
    assert found[0].startswith("devices[0].capacity['memory'].requestPolicy")
    assert expected in found[0]


def test_a_policy_needs_a_multi_allocatable_device() -> None:
    device = Device("gpu-0", capacity={"memory": GPU_MEMORY})
    assert problems(device) == [
        "devices[0].capacity['memory'].requestPolicy: only allowed on a device with "
        "allowMultipleAllocations"
    ]


def test_capacity_values_must_be_quantities() -> None:
    assert problems(Device("gpu-0", capacity={"memory": Capacity("80 GB")})) == [
        "devices[0].capacity['memory'].value: '80 GB' is not a quantity (examples: 80Gi, 100, 1Mi)"
    ]
