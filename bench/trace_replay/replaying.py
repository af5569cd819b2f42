"""One replay on a started control plane: build the trace's cluster, create the drawn
pods in order, and measure at each target of the GPU request.

Pods are created in draw order, one batch per target (the pods up to 100 % of the GPU
capacity requested, then those up to 130 %), from a few threads, so the scheduler's
queue sees them in (nearly) creation order; none is deleted. A batch is done when each
of its pods is bound or the scheduler has reported it unschedulable (``PodScheduled``
``False``, reason ``Unschedulable``), and then no pod was bound for ``settle_s``: a pod
rejected before its claim existed is retried and bound within that. Capacity only
shrinks, so an unschedulable pod stays so; one neither bound nor rejected by
``timeout_s`` is counted ``undecided``. The measurement of a target reads the API
after its batch (:mod:`bench.trace_replay.measuring`).
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.fleet.measure import BindWatch
from bench.fleet.run import deviceclasses
from bench.trace_replay.building import Fleet, build
from bench.trace_replay.measuring import RESOURCE, Snapshot, fragmented_pct, rates
from dra_driver.devcluster import Cluster
from dra_driver.devcluster.schedconfig import DEFAULT_SCHEDULER
from dra_driver.workload.claims import Claims, claim_object, pod_object, template_object
from dra_driver.workload.drawing import TARGETS, Draw, draw_pods, gpu_capacity_milli
from dra_driver.workload.modes import Mode, product_names
from dra_driver.workload.trace import TraceNode, TracePod

NAMESPACE = "trace"


class Outcomes(BindWatch):
    """:class:`BindWatch` that also records pods the scheduler reported unschedulable."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        super().__init__(cluster, namespace)
        self.unschedulable: dict[str, str] = {}
        self.last_bound = time.monotonic()

    def _event(self, event: Mapping[str, Any]) -> None:
        before = len(self.bound)
        super()._event(event)
        obj = event.get("object") or {}
        name = str((obj.get("metadata") or {}).get("name"))
        for cond in (obj.get("status") or {}).get("conditions") or []:
            if (cond.get("type"), cond.get("status"), cond.get("reason")) == (
                "PodScheduled", "False", "Unschedulable"
            ):  # fmt: skip
                with self._cond:
                    self.unschedulable[name] = str(cond.get("message", ""))
                    self._cond.notify_all()
        if len(self.bound) != before:
            self.last_bound = time.monotonic()

    def settle(self, names: Iterable[str], timeout: float, quiet: float) -> list[str]:
        """Wait until every pod of ``names`` is bound or unschedulable and none was bound
        for ``quiet`` seconds (at most ``timeout``); the pods still undecided."""
        wanted = set(names)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                undecided = wanted - self.bound.keys() - self.unschedulable.keys()
                now = time.monotonic()
                if not undecided and now - self.last_bound >= quiet:
                    return []
                if now >= deadline:
                    return sorted(undecided)
                self._cond.wait(min(deadline - now, 0.2))


@dataclass(frozen=True)
class ReplaySettings:
    mode: Mode
    seed: int = 42
    scale: float = 1.0
    """Share of the trace's nodes, stratified (:func:`~bench.trace_replay.drawing.scale_nodes`)."""
    timeout_s: float = 600.0
    """Longest wait for one batch to be decided."""
    settle_s: float = 3.0
    """Seconds without a new binding before a batch counts as done."""
    workers: int = 4
    """Threads creating pods (more reorder the queue more)."""
    scheduler_name: str = DEFAULT_SCHEDULER
    """The scheduler profile the pods select (``spec.schedulerName``)."""


@dataclass
class Replay:
    summary: dict[str, Any]
    fleet: Fleet
    draw: Draw
    claims: Claims
    snapshots: list[Snapshot]
    """One per target, in :data:`~bench.trace_replay.drawing.TARGETS` order."""


def snapshot(cluster: Cluster) -> Snapshot:
    return Snapshot(
        pods=cluster.rest.get(f"/api/v1/namespaces/{NAMESPACE}/pods")["items"],
        claims=cluster.rest.get(f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims")["items"],
        slices=cluster.rest.get(f"{RESOURCE}/resourceslices")["items"],
    )


def _create(cluster: Cluster, objs: Sequence[dict[str, Any]], workers: int) -> None:
    def one(obj: dict[str, Any]) -> None:
        cluster.rest.create(f"/api/v1/namespaces/{NAMESPACE}/pods", obj)

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="trace-pods") as ex:
        list(ex.map(one, objs))


def replay(
    cluster: Cluster,
    nodes: Sequence[TraceNode],
    pods: Sequence[TracePod],
    settings: ReplaySettings,
    workdir: Path,
) -> Replay:
    """Replay the draw of ``settings.seed`` on ``nodes`` (already scaled)."""
    began = time.monotonic()
    draw = draw_pods(pods, gpu_capacity_milli(nodes), settings.seed)
    cluster.apply(deviceclasses())
    fleet = build(cluster, nodes, settings.mode, draw.pods, workdir / "profiles")
    claims = Claims(settings.mode, fleet.models)
    objs = []
    for i, pod in enumerate(draw.pods):
        claim = claims.claim_for(pod) if pod.num_gpu else None
        obj = pod_object(f"p{i:05d}", NAMESPACE, pod, claim)
        if settings.scheduler_name != DEFAULT_SCHEDULER:
            obj["spec"]["schedulerName"] = settings.scheduler_name
        objs.append(obj)
    cluster.create_namespace(NAMESPACE)
    for name, spec in claims.templates.items():
        path = f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaimtemplates"
        cluster.rest.create(path, template_object(name, NAMESPACE, spec))
    for name, spec in claims.shared.items():
        path = f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims"
        cluster.rest.create(path, claim_object(name, NAMESPACE, spec))
    setup_s = time.monotonic() - began

    watch = Outcomes(cluster, NAMESPACE)
    watch.start()
    snapshots, measured, undecided = [], [], []
    t0 = time.monotonic()
    start = 0
    try:
        for target, end in zip(TARGETS, draw.reached, strict=True):
            batch = objs[start:end]
            _create(cluster, batch, settings.workers)
            left = watch.settle((o["metadata"]["name"] for o in batch),
                                settings.timeout_s, settings.settle_s)  # fmt: skip
            undecided += left
            snap = snapshot(cluster)
            snapshots.append(snap)
            figures = rates(snap, draw.capacity_milli)
            figures["fragmented_gpu_pct"] = fragmented_pct(snap, nodes, pods)
            measured.append((target, figures))
            start = end
    finally:
        watch.stop()
    replay_s = time.monotonic() - t0 - settings.settle_s * len(TARGETS)
    summary = _summary(settings, fleet, draw, claims, measured, watch, undecided)
    summary.update({
        "setup_s": round(setup_s, 1),
        "replay_s": round(replay_s, 1),
        "pods_per_s": round(len(objs) / replay_s, 1) if replay_s > 0 else None,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "client_qps": cluster.options.client_qps,
        "scheduler_config": sched.source if (sched := cluster.options.scheduler_config) else None,
        "scheduler_name": settings.scheduler_name,
    })  # fmt: skip
    return Replay(summary, fleet, draw, claims, snapshots)


def _summary(
    settings: ReplaySettings,
    fleet: Fleet,
    draw: Draw,
    claims: Claims,
    measured: list[tuple[float, dict[str, Any]]],
    watch: Outcomes,
    undecided: list[str],
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "mode": settings.mode,
        "seed": settings.seed,
        "scale": settings.scale,
        "nodes": len(fleet.nodes),
        "gpu_nodes": sum(1 for n in fleet.nodes if n.gpus),
        "gpus": fleet.gpus,
        "pods": len(draw.pods),
        "templates": len(claims.templates),
        "shared_claims": len(claims.shared),
        "models": product_names(fleet.models),
        "settings": fleet.published.settings(),
    }
    for target, figures in measured:
        pct = round(100 * target)
        out[f"allocation_rate_{pct}"] = figures.pop("allocation_rate")
        out[f"held_rate_{pct}"] = figures.pop("held_rate")
        out[f"fragmented_gpu_pct_{pct}"] = figures.pop("fragmented_gpu_pct")
        out[f"at_{pct}"] = figures
    out["unschedulable"] = measured[-1][1]["unschedulable"]
    reasons = Counter(_reason(m) for m in watch.unschedulable.values())
    out["unschedulable_reasons"] = dict(reasons.most_common(5))
    out["undecided"] = len(undecided)
    return out


def _reason(message: str) -> str:
    """The scheduler's message without node counts or the preemption part, so that
    rejections for the same reasons count together."""
    text = message.partition(": ")[2].partition(". preemption:")[0] or message
    return ", ".join(sorted(re.sub(r"\b\d+ ", "", part) for part in text.split(", ")))
