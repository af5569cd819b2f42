"""Place a drawn workload on a trace's nodes the way the stock kube-scheduler does, with the
project's allocator (:mod:`dra_driver.allocation`) choosing the devices.

Per pod, as the scheduler's default profile does: nodes are visited from where the last
pod's search stopped, and the search stops after ``numFeasibleNodesToFind`` feasible
nodes (all below 100 nodes, else ``max(100, N x max(5, 50 - N/125) %)``); a node is
feasible when the pod's CPU and memory fit and its claim can be allocated there; the
feasible nodes are scored by ``NodeResourcesFit`` (``LeastAllocated``, CPU and memory)
plus ``NodeResourcesBalancedAllocation`` (the other default plugins score these pods
alike), plus, with :class:`Scoring`, the scoring extender's fragmentation score as
kube-scheduler adds it; the best wins, ties at random (seeded). The claim's devices are then chosen
by :class:`~dra_driver.allocation.allocator.Attempt` (first fit, as the scheduler's
allocator), on the same slices the driver publishes.

Deciding feasibility with an allocation attempt on every visited node costs too much
at full size in Python, so a node's GPUs are also kept as "thousandths free" per GPU,
and a pod's claim as what it needs of one GPU (a share) or how many untouched GPUs (N
whole): a node passes when some GPU has enough free. For every mode but ``mig`` this is
exact; for ``mig`` it is necessary only (a profile's placements may collide), so the
chosen node's attempt can fail, and the next best is tried.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from itertools import chain
from typing import Any

from dra_driver.allocation.allocator import Attempt, Choice
from dra_driver.allocation.inventory import AllocationFailed, Inventory
from dra_driver.allocation.model import (
    AllocatedDevice,
    Claim,
    Device,
    DeviceClass,
    Node,
    Slice,
    parse_claim_spec,
    parse_slice,
)
from dra_driver.allocation.state import AllocatedState
from dra_driver.cel import SelectorEvaluator
from dra_driver.scoring.fragmentation import MAX_PRIORITY, Demand, NodeState, Scorer, priorities
from dra_driver.workload.claims import Claims
from dra_driver.workload.modes import Published, slots_of
from dra_driver.workload.pools import DRIVER
from dra_driver.workload.trace import TraceNode, TracePod

FULL = 1000
DEFAULT_CPU_MILLI = 100
DEFAULT_MEMORY_MIB = 200
"""The scheduler scores a container that requests no CPU or memory as 100m / 200Mi."""


def feasible_to_find(nodes: int) -> int:
    """The scheduler's ``numFeasibleNodesToFind`` with ``percentageOfNodesToScore`` unset."""
    if nodes < 100:
        return nodes
    percent = max(5, 50 - nodes // 125)
    return max(100, nodes * percent // 100)


@dataclass(frozen=True)
class Need:
    """What a claim needs of one node's GPUs, per node model code."""

    share: Mapping[str, int]
    """Thousandths of one GPU, by model (empty: whole GPUs)."""
    whole: int
    """Untouched GPUs."""


@dataclass(frozen=True)
class Scoring:
    """Node scoring beside the default profile's: the fragmentation extender's
    (:mod:`dra_driver.scoring.fragmentation`) at ``weight``, as kube-scheduler adds an
    extender's 0..10 score x weight x 10 to its plugins' sum; ``all_nodes`` models a
    profile with ``percentageOfNodesToScore: 100``."""

    scorer: Scorer | None = None
    weight: int = 1
    all_nodes: bool = False


@dataclass
class Outcome:
    placed: int = 0
    placed_milli: int = 0
    unschedulable: dict[str, int] = field(default_factory=dict)
    stopped: bool = False
    """Given up before the last pod (too many unschedulable already)."""


def _gpu_index(device: str) -> int:
    return int(device.split("-")[1])


class Packer:
    """One cluster of ``nodes`` publishing ``published``'s slices; :meth:`place` places
    pods in order and never removes one."""

    def __init__(
        self,
        nodes: Sequence[TraceNode],
        published: Published,
        classes: Mapping[str, DeviceClass],
        evaluator: SelectorEvaluator,
        *,
        seed: int = 42,
        scoring: Scoring | None = None,
    ) -> None:
        self.published = published
        self.scoring = scoring or Scoring()
        self.claims = Claims(published.mode, published.models)
        self.rng = random.Random(seed)  # noqa: S311 (ties broken as the scheduler does, reproducibly)
        shapes: dict[tuple[str, int], list[tuple[list[Device], dict[str, Any]]]] = {}
        for key, shape in published.shapes.items():
            parsed = []
            for i, spec in enumerate(shape.slices):
                obj = {"metadata": {"name": f"s{i}"},
                       "spec": {**spec, "driver": DRIVER, "pool": {"name": "x"}}}  # fmt: skip
                s = parse_slice(obj)
                parsed.append((s.devices, s.counter_sets))
            shapes[key] = parsed
        slices = []
        self.nodes = [Node(n.name, {"kubernetes.io/hostname": n.name}) for n in nodes]
        self.models = [n.model for n in nodes]
        self.cpu_cap = [n.cpu_milli for n in nodes]
        self.mem_cap = [n.memory_mib for n in nodes]
        self.cpu_free = list(self.cpu_cap)
        self.mem_free = list(self.mem_cap)
        self.cpu_scored = [0] * len(nodes)
        """CPU as the scorer counts it (a pod without a request counts 100m)."""
        self.mem_scored = [0] * len(nodes)
        self.free = [[FULL] * n.gpus for n in nodes]
        """Thousandths free per GPU (index = the GPU's index), per node."""
        self.max_free = [FULL if n.gpus else 0 for n in nodes]
        self.whole_free = [n.gpus for n in nodes]
        self.version = [0] * len(nodes)
        self._increases: list[dict[int, float | None]] = [{} for _ in nodes]
        """Per node: the fragmentation increase by pod kind until a pod lands there."""
        self._kinds: dict[tuple[object, ...], int] = {}
        """A number for each pod demand (CPU, memory, GPUs per model) seen."""
        self._scores: list[dict[int, int]] = [{} for _ in nodes]
        """Per node: the default profile's score by pod (CPU, memory) until a pod lands
        there (the trace's pods fall in ~100 such classes; a plan scores ~600 nodes a pod)."""
        self.shapes = [(n.model, n.gpus) for n in nodes]
        self.holding: list[dict[str, tuple[object, ...]]] = [{} for _ in nodes]
        """Per node: device name -> what each allocation of it consumed (its state)."""
        self._memo: dict[tuple[object, ...], list[Choice] | None] = {}
        self._failed: set[tuple[int, str, int]] = set()
        """(node, claim spec, node version) whose allocation attempt failed."""
        for n in nodes:
            for i, (devices, counters) in enumerate(shapes.get((n.model, n.gpus), [])):
                count = len(shapes[(n.model, n.gpus)])
                slices.append(Slice(f"{n.name}-{i}", DRIVER, n.name, 1, count, n.name, False,
                                    None, False, devices, counters))  # fmt: skip
        self.inventory = Inventory(slices, classes, self.nodes, evaluator)
        self.state = AllocatedState()
        self.find = len(self.nodes) if self.scoring.all_nodes else feasible_to_find(len(self.nodes))
        self.start = 0
        self._specs: dict[str, Claim] = {}
        self._needs: dict[str, Need] = {}
        self._by_pod: dict[TracePod, tuple[str, Claim, Need]] = {}
        self._shared_node: dict[str, int] = {}
        """time-slicing: shared claim -> index of the node it was allocated on."""
        self.capacity_milli = FULL * sum(n.gpus for n in nodes)
        self.attempts = 0

    def _need(self, pod: TracePod) -> Need:
        mode, models = self.published.mode, self.published.models
        if not pod.is_share or mode in ("whole", "time-slicing"):
            return Need({}, pod.num_gpu)
        if mode == "consumable":
            return Need(dict.fromkeys(models, 10 * math.ceil(pod.gpu_milli / 10)), 0)
        if mode == "slots":
            return Need({c: slots_of(pod.gpu_milli, m.slots) * FULL // m.slots
                         for c, m in models.items() if m.slots}, 0)  # fmt: skip
        name = self.claims.mig_profile(pod)  # mig: the profile's smaller fraction
        need = {}
        for code, model in models.items():
            for p in model.mig_profiles:
                if p.name == name:
                    need[code] = math.floor(FULL * min(p.memory, p.compute))
        return Need(need, 0)

    def _claim(self, pod: TracePod) -> tuple[str, Claim, Need]:
        known = self._by_pod.get(pod)  # a draw repeats the list's pods
        if known is not None:
            return known
        spec = self.claims.spec(pod)
        key = json.dumps(spec, sort_keys=True)
        if key not in self._specs:
            self._specs[key] = parse_claim_spec("plan", f"c{len(self._specs)}", spec)
            self._needs[key] = self._need(pod)
        known = self._by_pod[pod] = (key, self._specs[key], self._needs[key])
        return known

    def _allocate(self, i: int, key: str, claim: Claim) -> list[Choice] | None:
        """The claim's devices on node ``i``: an allocation attempt, or the answer an
        attempt gave for the same claim on a node of the same shape in the same state
        (it cannot differ: the node's pool is all an attempt reads)."""
        memo_key = (key, self.shapes[i], tuple(sorted(self.holding[i].items())))
        if memo_key in self._memo:
            known = self._memo[memo_key]
            if known is None:
                return None
            pool = self.nodes[i].name
            return [replace(c, device_id=replace(c.device_id, pool=pool)) for c in known]
        self.attempts += 1
        try:
            result = Attempt(self.inventory, self.state, self.nodes[i], [claim]).run()
        except AllocationFailed:
            result = None
        choices = result[0] if result else None
        self._memo[memo_key] = choices
        return choices

    def _commit(self, i: int, key: str, choices: list[Choice]) -> None:
        results = []
        for c in choices:
            shared = c.consumed is not None
            results.append(AllocatedDevice(c.request.result_name, c.device_id,
                                           share_id="s" if shared else "",
                                           consumed=c.consumed or {}))  # fmt: skip
            self.free[i][_gpu_index(c.device.name)] -= self._held(self.models[i], c)
            held = self.holding[i].get(c.device.name, ())
            taken = tuple(sorted((k, q.value) for k, q in (c.consumed or {}).items()))
            self.holding[i][c.device.name] = (*held, taken)
        self.state.add(key, results)
        self.max_free[i] = max(self.free[i])
        self.whole_free[i] = sum(1 for f in self.free[i] if f == FULL)
        self.version[i] += 1

    def _held(self, code: str, choice: Choice) -> int:
        """Thousandths of its GPU a chosen device takes (a MIG instance: the smaller of
        its memory and SM fractions, so that the free count never undercounts)."""
        device = choice.device
        if choice.consumed:
            caps = device.capacity
            return math.floor(FULL * max(Fraction(q.value) / caps[k].value.value
                                        for k, q in choice.consumed.items()))  # fmt: skip
        if device.raw["attributes"]["type"].get("string") == "mig":
            name = str(device.raw["attributes"]["profile"]["string"]).split("+")[0]
            model = self.published.models[code]
            p = next(p for p in model.mig_profiles if p.name == name)
            return math.floor(FULL * min(p.memory, p.compute))
        return FULL

    def place(self, pod: TracePod, claim_ref: str | None = None) -> bool:
        """Place ``pod`` (its claim, or the shared claim named ``claim_ref``); False when
        no node fits, as the scheduler would leave it unschedulable."""
        cpu, mem = pod.cpu_milli, pod.memory_mib
        cpu_s, mem_s = cpu or DEFAULT_CPU_MILLI, mem or DEFAULT_MEMORY_MIB
        pinned = self._shared_node.get(claim_ref) if claim_ref else None
        key, claim, need = "", None, None
        if pod.num_gpu and pinned is None:
            key, claim, need = self._claim(pod)
        share = need.share if need is not None else None
        whole = need.whole if need is not None else 0
        cpu_free, mem_free, cpu_cap, mem_cap = self.cpu_free, self.mem_free, self.cpu_cap, \
            self.mem_cap  # fmt: skip
        models, max_free, whole_free, version = self.models, self.max_free, \
            self.whole_free, self.version  # fmt: skip
        total, find, scores = len(self.nodes), self.find, self._scores
        cpu_scored, mem_scored, failed = self.cpu_scored, self.mem_scored, self._failed
        cls = cpu_s << 32 | mem_s
        found: list[tuple[int, int]] = []
        best, ties = -1, []
        start = self.start
        last = -1
        order = (pinned,) if pinned is not None else chain(range(start, total), range(start))
        for i in order:
            last = i
            if cpu_free[i] < cpu or mem_free[i] < mem:
                continue
            if need is not None:
                if share:
                    want = share.get(models[i])
                    if want is None or max_free[i] < want:
                        continue
                elif whole_free[i] < whole:
                    continue
                if failed and (i, key, version[i]) in failed:
                    continue
            cached = scores[i]
            value = cached.get(cls)
            if value is None:
                # LeastAllocated + BalancedAllocation, integers as the scheduler truncates
                # each plugin's score; inlined: this loop is where a plan spends its time
                c, m = cpu_cap[i], mem_cap[i]
                cu, mu = cpu_scored[i] + cpu_s, mem_scored[i] + mem_s
                fc, fm = cu / c, mu / m
                spread = abs((fc if fc < 1 else 1.0) - (fm if fm < 1 else 1.0)) / 2
                value = ((c - cu) * 100 // c + (m - mu) * 100 // m) // 2 + int((1 - spread) * 100)
                cached[cls] = value
            found.append((value, i))
            if value > best:
                best, ties = value, [i]
            elif value == best:
                ties.append(i)
            if len(found) >= find:
                break
        if pinned is None and total:
            visited = (last - start) % total + 1 if len(found) >= find else total
            self.start = (start + visited) % total
        if not found:
            return False
        if self.scoring.scorer is not None and len(found) > 1:
            found, ties = self._rescore(found, pod, share or {}, whole)
        first = self.rng.choice(ties)
        if self._take(first, pod, claim, key, claim_ref, cpu_s, mem_s):
            return True
        rest = sorted((f for f in found if f[1] != first), key=lambda f: -f[0])
        return any(self._take(i, pod, claim, key, claim_ref, cpu_s, mem_s) for _, i in rest)

    def _rescore(
        self, found: list[tuple[int, int]], pod: TracePod, share: Mapping[str, int], whole: int
    ) -> tuple[list[tuple[int, int]], list[int]]:
        """``found`` with the fragmentation score added, and the best nodes."""
        scorer = self.scoring.scorer
        assert scorer is not None
        cpu, mem, models, cached = pod.cpu_milli, pod.memory_mib, self.models, self._increases
        kind = self._kinds.setdefault((cpu, mem, whole, tuple(sorted(share.items()))),
                                      len(self._kinds))  # fmt: skip
        demands: dict[str, Demand] = {}
        increases: list[float | None] = []
        for _, i in found:
            known = cached[i]
            if kind in known:
                increases.append(known[kind])
                continue
            code = models[i]
            demand = demands.get(code)
            if demand is None:
                demand = demands[code] = Demand(cpu, mem, whole, share.get(code, 0))
            state = NodeState(tuple(self.free[i]), self.cpu_free[i], self.mem_free[i])
            value = known[kind] = scorer.increase(state, demand)
            increases.append(value)
        factor = self.scoring.weight * (100 // MAX_PRIORITY)
        scored = [
            (v + factor * p, i) for (v, i), p in zip(found, priorities(increases), strict=True)
        ]
        best = max(v for v, _ in scored)
        return scored, [i for v, i in scored if v == best]

    def _take(
        self,
        i: int,
        pod: TracePod,
        claim: Claim | None,
        key: str,
        claim_ref: str | None,
        cpu_s: int,
        mem_s: int,
    ) -> bool:
        """Allocate the pod's claim on node ``i`` and count the pod there; False (and
        remembered for this node state) when the allocation fails."""
        if claim is not None:
            choices = self._allocate(i, key, claim)
            if choices is None:
                self._failed.add((i, key, self.version[i]))
                return False
            self._commit(i, f"{key}#{self.attempts}", choices)
            if claim_ref:
                self._shared_node[claim_ref] = i
        self.cpu_free[i] -= pod.cpu_milli
        self.mem_free[i] -= pod.memory_mib
        self._scores[i] = {}
        self._increases[i] = {}
        self.cpu_scored[i] += cpu_s
        self.mem_scored[i] += mem_s
        return True

    def run(self, pods: Sequence[TracePod], give_up: int | None = None) -> Outcome:
        """Place ``pods`` in order (after what was placed before); stop early once more
        than ``give_up`` are unschedulable (``Outcome.stopped``)."""
        out = Outcome()
        for pod in pods:
            if give_up is not None and sum(out.unschedulable.values()) > give_up:
                out.stopped = True
                break
            ref = None
            if pod.num_gpu:
                claim = self.claims.claim_for(pod)
                ref = claim.name if claim.shared else None
            if self.place(pod, ref):
                out.placed += 1
                out.placed_milli += pod.gpu_request_milli
            else:
                out.unschedulable[pod.kind] = out.unschedulable.get(pod.kind, 0) + 1
        return out
