"""``--shape minimal``: the driver's devices, slices and counters with one attribute
each, and claims rewritten onto it that select the same devices (by the scheduler's
CEL, :mod:`dra_driver.cel`) and fit as many times on a node."""

from __future__ import annotations

from typing import Any

import pytest

from bench.fleet.capacity import node_capacity
from bench.fleet.checks import request_selectors, selector_problem
from bench.fleet.claims import Shape, shape
from bench.fleet.pools import DriverFlags, api_devices, node_pool
from bench.fleet.run import FleetSettings, published
from dra_driver.cel import SelectorEvaluator
from dra_driver.gpu.hardware.consumable import ConsumableGpus
from dra_driver.plugin.resources import Pool
from dra_driver.plugin.slices import split_pool

CASES = [
    ("dgx-h100", DriverFlags(), "whole"),
    ("dgx-a100-mig", DriverFlags(), "mig:1g.10gb"),
    ("dgx-a100-mig-on", DriverFlags(mig_mode="dynamic"), "mig:7g.80gb"),
    ("dgx-a100-mig-on", DriverFlags(mig_mode="dynamic"), "whole"),
    ("dgx-h100", DriverFlags(consumable=ConsumableGpus(all=True)), "share:10Gi,25"),
    ("dgx-a100-mig", DriverFlags(), "first-available"),
]
IDS = ["h100-whole", "a100-static-mig", "a100-dynamic-7g-not-the-gpu-of-that-profile",
       "a100-dynamic-whole", "h100-consumable-share", "a100-first-available"]  # fmt: skip


def _both(
    profile: str, flags: DriverFlags, claim: str
) -> tuple[Shape, tuple[Pool, dict[str, Any], list[Any]], tuple[Pool, dict[str, Any], list[Any]]]:
    pool = node_pool(profile, flags)
    sh = shape(claim, api_devices(pool))
    runs = [published(FleetSettings(profile, claim=claim, flags=flags, shape=s), pool, sh)
            for s in ("driver", "minimal")]  # fmt: skip
    return sh, runs[0], runs[1]


def _split(pool: Pool) -> list[tuple[list[str], list[str]]]:
    return [
        ([s.name for s in c.counter_sets], [d.name for d in c.devices]) for c in split_pool(pool)
    ]


def _matching(pool: Pool, spec: dict[str, Any], classes: list[Any]) -> dict[str, set[str]]:
    evaluator = SelectorEvaluator()
    devices = api_devices(pool)
    return {
        request: {d["name"] for d in devices if selector_problem(evaluator, sels, d) is None}
        for request, sels in request_selectors(spec, classes).items()
    }


@pytest.mark.parametrize(("profile", "flags", "claim"), CASES, ids=IDS)
def test_minimal_pool_keeps_devices_slices_and_sharing_with_one_attribute(
    profile: str, flags: DriverFlags, claim: str
) -> None:
    sh, (driver, _, _), (minimal, _, _) = _both(profile, flags, claim)
    assert sh.minimal is not None
    assert [d.name for d in minimal.devices] == [d.name for d in driver.devices]
    assert _split(minimal) == _split(driver)
    assert minimal.counter_sets == driver.counter_sets
    for full, small in zip(driver.devices, minimal.devices, strict=True):
        assert list(small.attributes) == [sh.minimal.attribute]
        assert small.consumes_counters == full.consumes_counters
        assert small.allow_multiple_allocations == full.allow_multiple_allocations
        if full.allow_multiple_allocations:
            assert small.capacity == full.capacity
        else:
            assert set(small.capacity) == set(full.capacity) & set(sh.minimal.capacities)


@pytest.mark.parametrize(("profile", "flags", "claim"), CASES, ids=IDS)
def test_rewritten_claim_selects_the_same_devices_and_fits_as_often(
    profile: str, flags: DriverFlags, claim: str
) -> None:
    _, driver, minimal = _both(profile, flags, claim)
    wanted = _matching(*driver)
    assert all(wanted.values())
    assert _matching(*minimal) == wanted
    assert node_capacity(*minimal) == node_capacity(*driver)


def test_eight_aligned_has_no_minimal_form() -> None:
    with pytest.raises(ValueError, match="no minimal form"):
        _both("dgx-h100", DriverFlags(), "eight-aligned")
