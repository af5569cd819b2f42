"""How much usable GPU capacity a placement would strand: the idea of the Alibaba
trace paper's fragmentation-aware scheduler (FGD, Weng et al., USENIX ATC '23),
on the state our allocator leaves.

A node's *fragmentation* for a workload is the free GPU capacity that a pod drawn from
the workload's class distribution could not use there, in expectation (thousandths of
a GPU): all of it when the pod's CPU or memory does not fit the node, or it needs more
untouched GPUs than the node has, or no GPU has its share free; else the GPUs it could
not use (partly used ones for whole-GPU pods, those with less free than the share for a
share). Placing a pod changes the node's state; a node scores by how little that
placement raises the node's fragmentation. The GPUs the pod takes inside the node are
the first that fit, in device order, as the project's allocator and the scheduler's
choose them (the scorer picks only the node).

Kept in plain thousandths so that ``plan`` and the extender compute the same numbers
from their own views (the packer's counts, the extender's watched slices and claims).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

FULL = 1000
"""Thousandths in one GPU."""
CACHED = 200_000
"""Entries per memo of a :class:`Scorer` (emptied when full): bounds its memory."""
MAX_PRIORITY = 10
"""kube-scheduler's ``MaxExtenderPriority``: extender scores run 0..10."""


@dataclass(frozen=True)
class Demand:
    """What one pod asks of a node."""

    cpu_milli: int
    memory_mib: int
    gpus: int = 0
    """Whole (untouched) GPUs."""
    share: int = 0
    """Thousandths of one GPU (with ``gpus`` 0); 0: no share."""

    @property
    def uses_gpus(self) -> bool:
        return bool(self.gpus or self.share)


@dataclass(frozen=True)
class NodeState:
    """A node as the scorer sees it."""

    free: tuple[int, ...]
    """Thousandths free per GPU, in the order the allocator tries them."""
    cpu_free: int
    memory_free: int


@dataclass(frozen=True)
class Workload:
    """Pod classes that use GPUs and their shares of the pods (summing to 1)."""

    classes: tuple[tuple[Demand, float], ...]

    @classmethod
    def of(cls, demands: Iterable[Demand], top: int = 64) -> Workload:
        """The distribution of ``demands`` that use GPUs, cut to the ``top`` most
        common classes (the rest of the weight spread over them)."""
        counts = Counter(d for d in demands if d.uses_gpus)
        kept = counts.most_common(top)
        total = sum(n for _, n in kept)
        if not total:
            return cls(())
        return cls(tuple((d, n / total) for d, n in kept))


def unusable(free: Sequence[int], demand: Demand) -> int:
    """Free thousandths of ``free`` that ``demand``'s GPU part cannot use (the host's
    CPU and memory aside)."""
    total = sum(free)
    if demand.share:
        if any(f >= demand.share for f in free):
            return sum(f for f in free if f < demand.share)
        return total
    whole = sum(1 for f in free if f == FULL)
    if whole < demand.gpus:
        return total
    return total - whole * FULL


def first_fit(node: NodeState, demand: Demand) -> NodeState | None:
    """The node after ``demand`` is placed, the first fitting GPUs taken; None when
    it does not fit."""
    cpu, memory = node.cpu_free - demand.cpu_milli, node.memory_free - demand.memory_mib
    if cpu < 0 or memory < 0:
        return None
    free = list(node.free)
    if demand.share:
        for i, f in enumerate(free):
            if f >= demand.share:
                free[i] = f - demand.share
                break
        else:
            return None
    elif demand.gpus:
        left = demand.gpus
        for i, f in enumerate(free):
            if left and f == FULL:
                free[i] = 0
                left -= 1
        if left:
            return None
    return NodeState(tuple(free), cpu, memory)


class Scorer:
    """Fragmentation of node states for one workload, with the per-GPU-state part
    remembered (nodes of one shape repeat the same few GPU states)."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        groups: dict[tuple[int, int], int] = {}
        rows = []
        for demand, weight in workload.classes:
            key = (demand.gpus, demand.share)
            group = groups.setdefault(key, len(groups))
            gpu = demand.share or demand.gpus * FULL
            rows.append((demand.cpu_milli, demand.memory_mib, gpu, group, weight))
        self._rows = tuple(rows)
        self._groups = tuple(Demand(0, 0, gpus, share) for gpus, share in groups)
        self._unusable: dict[tuple[int, ...], tuple[int, ...]] = {}
        self._increases: dict[tuple[NodeState, Demand], float | None] = {}
        """Most nodes keep their state from one pod to the next, and pods repeat."""
        self._before: dict[NodeState, float] = {}
        """A node's own fragmentation, the same for every demand scored on it."""

    def fragmentation(self, node: NodeState) -> float:
        """Expected free thousandths a workload pod could not use on ``node``."""
        total = sum(node.free)
        if not total:
            return 0.0
        table = self._unusable.get(node.free)
        if table is None:
            table = tuple(unusable(node.free, g) for g in self._groups)
            if len(self._unusable) >= CACHED:
                self._unusable.clear()
            self._unusable[node.free] = table
        cpu, memory = node.cpu_free, node.memory_free
        frag = 0.0
        for c, m, g, group, weight in self._rows:
            usable = total - table[group]
            if c and cpu // c * g < usable:
                usable = cpu // c * g
            if m and memory // m * g < usable:
                usable = memory // m * g
            frag += weight * (total - usable)
        return frag

    def increase(self, node: NodeState, demand: Demand) -> float | None:
        """How much placing ``demand`` on ``node`` raises its fragmentation; None when
        it does not fit there."""
        key = (node, demand)
        if key in self._increases:
            return self._increases[key]
        after = first_fit(node, demand)
        if after is None:
            value = None
        else:
            before = self._before.get(node)
            if before is None:
                before = self.fragmentation(node)
                if len(self._before) >= CACHED:
                    self._before.clear()
                self._before[node] = before
            value = self.fragmentation(after) - before
        if len(self._increases) >= CACHED:
            self._increases.clear()
        self._increases[key] = value
        return value


def priorities(increases: Sequence[float | None]) -> list[int]:
    """Scores 0..:data:`MAX_PRIORITY` for nodes by their fragmentation increase: the
    smallest gets the most, the others linearly down to 0 at the largest; a node where
    the pod does not fit in this view gets 0 (the scheduler's filters decided it fits:
    the view may be behind)."""
    known = [x for x in increases if x is not None]
    if not known:
        return [0] * len(increases)
    lo, hi = min(known), max(known)
    if hi - lo < 1e-9:
        return [0 if x is None else MAX_PRIORITY for x in increases]
    span = hi - lo
    return [0 if x is None else round(MAX_PRIORITY * (hi - x) / span) for x in increases]
