"""How many claims of one shape a node holds at once, for ``--fill``.

Counting the devices a claim's selectors match over-counts wherever devices
overlap: dynamic-MIG placements share a GPU's counters (seven ``1g.10gb+me``
placements, one media-engine set: one fits), and ``first-available`` falls back
to MIG devices of GPUs it already took. So the count is what the project's
allocator (:mod:`dra_driver.allocation`, the scheduler's algorithm: slices by
name, devices in order, first fit, counters, consumable capacity and
constraints honoured; checked against kube-scheduler in
``tests/cluster/test_differential.py``) allocates on one node, claim after
claim, until one does not fit. Every node publishes the same pool, so the fleet
holds ``nodes`` times that.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench.fleet.pools import DRIVER
from dra_driver.allocation.inputs import build
from dra_driver.allocation.inventory import Inventory
from dra_driver.allocation.model import AllocatedDevice, parse_claim_spec
from dra_driver.allocation.simulation import Simulation, Workload
from dra_driver.allocation.state import AllocatedState
from dra_driver.cel import SelectorEvaluator, load_engine
from dra_driver.plugin.resources import Pool
from dra_driver.plugin.slices import slice_object, split_pool

NODE = "capacity-node"
LIMIT = 4096
"""Claims tried at most per node: a share of (almost) nothing would otherwise fit
without end on a consumable GPU."""


def node_slices(pool: Pool, node: str = NODE) -> list[dict[str, Any]]:
    """``pool`` as the ResourceSlices the publisher writes for ``node``."""
    contents = split_pool(pool)
    return [
        slice_object(driver=DRIVER, node_name=node, node_uid="", index=i, generation=1,
                     count=len(contents), content=c)
        for i, c in enumerate(contents)
    ]  # fmt: skip


def node_allocations(
    pool: Pool, spec: dict[str, Any], classes: Sequence[dict[str, Any]]
) -> list[list[AllocatedDevice]]:
    """The allocations of claims with ``spec`` that one node publishing ``pool`` holds at
    once, in the order the allocator made them (at most :data:`LIMIT`); raises
    ValueError with the allocator's reason when none fits. Every prefix is itself a
    state the scheduler could have reached, which ``--fill`` relies on."""
    inputs = build([*node_slices(pool), *classes])
    inventory = Inventory(
        inputs.slices, inputs.classes, inputs.implied_nodes(), SelectorEvaluator(load_engine())
    )
    simulation = Simulation(inventory, AllocatedState())
    held: list[list[AllocatedDevice]] = []
    while len(held) < LIMIT:
        claim = parse_claim_spec("fleet", f"capacity-{len(held)}", spec)
        outcome = simulation.allocate(Workload([claim]))[0]
        if not outcome.allocated:
            if not held:
                raise ValueError(outcome.reason)
            break
        held.append(list(claim.allocated or ()))
    return held


def node_capacity(pool: Pool, spec: dict[str, Any], classes: Sequence[dict[str, Any]]) -> int:
    """Claims with ``spec`` that one node publishing ``pool`` holds at once (at most
    :data:`LIMIT`); raises ValueError with the allocator's reason when none fits."""
    return len(node_allocations(pool, spec, classes))
