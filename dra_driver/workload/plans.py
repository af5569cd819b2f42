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


GUESS_SHARE = 0.8
"""Of the gap an overfull cluster's packing suggests (see :func:`_guess`), the share
that lands within one step of the answer on the trace's five modes."""
PACKED = 0.9
"""The packing efficiency assumed when the cluster as it is places the list."""


def _guess(
    listed: Sequence[TracePod], base: Outcome, base_ok: bool, capacity: int, step: float
) -> float:
    """Where the search for the GPUs needed starts. When the cluster as it is leaves more
    than 1 % unplaced (not ``base_ok``), the list needs about ``0.99 x requested /
    placed`` of it (packing as well as it did there; less: a grown cluster packs a little
    better); when it places the list, about the request over :data:`PACKED` of the
    capacity."""
    requested = sum(p.gpu_request_milli for p in listed)
    wanted = (1 - UNSCHEDULABLE_MAX) * requested
    if not base_ok:
        gap = wanted / max(1, base.placed_milli) - 1
        return 1 + max(step, GUESS_SHARE * gap)
    return min(1 - step, max(step, wanted / (PACKED * max(1, capacity))))


def smallest_fitting(
    fits: Callable[[float], tuple[bool, int]],
    guess: float,
    step: float,
    top: float,
    known: tuple[float, bool, int],
) -> tuple[int | None, int]:
    """The GPUs of the smallest factor that ``fits`` (to within ``step``), and how many
    factors were tried; None when even ``top`` does not fit. ``known``: one factor's
    answer already at hand (factor, fits, GPUs). Starts at ``guess`` and doubles its
    step away from it until the answer is bracketed, then bisects: a good guess costs
    two clusters, a poor one a few more, never precision. ``fits`` is taken as
    monotone (a larger cluster places at least as much)."""
    lo, gpus_hi = 0.0, 0
    hi: float | None = None
    """``lo``: the largest factor known to fail (0: an empty cluster never fits); ``hi``: the
    smallest known to fit."""
    tried = 0

    def probe(factor: float) -> bool:
        nonlocal lo, hi, gpus_hi, tried
        ok, gpus = fits(factor)
        tried += 1
        if ok and (hi is None or factor < hi):
            hi, gpus_hi = factor, gpus
        elif not ok:
            lo = max(lo, factor)
        return ok

    factor, ok, gpus = known
    if ok:
        hi, gpus_hi = factor, gpus
    else:
        lo = factor
    eps = step * 1e-6  # float sums: a bracket of exactly one step is narrow enough

    def walk_up() -> bool:
        """Up from ``lo``, doubling, until a cluster fits or the next step would reach
        the smallest known to fit; False when even ``top`` fails."""
        distance = step
        while hi is None or lo + distance < hi - eps:
            if lo >= top:
                return False
            if probe(min(top, lo + distance)):
                break
            distance *= 2
        return True

    guess = min(top, guess)
    if lo < guess and (hi is None or guess < hi):
        if probe(guess):  # walk down from it, doubling, until one fails
            distance = step
            while hi is not None and hi - distance > lo + eps and probe(hi - distance):
                distance *= 2
        elif not walk_up():
            return None, tried
    if hi is None and not walk_up():  # the guess was not tried
        return None, tried
    assert hi is not None
    while hi - lo > step + eps:
        probe((lo + hi) / 2)
    return gpus_hi, tried


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
    unschedulable; None above ``settings.top``. Also how many clusters were packed
    (``base``: the cluster as it is, already packed)."""
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

    base_ok = sum(base.unschedulable.values()) <= allowed
    guess = _guess(listed, base, base_ok, gpu_capacity_milli(nodes), settings.step)
    known = (1.0, base_ok, sum(n.gpus for n in nodes))
    return smallest_fitting(fits, guess, settings.step, settings.top, known)
