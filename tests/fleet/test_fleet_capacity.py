"""``--fill`` counts the claims a node holds at once, not the devices that match: on a
dynamic-MIG pool placements share their GPU's counters."""

from __future__ import annotations

import pytest

from bench.fleet.capacity import node_capacity
from bench.fleet.claims import shape
from bench.fleet.pools import DriverFlags, api_devices, node_pool
from bench.fleet.run import deviceclasses

GPUS = 8


@pytest.mark.parametrize(
    ("claim", "per_gpu"),
    [("mig:1g.10gb", 7), ("mig:3g.40gb", 2), ("mig:7g.80gb", 1), ("mig:1g.10gb+me", 1),
     ("whole", 1), ("first-available", 1)],
    ids=["1g-seven-slices", "3g-two-halves", "7g-whole-gpu", "1g-me-one-media-set",
         "whole-gpu-not-its-placements", "first-available-gpus-first"],
)  # fmt: skip
def test_dynamic_mig_capacity_is_what_fits_at_once(claim: str, per_gpu: int) -> None:
    pool = node_pool("dgx-a100-mig-on", DriverFlags(mig_mode="dynamic"))
    devices = api_devices(pool)
    matching = sum(1 for d in devices if d["name"].startswith("gpu-0-mig-1g10gb-me"))
    assert matching == 7  # seven +me placements published per GPU, one media set
    assert node_capacity(pool, shape(claim, devices).spec, deviceclasses()) == per_gpu * GPUS


def test_a_claim_no_device_satisfies_names_the_allocators_reason() -> None:
    pool = node_pool("dgx-h100", DriverFlags())
    spec = shape("share:10Gi,25", api_devices(pool)).spec  # not published for sharing
    with pytest.raises(ValueError, match="cannot allocate"):
        node_capacity(pool, spec, deviceclasses())
