"""What each sharing mode needs for a workload: the allocation rate at 100 % and 130 % of
the GPU capacity requested, and the GPUs needed to place it.

The same input as the trace replay (the nodes scaled by ``scale``, the pods drawn with
``seed`` until 100 % and then 130 % of the GPU capacity is requested), the same slices
(:func:`~dra_driver.workload.modes.publish_shapes`) and claims
(:class:`~dra_driver.workload.claims.Claims`), placed by
:class:`~dra_driver.workload.packing.Packer`. GPUs needed: the smallest proportionally
resized cluster (:func:`~dra_driver.workload.drawing.resize_nodes`) on which the 100 %
list leaves at most 1 % of its pods unschedulable, by bisection on the factor (to
``step`` of the cluster); the allocation rate is what each mode packs on the cluster as
it is.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_driver.allocation.model import DeviceClass
from dra_driver.cel import SelectorEvaluator
from dra_driver.scoring.fragmentation import Demand, Scorer, Workload
from dra_driver.workload.drawing import draw_pods, gpu_capacity_milli, resize_nodes
from dra_driver.workload.modes import Mode, Published, publish_shapes
from dra_driver.workload.packing import Outcome, Packer, Scoring
from dra_driver.workload.trace import TraceNode, TracePod

UNSCHEDULABLE_MAX = 0.01
"""At most this share of the pods may stay unschedulable on a cluster "big enough"."""


@dataclass(frozen=True)
class PlanSettings:
    seed: int = 42
    scale: float = 1.0
    step: float = 0.01
    """Bisection stops when the factor's bracket is this narrow (a share of the cluster)."""
    top: float = 3.0
    """Largest factor tried: a mode that needs more says ``None``."""
    scoring: str = "default"
    """``default``: the stock profile's scores; ``fragmentation``: plus the scoring
    extender's (:mod:`dra_driver.scoring.fragmentation`)."""
    scoring_weight: int = 3
    """The extender's ``weight`` in the scheduler configuration."""
    all_nodes: bool = False
    """Model ``percentageOfNodesToScore: 100``."""


SCORINGS = ("default", "fragmentation")


def demand_of(pod: TracePod) -> Demand:
    """What ``pod`` asks of a node, as the scorer counts it (a share rounded up to the
    1 % steps of ``computeShare``)."""
    if pod.is_share:
        return Demand(pod.cpu_milli, pod.memory_mib, share=10 * -(-pod.gpu_milli // 10))
    return Demand(pod.cpu_milli, pod.memory_mib, gpus=pod.num_gpu)


def scoring_of(settings: PlanSettings, pods: Sequence[TracePod]) -> Scoring:
    """The packers' scoring for ``settings``; the workload's classes from ``pods``."""
    if settings.scoring not in SCORINGS:
        raise ValueError(f"scoring {settings.scoring!r} is unknown; known: {', '.join(SCORINGS)}")
    if settings.scoring == "default":
        return Scoring(None, 1, settings.all_nodes)
    if settings.scoring_weight < 1:
        raise ValueError(f"scoring weight {settings.scoring_weight}: want at least 1")
    scorer = Scorer(Workload.of(demand_of(p) for p in pods))
    return Scoring(scorer, settings.scoring_weight, settings.all_nodes)


def _pct(milli: int, capacity: int) -> float:
    return round(100 * milli / capacity, 2)


def plan_mode(
    mode: Mode,
    nodes: Sequence[TraceNode],
    pods: Sequence[TracePod],
    classes: Mapping[str, DeviceClass],
    settings: PlanSettings,
    workdir: Path,
    evaluator: Callable[[], SelectorEvaluator] = SelectorEvaluator,
    listed: Sequence[TracePod] | None = None,
) -> dict[str, Any]:
    """One mode's row: ``mode``, ``gpus_needed``, ``allocation_rate_100``/``_130``,
    ``settings`` and what it took (``nodes`` already scaled). ``listed``: the pods GPUs
    needed are counted for (a live cluster's, as they are); default the draw to 100 %."""
    began = time.monotonic()
    capacity = gpu_capacity_milli(nodes)
    draw = draw_pods(pods, capacity, settings.seed)
    published = publish_shapes(resize_nodes(nodes, 1.0), mode, draw.pods, workdir / mode)
    scoring = scoring_of(settings, pods)
    packer = Packer(nodes, published, classes, evaluator(), seed=settings.seed, scoring=scoring)
    first = packer.run(draw.pods[: draw.reached[0]])
    rate_100 = _pct(first.placed_milli, capacity)
    rest = packer.run(draw.pods[draw.reached[0] :])
    rate_130 = _pct(first.placed_milli + rest.placed_milli, capacity)
    base = first
    if listed is None:
        listed = draw.pods[: draw.reached[0]]
    else:
        base = Packer(
            nodes, published, classes, evaluator(), seed=settings.seed, scoring=scoring
        ).run(listed)
    needed, tried = _gpus_needed(
        listed, nodes, published, classes, settings, evaluator, base, scoring
    )
    unschedulable = dict(first.unschedulable)
    for kind, n in rest.unschedulable.items():
        unschedulable[kind] = unschedulable.get(kind, 0) + n
    return {
        "mode": mode,
        "gpus_needed": needed,
        "allocation_rate_100": rate_100,
        "allocation_rate_130": rate_130,
        "settings": _settings(published, settings),
        "scoring": settings.scoring,
        "gpus": capacity // 1000,
        "pods": len(draw.pods),
        "unschedulable": unschedulable,
        "unschedulable_100": dict(first.unschedulable),
        "clusters_tried": tried,
        "seconds": round(time.monotonic() - began, 1),
    }


def _settings(published: Published, settings: PlanSettings) -> dict[str, Any]:
    """The mode's settings, plus the scoring extender's chart values when scored so."""
    out = published.settings()
    if settings.scoring == "fragmentation":
        chart = dict(out.get("chart") or {})
        chart["scoringExtender"] = {"enabled": True}
        scheduler = ("extenders: deploy/scheduler/scoring-extender.yaml's entry, "
                     f"weight {settings.scoring_weight}")  # fmt: skip
        out = {**out, "chart": chart, "scheduler": scheduler}
    return out


def _gpus_needed(
    listed: Sequence[TracePod],
    nodes: Sequence[TraceNode],
    published: Published,
    classes: Mapping[str, DeviceClass],
    settings: PlanSettings,
    evaluator: Callable[[], SelectorEvaluator],
    base: Outcome,
    scoring: Scoring,
) -> tuple[int | None, int]:
    """GPUs of the smallest resized cluster placing ``listed`` with at most 1 %
    unschedulable; None above ``settings.top``. Also how many clusters were packed."""
    allowed = UNSCHEDULABLE_MAX * len(listed)

    def fits(factor: float) -> tuple[bool, int]:
        resized = resize_nodes(nodes, factor)  # its shapes are among the cluster's
        packer = Packer(
            resized, published, classes, evaluator(), seed=settings.seed, scoring=scoring
        )
        out = packer.run(listed, give_up=int(allowed))
        return not out.stopped and sum(out.unschedulable.values()) <= allowed, sum(
            n.gpus for n in resized
        )

    tried = 0
    lo, hi = 0.0, 1.0
    gpus_hi = sum(n.gpus for n in nodes)
    if sum(base.unschedulable.values()) > allowed:
        lo = 1.0
        hi = 1.0
        ok = False
        while not ok:
            lo, hi = hi, min(settings.top, hi * 1.25)
            ok, gpus_hi = fits(hi)
            tried += 1
            if not ok and hi >= settings.top:
                return None, tried
    else:
        lo = 0.5
        ok, gpus_lo = fits(lo)
        tried += 1
        if ok:
            lo, hi, gpus_hi = 0.0, lo, gpus_lo
    while hi - lo > settings.step:
        mid = (lo + hi) / 2
        ok, gpus = fits(mid)
        tried += 1
        if ok:
            hi, gpus_hi = mid, gpus
        else:
            lo = mid
    return gpus_hi, tried
