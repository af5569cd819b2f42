"""The scoring extender's picture of the cluster, built from watched API objects: per
node, its allocatable CPU and memory, what bound pods request, and the free share of
each GPU our driver publishes there; per claim, what it asks of one GPU.

Only this module reads Kubernetes objects (plain dicts as the API serves them); it
hands :mod:`dra_driver.scoring.fragmentation` its plain states. Thread-safe: watches
update it while the HTTP threads read it.

What it counts, and why that is enough to score:

* a GPU is a device of ``driver`` (``gpu.nvidia.com``) whose ``type`` attribute is
  ``gpu``, on the node its slice names, in slice then device order (the order the
  scheduler's allocator tries them first fit);
* a GPU's held share is the largest fraction of any capacity that allocations of it
  consumed (``consumedCapacity``), or all of it for an allocation without one;
* a pod's demand is its containers' CPU and memory requests and its first claim's
  first request: ``count`` whole GPUs, or a share, the largest fraction of the node's
  first GPU that its capacity requests ask for.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dra_driver.quantity import parse, pod_requests
from dra_driver.scoring.fragmentation import FULL, Demand, NodeState, Scorer, Workload

Obj = Mapping[str, Any]
DRIVER = "gpu.nvidia.com"
WORKLOAD_TOP = 64
"""Pod classes kept in the learned workload (the most common)."""
REBUILD_EVERY = 50
"""New demands seen between rebuilds of the scorer's workload."""


@dataclass(frozen=True)
class Gpu:
    pool: str
    name: str
    capacity: Mapping[str, Fraction]


def _key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


class ClusterView:
    """Nodes, pods, slices and claims as the watches last delivered them, with the
    sums the scorer reads kept up to date per event (a request reads only its nodes)."""

    def __init__(self, driver: str = DRIVER) -> None:
        self.driver = driver
        self._lock = threading.Lock()
        self._nodes: dict[str, tuple[int, int]] = {}
        self._pods: dict[str, tuple[str, int, int]] = {}
        """pod key -> (node, CPU milli, memory MiB), bound pods only."""
        self._host_used: dict[str, list[int]] = {}
        self._slices: dict[str, dict[str, list[Gpu]]] = {}
        """node -> slice name -> its GPUs."""
        self._slice_node: dict[str, str] = {}
        self._capacities: dict[tuple[tuple[str, Fraction], ...], dict[str, Fraction]] = {}
        self._claims: dict[str, Obj] = {}
        self._results: dict[str, list[tuple[tuple[str, str], dict[str, Fraction]]]] = {}
        """claim key -> its allocated devices and what each consumed ({}: all of it)."""
        self._used: dict[tuple[str, str], dict[str, Fraction]] = {}
        self._whole: Counter[tuple[str, str]] = Counter()
        self._free_of: dict[tuple[str, str], int] = {}
        """Thousandths free per device, dropped when a claim on it changes."""
        self._seen: Counter[Demand] = Counter()
        self._since_rebuild = 0
        self._scorer = Scorer(Workload(()))
        self.synced: set[str] = set()
        """Kinds whose first list arrived (``nodes``, ``pods``...)."""

    # -- updates from the watches ------------------------------------------------

    def apply(self, kind: str, event: str, obj: Obj) -> None:
        """One watch event (``ADDED``, ``MODIFIED``, ``DELETED``) of ``kind``."""
        gone = event == "DELETED"
        with self._lock:
            if kind == "nodes":
                self._node(obj, gone)
            elif kind == "pods":
                self._pod(_key(obj), obj, gone)
            elif kind == "resourceslices":
                self._slice((obj.get("metadata") or {}).get("name", ""), obj, gone)
            elif kind == "resourceclaims":
                self._claim(_key(obj), obj, gone)

    def replace(self, kind: str, items: Iterable[Obj]) -> None:
        """A fresh list of ``kind`` (after a (re)list): everything of it before goes."""
        with self._lock:
            if kind == "nodes":
                self._nodes.clear()
            elif kind == "pods":
                for key in list(self._pods):
                    self._pod(key, {}, True)
            elif kind == "resourceslices":
                for name in list(self._slice_node):
                    self._slice(name, {}, True)
            elif kind == "resourceclaims":
                for key in list(self._claims):
                    self._claim(key, {}, True)
        for obj in items:
            self.apply(kind, "ADDED", obj)
        with self._lock:
            self.synced.add(kind)

    def _node(self, obj: Obj, gone: bool) -> None:
        name = (obj.get("metadata") or {}).get("name", "")
        if gone:
            self._nodes.pop(name, None)
            return
        alloc = (obj.get("status") or {}).get("allocatable") or {}
        cpu = math.floor(parse(alloc.get("cpu", "0")) * 1000)
        mem = math.floor(parse(alloc.get("memory", "0")) / (1 << 20))
        self._nodes[name] = (cpu, mem)

    def _pod(self, key: str, obj: Obj, gone: bool) -> None:
        old = self._pods.pop(key, None)
        if old is not None:
            used = self._host_used[old[0]]
            used[0] -= old[1]
            used[1] -= old[2]
        node = (obj.get("spec") or {}).get("nodeName")
        phase = (obj.get("status") or {}).get("phase")
        if gone or not node or phase in ("Succeeded", "Failed"):
            return
        cpu, mem = pod_requests(obj)
        self._pods[key] = (node, cpu, mem)
        used = self._host_used.setdefault(node, [0, 0])
        used[0] += cpu
        used[1] += mem

    def _slice(self, name: str, obj: Obj, gone: bool) -> None:
        old = self._slice_node.pop(name, None)
        if old is not None:
            self._slices[old].pop(name, None)
        spec = obj.get("spec") or {}
        if gone or spec.get("driver") != self.driver or not spec.get("nodeName"):
            return
        pool = (spec.get("pool") or {}).get("name", "")
        gpus = []
        for d in spec.get("devices") or []:
            kind = ((d.get("attributes") or {}).get("type") or {}).get("string")
            if kind != "gpu":
                continue
            caps = {k: parse(v.get("value", "0")) for k, v in (d.get("capacity") or {}).items()}
            # One mapping per distinct capacity: a request resolves a pod's demand once
            # per GPU model, by the mapping's identity.
            caps = self._capacities.setdefault(tuple(sorted(caps.items())), caps)
            gpus.append(Gpu(pool, d.get("name", ""), caps))
        self._slice_node[name] = spec["nodeName"]
        self._slices.setdefault(spec["nodeName"], {})[name] = gpus

    def _claim(self, key: str, obj: Obj, gone: bool) -> None:
        for dev, consumed in self._results.pop(key, []):
            self._free_of.pop(dev, None)
            if not consumed:
                self._whole[dev] -= 1
                continue
            sums = self._used[dev]
            for k, q in consumed.items():
                sums[k] -= q
        self._claims.pop(key, None)
        if gone:
            return
        self._claims[key] = obj
        alloc = (obj.get("status") or {}).get("allocation") or {}
        results = []
        for r in (alloc.get("devices") or {}).get("results") or []:
            if r.get("driver") != self.driver:
                continue
            dev = (r.get("pool", ""), r.get("device", ""))
            consumed = {k: parse(q) for k, q in (r.get("consumedCapacity") or {}).items()}
            results.append((dev, consumed))
            self._free_of.pop(dev, None)
            if not consumed:
                self._whole[dev] += 1
                continue
            sums = self._used.setdefault(dev, {})
            for k, q in consumed.items():
                sums[k] = sums.get(k, Fraction(0)) + q
        if results:
            self._results[key] = results

    # -- what the scorer reads ----------------------------------------------------

    def _free(self, gpu: Gpu) -> int:
        dev = (gpu.pool, gpu.name)
        known = self._free_of.get(dev)
        if known is not None:
            return known
        free = FULL
        if self._whole.get(dev, 0) > 0:
            free = 0
        elif sums := self._used.get(dev):
            fractions = [v / gpu.capacity[k] for k, v in sums.items() if gpu.capacity.get(k)]
            free = FULL - min(FULL, math.floor(FULL * max(fractions, default=Fraction(0))))
        self._free_of[dev] = free
        return free

    def states(self, nodes: Iterable[str]) -> dict[str, tuple[NodeState, Gpu | None]]:
        """Each known node's state and its first GPU (None without GPUs)."""
        with self._lock:
            out = {}
            for n in nodes:
                if n not in self._nodes:
                    continue
                cpu, mem = self._nodes[n]
                used = self._host_used.get(n, (0, 0))
                by_slice = self._slices.get(n, {})
                gpus = [g for name in sorted(by_slice) for g in by_slice[name]]
                free = tuple(self._free(g) for g in gpus)
                out[n] = (NodeState(free, cpu - used[0], mem - used[1]), gpus[0] if gpus else None)
            return out

    def pod_request(self, pod: Obj) -> tuple[int, int, Obj | None]:
        """``pod``'s CPU (milli), memory (MiB) and its claim's first device request
        (None: no claim known here)."""
        cpu, mem = pod_requests(pod)
        return cpu, mem, self._first_request(pod)

    def _first_request(self, pod: Obj) -> Obj | None:
        namespace = (pod.get("metadata") or {}).get("namespace", "")
        statuses = (pod.get("status") or {}).get("resourceClaimStatuses") or []
        names = [s.get("resourceClaimName") for s in statuses if s.get("resourceClaimName")]
        for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
            if ref.get("resourceClaimName"):
                names.append(ref["resourceClaimName"])
        with self._lock:
            for name in names:
                claim = self._claims.get(f"{namespace}/{name}")
                if claim is None:
                    continue
                for req in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
                    if req.get("exactly"):
                        return dict(req["exactly"])
        return None

    def scorer(self, seen: Demand | None = None) -> Scorer:
        """The scorer for the workload seen so far (``seen`` counted first)."""
        with self._lock:
            if seen is not None and seen.uses_gpus:
                self._seen[seen] += 1
                self._since_rebuild += 1
                total = sum(self._seen.values())
                if self._since_rebuild >= min(REBUILD_EVERY, max(1, total // 4)):
                    self._scorer = Scorer(Workload.of(self._seen.elements(), WORKLOAD_TOP))
                    self._since_rebuild = 0
            return self._scorer


def demand_on(cpu: int, mem: int, request: Obj | None, gpu: Gpu | None) -> Demand:
    """What a pod asks of a node whose first GPU is ``gpu`` (:meth:`ClusterView.pod_request`)."""
    if request is None:
        return Demand(cpu, mem)
    asked = (request.get("capacity") or {}).get("requests") or {}
    if asked and gpu is not None:
        fractions = [parse(q) / gpu.capacity[k] for k, q in asked.items() if gpu.capacity.get(k)]
        share = min(FULL, math.ceil(FULL * max(fractions, default=Fraction(1))))
        if share < FULL:
            return Demand(cpu, mem, share=share)
        return Demand(cpu, mem, gpus=1)
    return Demand(cpu, mem, gpus=int(request.get("count", 1)))
