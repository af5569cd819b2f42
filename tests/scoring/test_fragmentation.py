"""The fragmentation score: what a placement strands, on hand-made node states."""

from __future__ import annotations

import pytest

from dra_driver.scoring.fragmentation import (
    Demand,
    NodeState,
    Scorer,
    Workload,
    first_fit,
    priorities,
    unusable,
)

SHARE = Demand(4000, 16000, share=500)
ONE = Demand(10000, 40000, gpus=1)
EIGHT = Demand(80000, 320000, gpus=8)


def test_unusable_counts_what_a_class_cannot_take() -> None:
    assert unusable((1000, 300, 600), SHARE) == 300  # the 300 GPU is too small
    assert unusable((300, 200), SHARE) == 500  # no GPU has 500 free: all of it
    assert unusable((1000, 300), ONE) == 300  # partly used GPUs are lost to whole pods
    assert unusable((1000,) * 7 + (0,), EIGHT) == 7000  # 7 untouched GPUs, 8 wanted


def test_first_fit_takes_the_first_gpus_that_fit() -> None:
    node = NodeState((200, 1000, 600), 8000, 32000)
    assert first_fit(node, SHARE) == NodeState((200, 500, 600), 4000, 16000)
    assert first_fit(node, ONE) is None  # CPU short
    roomy = NodeState((200, 1000, 1000), 64000, 1 << 20)
    assert first_fit(roomy, Demand(0, 0, gpus=2)) == NodeState((200, 0, 0), 64000, 1 << 20)
    assert first_fit(roomy, Demand(0, 0, gpus=3)) is None
    assert first_fit(roomy, Demand(0, 0, share=900)) == NodeState((200, 100, 1000), 64000, 1 << 20)


def test_a_share_prefers_a_used_gpu_to_an_untouched_big_node() -> None:
    scorer = Scorer(Workload.of([SHARE] * 6 + [ONE] * 3 + [EIGHT]))
    untouched = NodeState((1000,) * 8, 96000, 768000)
    used = NodeState((500, 0, 0, 0), 48000, 200000)
    on_used, on_untouched = scorer.increase(used, SHARE), scorer.increase(untouched, SHARE)
    assert on_used is not None and on_untouched is not None
    assert on_used < on_untouched  # breaking an 8-GPU node costs the 8-GPU pods its GPUs


def test_cpu_left_bounds_what_later_pods_can_use() -> None:
    """Two nodes alike in GPUs: on the one whose CPU the placement leaves short of a
    second one-GPU pod, a free GPU is stranded; on the other the share costs nothing."""
    scorer = Scorer(Workload.of([ONE]))
    pod = Demand(4000, 1000, share=500)
    short = NodeState((1000, 1000, 1000), 20000, 1 << 20)  # 2 one-GPU pods, then 1
    roomy = NodeState((1000, 1000, 1000), 24000, 1 << 20)  # 2 one-GPU pods, still 2
    assert scorer.increase(short, pod) == 500  # 2,500 free, 1,000 usable (was 1,000 of 3,000)
    assert scorer.increase(roomy, pod) == -500  # 2,000 of 2,500 usable, as before


def test_cpu_only_pods_score_by_the_gpus_their_cpu_would_strand() -> None:
    scorer = Scorer(Workload.of([ONE]))
    gpu_node = NodeState((1000, 1000), 20000, 1 << 20)
    cpu_node = NodeState((), 20000, 1 << 20)
    cpu_pod = Demand(8000, 1000)
    assert scorer.increase(cpu_node, cpu_pod) == 0
    assert (scorer.increase(gpu_node, cpu_pod) or 0) > 0  # 2 one-GPU pods fit before, 1 after


def test_workload_keeps_the_most_common_classes() -> None:
    w = Workload.of([SHARE] * 3 + [ONE] * 2 + [EIGHT] + [Demand(1000, 1000)], top=2)
    assert dict(w.classes) == {SHARE: pytest.approx(0.6), ONE: pytest.approx(0.4)}


def test_priorities_rank_least_increase_highest() -> None:
    assert priorities([0.0, 50.0, 100.0, None]) == [10, 5, 0, 0]
    assert priorities([7.0, 7.0]) == [10, 10]
    assert priorities([None, None]) == [0, 0]
