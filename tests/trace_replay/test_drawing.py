"""The replay's inputs: the stratified node subset, the paper's seeded pod draw, the
claims the whole and consumable modes write, the resized clusters of ``plan``."""

from __future__ import annotations

from collections import Counter

import pytest

from bench.trace_replay.measuring import unusable_milli
from dra_driver.workload.claims import Claims
from dra_driver.workload.drawing import draw_pods, gpu_capacity_milli, resize_nodes, scale_nodes
from dra_driver.workload.modes import GpuModel, mode_of
from dra_driver.workload.trace import TraceNode, TracePod

GIB = 1 << 30


def _pod(name: str, num_gpu: int, milli: int, spec: tuple[str, ...] = ()) -> TracePod:
    return TracePod(name, 1000, 1024, num_gpu, milli, spec)


PODS = [_pod("cpu", 0, 0), _pod("half", 1, 500), _pod("one", 1, 1000), _pod("eight", 8, 1000)]


def _nodes() -> list[TraceNode]:
    shapes = [("G2", 8, 96000)] * 60 + [("T4", 2, 104000)] * 30 + [("", 0, 32000)] * 9
    shapes += [("A10", 1, 128000)]
    return [TraceNode(f"n{i:03d}", cpu, 1 << 18, g, m) for i, (m, g, cpu) in enumerate(shapes)]


@pytest.mark.parametrize("seed", [0, 42, 7])
def test_draw_reaches_each_target_with_the_pod_that_crosses_it(seed: int) -> None:
    capacity = 10_000
    draw = draw_pods(PODS, capacity, seed)
    running = 0
    totals = []
    for pod in draw.pods:
        running += pod.gpu_request_milli
        totals.append(running)
    for target, reached in zip((1.0, 1.3), draw.reached, strict=True):
        assert totals[reached - 1] >= target * capacity > totals[reached - 2]
    assert draw.reached[-1] == len(draw.pods)


def test_draw_is_deterministic_per_seed_and_samples_with_replacement() -> None:
    first, again, other = (draw_pods(PODS, 50_000, s) for s in (42, 42, 43))
    assert first == again
    assert first.pods != other.pods
    assert len(first.pods) > len(PODS)  # repeats: the list asks far less than the target
    assert set(Counter(p.name for p in first.pods)) == {p.name for p in PODS}


def test_draw_refuses_a_target_no_pod_can_reach() -> None:
    with pytest.raises(ValueError, match="no pod of the list asks for a GPU"):
        draw_pods([_pod("cpu", 0, 0)], 1000, 1)
    with pytest.raises(ValueError, match="no GPUs"):
        draw_pods(PODS, 0, 1)


def test_scaled_cluster_keeps_the_mix_of_models_and_gpu_counts() -> None:
    nodes = _nodes()
    tenth = scale_nodes(nodes, 0.1)
    assert len(tenth) == 10
    assert Counter((n.model, n.gpus) for n in tenth) == {("G2", 8): 6, ("T4", 2): 3, ("", 0): 1}
    assert tenth == scale_nodes(nodes, 0.1)  # no seed: the same scale, the same nodes
    assert scale_nodes(nodes, 1.0) == nodes
    assert gpu_capacity_milli(tenth) == 1000 * (6 * 8 + 3 * 2)
    with pytest.raises(ValueError, match="want 0 < scale <= 1"):
        scale_nodes(nodes, 1.5)


MODELS = {
    "T4": GpuModel("T4", "Tesla T4", 15 * GIB),
    "G2": GpuModel("G2", "Alibaba G2 (stand-in)", 80 * GIB),
}


def test_consumable_share_asks_its_compute_and_the_smallest_gpus_memory_fraction() -> None:
    claims = Claims("consumable", MODELS)
    exactly = claims.spec(_pod("s", 1, 470))["devices"]["requests"][0]["exactly"]
    # 47 % of a T4's 15360 MiB = 7219.2, rounded down so shares summing to a GPU fit
    assert exactly["capacity"]["requests"] == {"memory": "7219Mi", "computeShare": "47"}
    only_g2 = claims.spec(_pod("s", 1, 470, ("G2",)))["devices"]["requests"][0]["exactly"]
    assert only_g2["capacity"]["requests"]["memory"] == f"{80 * 1024 * 47 // 100}Mi"
    cel = "device.attributes['gpu.nvidia.com'].productName in ['Alibaba G2 (stand-in)']"
    assert only_g2["selectors"] == [{"cel": {"expression": cel}}]
    whole = claims.spec(_pod("w", 4, 1000))["devices"]["requests"][0]["exactly"]
    assert whole == {"deviceClassName": "gpu.nvidia.com", "count": 4}


def test_whole_mode_rounds_a_share_up_and_dedupes_templates() -> None:
    claims = Claims("whole", MODELS)
    names = {claims.template_for(p) for p in [_pod("a", 1, 470), _pod("b", 1, 100),
                                                _pod("c", 1, 1000)]}  # fmt: skip
    assert len(names) == 1
    (spec,) = claims.templates.values()
    assert spec == {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "gpu.nvidia.com"}}]}}  # fmt: skip


def test_an_unknown_mode_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match="'halves' is unknown; known: whole, consumable, slots"):
        mode_of("halves")


def test_a_resized_cluster_copies_whole_clusters_then_a_stratified_share() -> None:
    nodes = _nodes()
    bigger = resize_nodes(nodes, 2.1)
    assert len(bigger) == 210
    assert len({n.name for n in bigger}) == 210  # copies are renamed
    assert Counter((n.model, n.gpus) for n in bigger[200:]) == {("G2", 8): 6, ("T4", 2): 3,
                                                                 ("", 0): 1}  # fmt: skip
    assert resize_nodes(nodes, 0.1) == scale_nodes(nodes, 0.1)
    assert resize_nodes(nodes, 1.0) == nodes


@pytest.mark.parametrize(
    ("free", "num", "milli", "fits_host", "unusable"),
    [
        ([1000, 300, 600], 1, 500, True, 300),  # the 300 left on one GPU is too small
        ([1000, 300, 600], 1, 1000, True, 900),  # whole GPU: partly used ones are lost
        ([1000, 300, 600], 2, 1000, True, 1900),  # two whole GPUs: does not fit at all
        ([1000, 300], 1, 200, False, 1300),  # CPU or memory full: everything is lost
    ],
    ids=["share-skips-small-remainder", "whole-gpu-skips-partial", "too-few-whole", "host-full"],
)
def test_fragmentation_counts_free_gpu_a_pod_class_cannot_use(
    free: list[int], num: int, milli: int, fits_host: bool, unusable: int
) -> None:
    assert unusable_milli(free, num, milli, fits_host) == unusable
