"""A live cluster as a workload in the trace's terms, for ``dra-driver plan --from-cluster``.

Nodes: every Node with its allocatable CPU and memory; its GPUs are what this driver
publishes for it (devices of ``type`` ``gpu`` by ``uuid``, and the parents of ``mig``
devices by ``parentUUID``), their model the emulator board whose product name they
carry (a node of several products counts as its most common one; a product the
emulator has no board for is refused, naming the known ones). A GPU in static MIG mode
with no instance publishes no device, so it is not counted.

Pods: every pod not Succeeded or Failed, with its containers' CPU and memory requests.
What it holds of the GPUs is read from its claims' allocations, per GPU: a whole
device 1000 thousandths, a consumable share the largest fraction of any capacity it
consumed, an MPS slot 1000 / ``mpsSlots``, a MIG device the larger of its slices / 7
and its memory / the board's. A pod on one GPU asks that (at most 1000), a pod on
several asks them whole; ``gpu_spec`` is the model it is on now (a claim keeps its
product). A claim shared by several pods counts once, for the first pod by name.

Usage (the plugin's ``dra_driver_claim_*`` metrics, as ``dra-driver report`` reads
them): a pod holding one whole GPU whose claim's peak need (p95 utilization, peak
memory / memory given, the larger) x headroom is below 1 asks only that: what it
would be given by a share sized to what it used. Multi-GPU pods stay whole.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from dra_driver.emulation.profile import load_models
from dra_driver.quantity import parse, pod_requests
from dra_driver.workload.trace import TraceNode, TracePod

DRIVER = "gpu.nvidia.com"
MIB = 2**20
Obj = dict[str, Any]


@dataclass
class LiveWorkload:
    nodes: list[TraceNode]
    pods: list[TracePod]
    claims: int = 0
    """Claims on this driver's devices held by the pods."""
    rightsized: int = 0
    """Pods whose whole GPU was cut to what their usage metrics say they need."""
    notes: list[str] = field(default_factory=list)


def _attr(device: Obj, name: str) -> Any:
    value = (device.get("attributes") or {}).get(name)
    return None if value is None else next(iter(value.values()), None)


def _quantity(value: Any) -> Fraction:
    return parse(str(value)) if value not in (None, "") else Fraction(0)


class _Devices:
    """Every published device of this driver by (pool, name), with its GPU and board."""

    def __init__(self, slices: Sequence[Obj], boards: Mapping[str, str]) -> None:
        self.by_id: dict[tuple[str, str], Obj] = {}
        self.gpus: dict[str, dict[str, str]] = {}
        """node -> GPU uuid -> board."""
        self.unknown: set[str] = set()
        for s in slices:
            spec = s.get("spec") or {}
            if spec.get("driver") != DRIVER or not spec.get("nodeName"):
                continue
            pool = str((spec.get("pool") or {}).get("name") or "")
            for device in spec.get("devices") or ():
                self.by_id[(pool, str(device.get("name")))] = device
                gpu = self.gpu_of(device)
                product = str(_attr(device, "productName") or "")
                if not gpu:
                    continue
                if product not in boards:
                    self.unknown.add(product)
                    continue
                self.gpus.setdefault(str(spec["nodeName"]), {})[gpu] = boards[product]

    @staticmethod
    def gpu_of(device: Obj) -> str:
        kind = _attr(device, "type")
        if kind == "mig":
            return str(_attr(device, "parentUUID") or "")
        return str(_attr(device, "uuid") or "") if kind == "gpu" else ""


def _held_milli(result: Obj, device: Obj, board_memory: int) -> int:
    """Thousandths of its GPU one allocation result holds."""
    kind = _attr(device, "type")
    capacity = device.get("capacity") or {}
    if kind == "mig":
        profile = str(_attr(device, "profile") or "7g")
        slices = Fraction(int(profile.split("g", 1)[0] or 7), 7)
        memory = _quantity((capacity.get("memory") or {}).get("value"))
        return math.ceil(1000 * max(slices, memory / board_memory if board_memory else 0))
    consumed = result.get("consumedCapacity") or {}
    if consumed:
        fractions = [
            _quantity(v) / total
            for k, v in consumed.items()
            if (total := _quantity((capacity.get(k) or {}).get("value")))
        ]
        return min(1000, math.ceil(1000 * max(fractions, default=Fraction(1))))
    slots = _attr(device, "mpsSlots")
    if isinstance(slots, int) and slots > 0:
        return math.ceil(1000 / slots)
    return 1000


def _claim_names(pod: Obj) -> list[str]:
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    generated = {s.get("name"): s.get("resourceClaimName")
                 for s in status.get("resourceClaimStatuses") or ()}  # fmt: skip
    names = []
    for ref in spec.get("resourceClaims") or ():
        name = ref.get("resourceClaimName") or generated.get(ref.get("name"))
        if name:
            names.append(str(name))
    return names


def live_workload(
    nodes: Sequence[Obj],
    slices: Sequence[Obj],
    claims: Sequence[Obj],
    pods: Sequence[Obj],
    usage: Mapping[tuple[str, str], float] | None = None,
) -> LiveWorkload:
    """The cluster's nodes and pods as the trace's rows. ``usage``: (namespace, claim) ->
    the share of its GPU a claim needs (peak x headroom, 0..1)."""
    models = load_models()
    boards = {m.product_name: name for name, m in models.items()}
    devices = _Devices(slices, boards)
    if devices.unknown:
        raise ValueError(
            f"products {sorted(devices.unknown)} have no emulator board; known: {sorted(boards)}"
        )
    out = LiveWorkload([], [])
    for node in sorted(nodes, key=lambda n: str(n["metadata"]["name"])):
        name = str(node["metadata"]["name"])
        alloc = (node.get("status") or {}).get("allocatable") or {}
        gpus = devices.gpus.get(name, {})
        model = Counter(gpus.values()).most_common(1)[0][0] if gpus else ""
        if len(set(gpus.values())) > 1:
            out.notes.append(f"node {name}: GPUs of several products, counted as {model}")
        out.nodes.append(TraceNode(name, math.floor(_quantity(alloc.get("cpu")) * 1000),
                                   math.floor(_quantity(alloc.get("memory")) / MIB),
                                   len(gpus), model))  # fmt: skip
    by_claim = {(c["metadata"].get("namespace", ""), c["metadata"]["name"]): c for c in claims}
    counted: set[tuple[str, str]] = set()
    usage = usage or {}
    for pod in sorted(pods, key=lambda p: (p["metadata"].get("namespace", ""),
                                           p["metadata"]["name"])):  # fmt: skip
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        ns, name = str(pod["metadata"].get("namespace", "")), str(pod["metadata"]["name"])
        cpu, memory = pod_requests(pod)
        per_gpu: dict[str, int] = {}
        models_held: set[str] = set()
        own: list[tuple[str, str]] = []
        for claim_name in _claim_names(pod):
            key = (ns, claim_name)
            claim = by_claim.get(key)
            allocation = ((claim or {}).get("status") or {}).get("allocation") or {}
            results = [r for r in (allocation.get("devices") or {}).get("results") or ()
                       if r.get("driver") == DRIVER]  # fmt: skip
            if not results or key in counted:
                continue
            counted.add(key)
            own.append(key)
            for r in results:
                device = devices.by_id.get((str(r.get("pool")), str(r.get("device"))))
                if device is None:
                    out.notes.append(f"claim {ns}/{claim_name}: device {r.get('device')} "
                                     "is not published (left out)")  # fmt: skip
                    continue
                gpu = devices.gpu_of(device)
                board = boards.get(str(_attr(device, "productName") or ""), "")
                models_held.add(board)
                held = _held_milli(r, device, models[board].memory_mib * MIB if board else 0)
                per_gpu[gpu] = min(1000, per_gpu.get(gpu, 0) + held)
        out.claims += len(own)
        num_gpu = len(per_gpu)
        milli = 1000 if num_gpu != 1 else next(iter(per_gpu.values()))
        if num_gpu == 1 and milli == 1000 and len(own) == 1 and own[0] in usage:
            need = max(1, min(1000, math.ceil(1000 * usage[own[0]])))
            if need < 1000:
                milli = need
                out.rightsized += 1
        spec = tuple(sorted(m for m in models_held if m))
        out.pods.append(TracePod(f"{ns}/{name}", cpu, memory, num_gpu,
                                 milli if num_gpu else 0, spec))  # fmt: skip
    return out
