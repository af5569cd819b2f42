"""The generation rule of one slice sync (pure): which slices are deleted, updated in
place or rewritten under a new generation."""

from __future__ import annotations

from typing import Any

from dra_driver.plugin.resources import Device
from dra_driver.plugin.slicediff import SyncPlan, content_to_api_view, plan_sync
from dra_driver.plugin.slices import SliceContent, slice_name

DRIVER, NODE = "gpu.nvidia.com", "node-a"


def contents(*devices: str | Device) -> list[SliceContent]:
    """Two devices per slice (the real split puts up to 128 in one)."""
    ds = [d if isinstance(d, Device) else Device(d) for d in devices]
    return [SliceContent(devices=tuple(ds[i : i + 2])) for i in range(0, len(ds), 2)]


def stored(plan_objs: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    """What the server would hold after the writes: each with a resourceVersion."""
    out = []
    for i, obj in enumerate(plan_objs):
        obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(100 + i)}}
        out.append(obj)
    return out


def same_content(have: dict[str, Any], want: dict[str, Any]) -> bool:
    return content_to_api_view(have["spec"]) == content_to_api_view(want["spec"])


def plan(items: list[dict[str, Any]], want: list[SliceContent], generation: int) -> SyncPlan:
    return plan_sync(
        items, want, driver=DRIVER, node=NODE, node_uid="uid-1",
        generation=generation, up_to_date=same_content,
    )  # fmt: skip


def test_first_sync_creates_every_slice_under_generation_zero() -> None:
    first = plan([], contents("gpu-0", "gpu-1", "gpu-2"), -1)
    assert [o["spec"]["pool"]["generation"] for o in first.create] == [0, 0]
    assert [o["spec"]["pool"]["resourceSliceCount"] for o in first.create] == [2, 2]
    assert not first.update and not first.delete


def test_unchanged_pool_writes_nothing() -> None:
    want = contents("gpu-0", "gpu-1", "gpu-2")
    items = stored(plan([], want, -1).create)
    again = plan(items, want, 0)
    assert again.in_sync and again.generation == 0


def test_one_slice_changed_in_place_keeps_the_generation() -> None:
    items = stored(plan([], contents("gpu-0", "gpu-1", "gpu-2"), -1).create)
    tainted = contents("gpu-0", "gpu-1", Device("gpu-2", attributes={"x": 1}))
    step = plan(items, tainted, 0)
    assert step.generation == 0
    assert [o["metadata"]["name"] for o in step.update] == [slice_name(DRIVER, NODE, 1)]
    assert step.update[0]["metadata"]["resourceVersion"] == "101"
    assert not step.create and not step.delete


def test_a_new_device_bumps_the_generation_and_rewrites_all() -> None:
    items = stored(plan([], contents("gpu-0", "gpu-1", "gpu-2"), -1).create)
    step = plan(items, contents("gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4"), 0)
    assert step.generation == 1
    assert len(step.update) == 2 and len(step.create) == 1
    assert {o["spec"]["pool"]["generation"] for o in (*step.update, *step.create)} == {1}
    assert {o["spec"]["pool"]["resourceSliceCount"] for o in step.update} == {3}


def test_foreign_and_surplus_slices_are_deleted() -> None:
    items = stored(plan([], contents("gpu-0", "gpu-1", "gpu-2"), -1).create)
    stray = {**items[0], "metadata": {**items[0]["metadata"], "name": "somebody-else"}}
    step = plan([*items, stray], contents("gpu-0"), 0)
    assert {o["metadata"]["name"] for o in step.delete} == {
        "somebody-else",
        slice_name(DRIVER, NODE, 1),
    }
    assert step.generation == 1
