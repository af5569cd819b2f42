"""Splitting and client-side validation of pools (pure functions)."""

from __future__ import annotations

import pytest

from dra_driver.plugin.resources import (
    Capacity,
    CounterConsumption,
    CounterSet,
    Device,
    DeviceTaint,
    Pool,
    Version,
)
from dra_driver.plugin.slicediff import dropped_fields
from dra_driver.plugin.slices import (
    SliceValidationError,
    device_to_api,
    slice_index,
    slice_name,
    slice_object,
    split_pool,
    validate_pool,
)


def _devices(n: int, **kw: object) -> tuple[Device, ...]:
    return tuple(Device(f"gpu-{i}", **kw) for i in range(n))  # type: ignore[arg-type]


def test_plain_devices_fill_slices_of_128_in_order() -> None:
    contents = split_pool(Pool(devices=_devices(300)))
    assert [len(c.devices) for c in contents] == [128, 128, 44]
    names = [d.name for c in contents for d in c.devices]
    assert names == [f"gpu-{i}" for i in range(300)]


def test_slices_with_tainted_or_counter_consuming_devices_hold_at_most_64() -> None:
    sets = (CounterSet("gpu-0-mem", {"memory": "80Gi"}),)
    uses = (CounterConsumption("gpu-0-mem", {"memory": "10Gi"}),)
    tainted = _devices(100, taints=(DeviceTaint("maint", "NoSchedule"),))
    contents = split_pool(Pool(devices=tainted))
    assert [len(c.devices) for c in contents] == [64, 36]
    mig = _devices(130, consumes_counters=uses)
    contents = split_pool(Pool(devices=mig, counter_sets=sets))
    assert [len(c.counter_sets) for c in contents] == [1, 0, 0, 0]
    assert [len(c.devices) for c in contents] == [0, 64, 64, 2]


def test_counter_sets_go_in_their_own_slices_at_most_8_each() -> None:
    sets = tuple(CounterSet(f"gpu-{i}", {"memory": "80Gi"}) for i in range(20))
    contents = split_pool(Pool(counter_sets=sets, devices=_devices(2)))
    assert [len(c.counter_sets) for c in contents] == [8, 8, 4, 0]
    assert all(not c.devices for c in contents[:3])


def test_empty_pool_still_publishes_one_empty_slice() -> None:
    contents = split_pool(Pool())
    assert len(contents) == 1 and not contents[0].devices and not contents[0].counter_sets


def test_slice_names_sort_in_index_order_and_round_trip() -> None:
    names = [slice_name("gpu.example.com", "node-a", i) for i in (0, 1, 2, 10, 16, 255)]
    assert sorted(names) == names
    assert [slice_index(n) for n in names] == [0, 1, 2, 10, 16, 255]
    assert slice_index("node-a-gpu.example.com-abcde") is None
    long = slice_name("d" * 63, "n" * 253, 3)
    assert len(long) <= 253 and slice_index(long) == 3


def test_slice_object_has_pool_bookkeeping_and_node_owner() -> None:
    obj = slice_object(
        driver="gpu.example.com",
        node_name="node-a",
        node_uid="uid-1",
        index=1,
        generation=7,
        count=3,
        content=split_pool(Pool(devices=_devices(1)))[0],
    )
    assert obj["spec"]["pool"] == {"name": "node-a", "generation": 7, "resourceSliceCount": 3}
    assert obj["spec"]["nodeName"] == "node-a"
    assert obj["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "uid-1", "controller": True}
    ]


def test_device_attributes_map_to_api_types() -> None:
    d = Device(
        "gpu-0",
        attributes={"index": 0, "mig": False, "model": "H100", "driverVersion": Version("580.1.0")},
        capacity={"memory": Capacity("80Gi")},
    )
    assert device_to_api(d) == {
        "name": "gpu-0",
        "attributes": {
            "index": {"int": 0},
            "mig": {"bool": False},
            "model": {"string": "H100"},
            "driverVersion": {"version": "580.1.0"},
        },
        "capacity": {"memory": {"value": "80Gi"}},
    }


@pytest.mark.parametrize(
    ("pool", "expected"),
    [
        pytest.param(
            Pool(devices=(Device("GPU_0"),)),
            "devices[0].name: 'GPU_0' is not a DNS label",
            id="device-name",
        ),
        pytest.param(Pool(devices=(Device("a"), Device("a"))), "is used twice", id="duplicate"),
        pytest.param(
            Pool(devices=(Device("a", attributes={"bad name": 1}),)),
            "attributes['bad name']: name must be a C identifier",
            id="attr-name",
        ),
        pytest.param(
            Pool(devices=(Device("a", attributes={"Bad_Domain/x": 1}),)),
            "domain must be a DNS subdomain",
            id="attr-domain",
        ),
        pytest.param(
            Pool(devices=(Device("a", attributes={"s": "x" * 65}),)),
            "string is 65 characters; at most 64",
            id="string-length",
        ),
        pytest.param(
            Pool(devices=(Device("a", attributes={"v": Version("1.2")}),)),
            "version '1.2' is not strict semver",
            id="semver",
        ),
        pytest.param(
            Pool(
                devices=(
                    Device(
                        "a",
                        attributes={f"a{i}": i for i in range(30)},
                        capacity={f"c{i}": Capacity("1") for i in range(3)},
                    ),
                )
            ),
            "30 attributes + 3 capacities; at most 32",
            id="too-many-attributes",
        ),
        pytest.param(
            Pool(
                devices=(
                    Device("a", consumes_counters=(CounterConsumption("nope", {"memory": "1"}),)),
                )
            ),
            "'nope' is not a counter set of the pool",
            id="dangling-counter-set",
        ),
        pytest.param(
            Pool(
                counter_sets=(CounterSet("s", {"memory": "1"}),),
                devices=(
                    Device("a", consumes_counters=(CounterConsumption("s", {"cores": "1"}),)),
                ),
            ),
            "set 's' has no such counter",
            id="dangling-counter",
        ),
        pytest.param(
            Pool(
                counter_sets=(CounterSet("s", {"memory": "1"}),),
                devices=(Device("a", consumes_counters=(CounterConsumption("s", {}),)),),
            ),
            "consumesCounters[0].counters: 0 counters; allowed 1..32",
            id="empty-consumption",
        ),
    ],
)
def test_validation_names_field_and_rule(pool: Pool, expected: str) -> None:
    with pytest.raises(SliceValidationError) as err:
        validate_pool(pool)
    assert any(expected in p for p in err.value.problems), err.value.problems


def test_valid_pool_passes_and_qualified_names_are_accepted() -> None:
    validate_pool(
        Pool(
            devices=(
                Device(
                    "gpu-0",
                    attributes={"resource.kubernetes.io/pciBusID": "0000:3b:00.0", "uuid": "GPU-1"},
                ),
            )
        )
    )


def test_dropped_fields_reports_paths_missing_from_the_stored_object() -> None:
    sent = {"devices": [{"name": "a", "taints": [{"key": "k"}], "allowMultipleAllocations": True}]}
    stored = {"devices": [{"name": "a"}]}
    assert dropped_fields(sent, stored) == {
        "devices[].taints",
        "devices[].allowMultipleAllocations",
    }
    assert dropped_fields(sent, sent) == set()
