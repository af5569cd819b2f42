"""The packer's node scores as pods land, and the search for the GPUs a list needs."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_driver.cel import SelectorEvaluator
from dra_driver.workload.modes import publish_shapes
from dra_driver.workload.packing import Packer
from dra_driver.workload.plans import smallest_fitting
from dra_driver.workload.trace import TraceNode, TracePod
from tests.workload.test_modes import _classes


def test_a_node_scores_anew_once_a_pod_lands_so_equal_pods_spread(tmp_path: Path) -> None:
    """LeastAllocated sends each of a run of equal pods to the emptier node: a score
    kept from before the last pod landed would tie the nodes and let the seeded tie
    break stack them."""
    nodes = [TraceNode(f"n{i}", 64000, 1 << 18, 1, "T4") for i in range(2)]
    pods = [TracePod(f"p{k}", 4000, 1024, 0, 0, ()) for k in range(10)]
    published = publish_shapes(nodes, "whole", pods, tmp_path)
    packer = Packer(nodes, published, _classes(), SelectorEvaluator())  # type: ignore[arg-type]
    for k, pod in enumerate(pods, 1):
        assert packer.place(pod)
        assert sorted(packer.cpu_free) == [64000 - 4000 * (k - k // 2), 64000 - 4000 * (k // 2)]


def _threshold(at: float, calls: list[float]):  # type: ignore[no-untyped-def]
    def fits(factor: float) -> tuple[bool, int]:
        calls.append(factor)
        return factor >= at, round(factor * 1000)

    return fits


@pytest.mark.parametrize(
    ("at", "guess", "known", "most"),
    [
        (1.137, 1.14, (1.0, False, 1000), 2),  # a good guess: itself and one step below
        (1.137, 1.13, (1.0, False, 1000), 2),  # just short: itself and one step above
        (1.137, 2.6, (1.0, False, 1000), 12),  # far too high: walks down, then bisects
        (1.137, 1.001, (1.0, False, 1000), 12),  # far too low: walks up, then bisects
        (0.43, 0.5, (1.0, True, 1000), 6),  # the cluster as it is places the list
    ],
)
def test_gpus_needed_are_found_to_the_step_from_any_guess(
    at: float, guess: float, known: tuple[float, bool, int], most: int
) -> None:
    calls: list[float] = []
    gpus, tried = smallest_fitting(_threshold(at, calls), guess, 0.02, 3.0, known)
    assert gpus is not None and at * 1000 <= gpus <= (at + 0.02) * 1000 + 1
    assert tried == len(calls) <= most
    assert len(set(calls)) == len(calls)  # no cluster packed twice


def test_gpus_needed_beyond_the_largest_cluster_tried_are_none() -> None:
    calls: list[float] = []
    gpus, tried = smallest_fitting(_threshold(3.5, calls), 1.2, 0.02, 3.0, (1.0, False, 1000))
    assert gpus is None
    assert max(calls) == 3.0 and tried == len(calls)
