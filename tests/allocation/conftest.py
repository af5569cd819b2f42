from __future__ import annotations

from typing import Any

import pytest

from dra_driver.allocation.inputs import build
from dra_driver.allocation.inventory import Inventory
from dra_driver.allocation.simulation import Simulation
from dra_driver.allocation.state import AllocatedState
from dra_driver.cel import SelectorEvaluator, load_engine


def simulate(
    objects: list[Any], node: str | None = None, engine: str | None = None
) -> dict[str, dict[str, Any]]:
    """Claim name -> the simulate JSON for it."""
    inputs = build(objects)
    inventory = Inventory(
        inputs.slices,
        inputs.classes,
        inputs.implied_nodes(),
        SelectorEvaluator(load_engine(engine)),
    )
    sim = Simulation(inventory, AllocatedState.from_claims(inputs.claims))
    return {o.claim.name: o.as_json() for o in sim.run(inputs.workloads, node)}


@pytest.fixture(params=["cel-expr-python", "cel-python"])
def sim(request: pytest.FixtureRequest):
    return lambda objects, node=None: simulate(objects, node, request.param)
