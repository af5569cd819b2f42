"""Which nodes and pods a replay uses: a stratified share of the nodes, and the paper's
seeded draw of pods.

Nodes (:func:`scale_nodes`): the cluster is cut to ``scale`` of its nodes per stratum
(GPU model, GPU count), so a 1/20 cluster keeps the mix of the full one; each stratum's
count is rounded by largest remainder (the total is ``round(scale * nodes)``, at least
one node), and the nodes kept are spread evenly over the stratum sorted by CPU and
memory, so its machine shapes are kept too. No seed: the same scale is the same cluster.

Pods (:func:`draw_pods`): the README gives the protocol as "pods drawn from the list
until the GPU request reaches 130 % of the cluster's GPU capacity", which a list of
8,152 pods asking ~7,400 GPUs cannot reach without repeats. We draw uniformly WITH
replacement (``random.Random(seed).randrange``), so every draw is an independent pod of
the trace's mix and any target is reachable; a drawn pod is appended even when it
overshoots, and the draw stops at the first pod whose cumulative GPU request reaches
the target. CPU-only pods are drawn too (they take CPU and memory, no GPU).
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace

from dra_driver.workload.trace import TraceNode, TracePod

TARGETS = (1.0, 1.3)
"""Shares of the cluster's GPU capacity requested at which the paper reports."""


def scale_nodes(nodes: Sequence[TraceNode], scale: float) -> list[TraceNode]:
    """``scale`` (0 < scale <= 1) of ``nodes``, stratified; in the input's order."""
    if not 0 < scale <= 1:
        raise ValueError(f"scale {scale}: want 0 < scale <= 1")
    strata: dict[tuple[str, int], list[int]] = defaultdict(list)
    for i, node in enumerate(nodes):
        strata[(node.model, node.gpus)].append(i)
    total = max(1, round(scale * len(nodes)))
    exact = {key: scale * len(members) for key, members in strata.items()}
    counts = {key: int(value) for key, value in exact.items()}
    by_remainder = sorted(strata, key=lambda k: (-(exact[k] - counts[k]), -len(strata[k]), k))
    for key in by_remainder[: max(0, total - sum(counts.values()))]:
        counts[key] += 1
    kept: list[int] = []
    for key, members in strata.items():
        ordered = sorted(members, key=lambda i: (nodes[i].cpu_milli, nodes[i].memory_mib, i))
        n = counts[key]
        kept += [ordered[(2 * j + 1) * len(ordered) // (2 * n)] for j in range(n)]
    return [nodes[i] for i in sorted(kept)]


def gpu_capacity_milli(nodes: Sequence[TraceNode]) -> int:
    return 1000 * sum(n.gpus for n in nodes)


@dataclass(frozen=True)
class Draw:
    """The pods of one replay, in creation order, and where each target is reached."""

    pods: tuple[TracePod, ...]
    reached: tuple[int, ...]
    """Per target of :data:`TARGETS`: how many of ``pods`` make up that request."""
    capacity_milli: int


def draw_pods(
    pods: Sequence[TracePod],
    capacity_milli: int,
    seed: int,
    targets: Sequence[float] = TARGETS,
) -> Draw:
    """Draw ``pods`` with replacement until the GPU request reaches each of ``targets``
    (ascending shares of ``capacity_milli``)."""
    if capacity_milli <= 0:
        raise ValueError("the cluster has no GPUs: no GPU request can reach a target")
    if list(targets) != sorted(targets) or not targets or targets[0] <= 0:
        raise ValueError(f"targets {list(targets)}: want positive shares in ascending order")
    if not any(p.gpu_request_milli for p in pods):
        raise ValueError("no pod of the list asks for a GPU: no target can be reached")
    rng = random.Random(seed)  # noqa: S311 (a reproducible draw, not a secret)
    drawn: list[TracePod] = []
    reached: list[int] = []
    requested = 0
    for target in targets:
        goal = target * capacity_milli
        while requested < goal:
            pod = pods[rng.randrange(len(pods))]
            drawn.append(pod)
            requested += pod.gpu_request_milli
        reached.append(len(drawn))
    return Draw(tuple(drawn), tuple(reached), capacity_milli)


def resize_nodes(nodes: Sequence[TraceNode], factor: float) -> list[TraceNode]:
    """``nodes`` proportionally resized by ``factor`` > 0: whole copies of every node
    (renamed ``<name>-c<k>``) for the integer part, and a stratified share
    (:func:`scale_nodes`) for the rest, so a larger cluster keeps the mix too."""
    if factor <= 0:
        raise ValueError(f"factor {factor}: want > 0")
    copies = int(factor)
    out: list[TraceNode] = []
    for k in range(copies):
        out += [n if k == 0 else replace(n, name=f"{n.name}-c{k}") for n in nodes]
    rest = factor - copies
    if rest > 1e-9:
        suffix = f"-c{copies}" if copies else ""
        part = scale_nodes(nodes, rest)
        out += [replace(n, name=f"{n.name}{suffix}") if suffix else n for n in part]
    return out
