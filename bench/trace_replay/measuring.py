"""What a replay measures, read back from the API objects after the scheduler is done.

Allocation rate (the paper's: allocated GPU milli / (GPUs x 1000)): the GPU request
(``gpu_milli``, or 1000 per GPU) of every pod whose claim is allocated, over the
cluster's GPU capacity. Held rate: the GPU capacity the allocations take, per device
the largest fraction of any capacity consumed (``consumedCapacity`` / the device's
capacity), a whole device for an exclusive result, a MIG instance the larger of its
memory and SM fractions of its GPU (:func:`device_parts`); at most a whole GPU per GPU.
With ``consumable`` the two agree; with ``whole`` the held rate also counts what
rounding shares up wastes. A pod that names a shared claim (``time-slicing``) is placed
when it is bound and that claim is allocated.

Fragmented GPU share (the paper's measure, simplified): the expected GPU capacity that
is free but that a pod drawn from the workload could not use, over the cluster's
capacity. For a node and a pod class: all of the node's free GPU capacity when the pod
does not fit on the node at all (CPU, memory, GPU count or share); else, for a share,
the free capacity of partly used GPUs that each have less free than the share (a whole
GPU pod cannot use any partly used GPU). Weighted by the class's share of the workload.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from dra_driver.quantity import parse
from dra_driver.workload.claims import ANNOTATION
from dra_driver.workload.trace import TraceNode, TracePod

Obj = dict[str, Any]
RESOURCE = "/apis/resource.k8s.io/v1"
KINDS = ("cpu", "share", "1", "2", "4", "8")


@dataclass(frozen=True)
class Snapshot:
    """The API objects one measurement reads."""

    pods: list[Obj]
    claims: list[Obj]
    slices: list[Obj]


@dataclass(frozen=True)
class Part:
    """A published device as a part of one GPU."""

    gpu: str
    """The name of the whole-GPU device it is (or is a MIG instance of)."""
    capacity: dict[str, float]
    """Shareable capacities (``allowMultipleAllocations`` devices), else empty."""
    milli: int
    """Thousandths of its GPU an exclusive allocation takes (a MIG instance: the larger
    of its memory and SM fractions)."""


def _attr(device: Obj, name: str) -> Any:
    return next(iter((device.get("attributes") or {}).get(name, {None: None}).values()))


def _cap(device: Obj, name: str) -> float:
    return float(parse(device["capacity"][name]["value"]))


def device_parts(slices: Iterable[Obj]) -> dict[tuple[str, str], Part]:
    """(pool, device) -> what part of which GPU it is, for every published device."""
    by_pool: dict[str, list[Obj]] = defaultdict(list)
    for s in slices:
        by_pool[s["spec"]["pool"]["name"]] += s["spec"].get("devices", [])
    out = {}
    for pool, devices in by_pool.items():
        gpus = {d["name"]: d for d in devices if _attr(d, "type") == "gpu"}
        by_set = {c["counterSet"]: name for name, d in gpus.items()
                  for c in d.get("consumesCounters") or []}  # fmt: skip
        for d in devices:
            sets = [c["counterSet"] for c in d.get("consumesCounters") or []]
            gpu = d["name"] if d["name"] in gpus or not sets else by_set.get(sets[0], d["name"])
            milli = 1000
            if gpu != d["name"]:
                whole = gpus[gpu]
                milli = round(1000 * max(_cap(d, k) / _cap(whole, k)
                                         for k in ("memory", "multiprocessors")))  # fmt: skip
            caps = {k: float(parse(v["value"])) for k, v in (d.get("capacity") or {}).items()}
            shared = caps if d.get("allowMultipleAllocations") else {}
            out[(pool, d["name"])] = Part(str(gpu), shared, milli)
    return out


def held_milli(snapshot: Snapshot) -> dict[tuple[str, str], int]:
    """(pool, GPU) -> thousandths of the GPU the allocations take, at most 1000."""
    parts = device_parts(snapshot.slices)
    held: dict[tuple[str, str], int] = defaultdict(int)
    for claim in snapshot.claims:
        results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {})
        for r in results.get("results", []):
            part = parts.get((r["pool"], r["device"]), Part(r["device"], {}, 1000))
            key, used = (r["pool"], part.gpu), r.get("consumedCapacity") or {}
            if not part.capacity or not used:
                held[key] += part.milli
                continue
            fraction = max(float(parse(v)) / part.capacity[k] for k, v in used.items())
            held[key] += round(1000 * fraction)
    return {k: min(1000, v) for k, v in held.items()}


def allocated_claims(snapshot: Snapshot) -> set[str]:
    return {c["metadata"]["name"] for c in snapshot.claims if (c.get("status") or {}).get(
        "allocation")}  # fmt: skip


def pod_claim(pod: Obj) -> str | None:
    """The name of the pod's claim: its template's claim once made, or the claim it names."""
    for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
        if ref.get("resourceClaimName"):
            return str(ref["resourceClaimName"])
    for status in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
        return str(status.get("resourceClaimName") or "") or None
    return None


def placed(snapshot: Snapshot) -> list[Obj]:
    """Pods bound to a node whose claim (if any) is allocated."""
    allocated = allocated_claims(snapshot)
    out = []
    for pod in snapshot.pods:
        if not (pod.get("spec") or {}).get("nodeName"):
            continue
        wants = bool((pod.get("spec") or {}).get("resourceClaims"))
        if not wants or pod_claim(pod) in allocated:
            out.append(pod)
    return out


def _annotation(pod: Obj, key: str) -> str:
    return str(pod["metadata"].get("annotations", {}).get(f"{ANNOTATION}/{key}", ""))


def rates(snapshot: Snapshot, capacity_milli: int) -> dict[str, Any]:
    """Allocation and held rate (percent) and unschedulable pods by class."""
    ok = placed(snapshot)
    requested = sum(int(_annotation(p, "gpu-milli") or 0) for p in ok)
    held = sum(held_milli(snapshot).values())
    names = {p["metadata"]["name"] for p in ok}
    kinds = Counter(_annotation(p, "kind") for p in snapshot.pods)
    left = Counter(_annotation(p, "kind") for p in snapshot.pods if p["metadata"]["name"]
                   not in names)  # fmt: skip
    return {
        "allocation_rate": round(100 * requested / capacity_milli, 2),
        "held_rate": round(100 * held / capacity_milli, 2),
        "pods": sum(kinds.values()),
        "placed": len(ok),
        "unschedulable": {k: left.get(k, 0) for k in KINDS},
        "of_class": {k: kinds.get(k, 0) for k in KINDS},
    }


def fragmented_pct(
    snapshot: Snapshot, nodes: Sequence[TraceNode], workload: Sequence[TracePod]
) -> float:
    """Expected free GPU capacity unusable by a pod of ``workload``, percent of all."""
    free_gpus: dict[str, list[int]] = {}
    held = held_milli(snapshot)
    for n in nodes:
        free_gpus[n.name] = [1000 - min(1000, held.get((n.name, f"gpu-{i}"), 0))
                             for i in range(n.gpus)]  # fmt: skip
    cpu: Counter[str] = Counter()
    mem: Counter[str] = Counter()
    for pod in placed(snapshot):
        for c in pod["spec"]["containers"]:
            req = (c.get("resources") or {}).get("requests") or {}
            cpu[pod["spec"]["nodeName"]] += round(1000 * float(parse(req.get("cpu", "0"))))
            mem[pod["spec"]["nodeName"]] += int(parse(req.get("memory", "0"))) // (1 << 20)
    classes = Counter((p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli)
                      for p in workload if p.num_gpu)  # fmt: skip
    total = sum(classes.values())
    frag = 0.0
    for n in nodes:
        free = free_gpus[n.name]
        if not n.gpus or not sum(free):
            continue
        for (c, m, num, milli), count in classes.items():
            fits_host = c <= n.cpu_milli - cpu[n.name] and m <= n.memory_mib - mem[n.name]
            frag += count / total * unusable_milli(free, num, milli, fits_host)
    return round(100 * frag / (1000 * sum(n.gpus for n in nodes)), 2)


def unusable_milli(free: Sequence[int], num: int, milli: int, fits_host: bool) -> int:
    whole = sum(1 for f in free if f == 1000)
    if not fits_host:
        return sum(free)
    if num == 1 and milli < 1000:
        if any(f >= milli for f in free):
            return sum(f for f in free if f < milli)
        return sum(free)
    if whole < num:
        return sum(free)
    return sum(f for f in free if f < 1000)
