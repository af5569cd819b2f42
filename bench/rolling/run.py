"""One rolling-update run on a started :class:`~dra_driver.devcluster.Cluster`: start every
plugin, leave them idle, restart them one at a time; :func:`run_rolling` is what
``python -m bench.rolling`` and ``tests/cluster/test_rolling.py`` both call."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.rolling.apicounts import (
    ApiServerMetrics,
    Window,
    cpu_seconds,
    flow_schemas,
    plugin_rules,
    window,
)
from bench.rolling.plugins import DRIVER, PluginFlags, PluginNode
from dra_driver.devcluster import Cluster, wait_until
from tests.plugin.clusterkit import RBAC_DIR, apply_rbac, node_bound_kubeconfig, sa_of

ROOT = Path(__file__).resolve().parents[2]
DEVICECLASSES = ROOT / "deploy" / "deviceclasses"
SLICE_VERBS = ("create", "update", "patch", "delete")
"""Plugin requests that write slices (their RBAC allows create, update, delete)."""
SETTLE_S = 2.0
"""Waited after the last plugin is ready, before a phase's closing snapshot: readiness
does not wait for the slice watch, whose request would fall into the next phase."""


@dataclass(frozen=True)
class RollSettings:
    flags: PluginFlags
    plugins: int = 50
    idle_s: float = 300.0
    """How long the started plugins are left alone before the roll: a multiple of the
    plugin's 300 s slice watch, whose end (a list and a new watch) is all an idle
    plugin asks the API server, so that each plugin's is counted as often as it comes."""
    surge: bool = False
    """maxSurge 1 / maxUnavailable 0 (the chart's default: the new process starts beside
    the old one, which is stopped once the new one is ready) instead of maxUnavailable 1."""
    timeout_s: float = 300.0
    """For all plugins to become ready at the start, and for each one in the roll."""


@dataclass
class RollRun:
    """The JSON summary plus what the test checks."""

    summary: dict[str, Any]
    nodes: list[PluginNode]
    slices_before: dict[str, tuple[str, str, int]] = field(default_factory=dict)
    """Slice name -> (node, resourceVersion, pool generation) before the roll."""
    slices_after: dict[str, tuple[str, str, int]] = field(default_factory=dict)
    turns: dict[str, dict[str, float]] = field(default_factory=dict)
    """Node -> its restart's timings, for each node that was ready again."""


def _slices(cluster: Cluster) -> dict[str, tuple[str, str, int]]:
    items = cluster.rest.get("/apis/resource.k8s.io/v1/resourceslices")["items"]
    return {
        s["metadata"]["name"]: (
            s["spec"]["nodeName"],
            s["metadata"]["resourceVersion"],
            int(s["spec"]["pool"]["generation"]),
        )
        for s in items
        if s["spec"].get("driver") == DRIVER
    }


def _install_flow_schemas(cluster: Cluster, schemas: Sequence[dict[str, Any]]) -> None:
    """Applied, then waited for until APF's config controller has taken each in (it sets
    the ``Dangling`` condition), so no request is counted under the default schema."""
    cluster.apply(schemas)
    names = {s["metadata"]["name"] for s in schemas}
    path = "/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas"

    def digested() -> bool:
        items = cluster.rest.get(path)["items"]
        seen = {
            s["metadata"]["name"]
            for s in items
            if any(c.get("type") == "Dangling" for c in s.get("status", {}).get("conditions", []))
        }
        return names <= seen

    wait_until(digested, timeout=30, what="FlowSchemas taken in by APF")


def _make_nodes(cluster: Cluster, settings: RollSettings, workdir: Path) -> list[PluginNode]:
    nodes = []
    for i in range(settings.plugins):
        name = f"roll-{i:04d}"
        node = cluster.create_node(name)
        work = workdir / f"{i:04d}"
        work.mkdir(parents=True)
        nodes.append(
            PluginNode(
                name=name,
                workdir=work,
                kubeconfig=node_bound_kubeconfig(cluster, node, DRIVER),
                flags=settings.flags,
                surge=settings.surge,
            )
        )
    return nodes


def _wait_ready(nodes: Iterable[PluginNode], timeout_s: float) -> None:
    pending = list(nodes)
    deadline = time.monotonic() + timeout_s
    while pending:
        pending = [n for n in pending if not n.check()]
        if not pending:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{len(pending)} plugin(s) not ready after {timeout_s:.0f} s; first:\n"
                + pending[0].log_tail()
            )
        time.sleep(0.1)


def _restart(node: PluginNode, surge: bool, timeout_s: float) -> dict[str, float]:
    """One node's turn: maxUnavailable 1 stops the old process first; maxSurge 1 starts
    the new one beside it and stops the old one once the new one is ready."""
    began = time.monotonic()
    if surge:
        node.start_beside()
        _wait_ready([node], timeout_s)
        ready = time.monotonic() - began
        return {"ready_s": ready, "exit_s": node.stop_old(), "turn_s": time.monotonic() - began}
    exit_s = node.restart()
    _wait_ready([node], timeout_s)
    return {"exit_s": exit_s, "ready_s": time.monotonic() - began - exit_s,
            "turn_s": time.monotonic() - began}  # fmt: skip


def _spread(values: Sequence[float]) -> dict[str, float]:
    return {"p50": round(statistics.median(values), 2), "max": round(max(values), 2)}


def _per(counts: Mapping[str, float], divisor: float, digits: int = 2) -> dict[str, float]:
    out = {k: round(v / divisor, digits) for k, v in counts.items()}
    out["total"] = round(sum(counts.values()) / divisor, digits)
    return out


def _slice_writes(w: Window) -> int:
    return sum(v for k, v in w.plugin.items() if k.split()[0] in SLICE_VERBS and
               k.endswith(" resourceslices"))  # fmt: skip


def _phase(w: Window) -> dict[str, Any]:
    return {
        "seconds": round(w.seconds, 1),
        "plugin_requests": dict(w.plugin),
        "plugin_requests_total": w.plugin_total,
        "plugin_slice_writes": _slice_writes(w),
        "slice_writes_all_users": w.slice_writes,
        "apiserver_requests_all_users": w.requests,
        "cpu_s": dict(w.cpu_s),
    }


def _plugin_cpu(nodes: Iterable[PluginNode]) -> float:
    return sum(cpu_seconds(n.process.pid if n.process else None) for n in nodes)


def run_rolling(
    cluster: Cluster,
    settings: RollSettings,
    workdir: Path,
    progress: Callable[[str], None] = lambda _: None,
) -> RollRun:
    """Start ``settings.plugins`` plugins, idle, roll; stops every plugin before it
    returns or raises."""
    cluster.apply([yaml.safe_load(p.read_text()) for p in sorted(DEVICECLASSES.glob("*.yaml"))])
    apply_rbac(cluster, DRIVER)
    namespace, account = sa_of(DRIVER)
    rules = plugin_rules(RBAC_DIR)
    _install_flow_schemas(cluster, flow_schemas(rules, namespace, account))
    pids = {c.name: c.pid for c in cluster.components if c.pid is not None}
    metrics = ApiServerMetrics(
        lambda: cluster.fetch("kube-apiserver", "/metrics", timeout=30), rules, pids
    )
    nodes = _make_nodes(cluster, settings, workdir)
    n = len(nodes)
    load_before = os.getloadavg()
    try:
        progress(f"starting {n} plugins")
        s0 = metrics.snapshot()
        for node in nodes:
            node.start()
        _wait_ready(nodes, settings.timeout_s)
        ready_all_s = time.monotonic() - s0.at
        time.sleep(SETTLE_S)
        s1 = metrics.snapshot()
        published = _slices(cluster)
        missing = {node.name for node in nodes} - {v[0] for v in published.values()}
        if missing:
            raise RuntimeError(f"ready but no slices for {sorted(missing)[:5]}")

        progress(f"all ready in {ready_all_s:.1f} s; idle for {settings.idle_s:g} s")
        cpu0 = _plugin_cpu(nodes)
        time.sleep(settings.idle_s)
        s2 = metrics.snapshot()
        plugin_cpu = _plugin_cpu(nodes) - cpu0

        progress("rolling")
        before = _slices(cluster)
        s3 = metrics.snapshot()
        turns: dict[str, dict[str, float]] = {}
        for i, node in enumerate(nodes):
            turns[node.name] = _restart(node, settings.surge, settings.timeout_s)
            if (i + 1) % 10 == 0:
                progress(f"  {i + 1}/{n} restarted")
        roll_s = time.monotonic() - s3.at
        time.sleep(SETTLE_S)
        s4 = metrics.snapshot()
        after = _slices(cluster)
    finally:
        for node in nodes:
            node.stop_old()
            node.stop()
    start, idle, roll = window(s0, s1), window(s1, s2), window(s3, s4)
    changed = sorted(k for k in before if after.get(k) != before[k])
    idle_cpu_rate = idle.cpu_s.get("kube-apiserver", 0.0) / idle.seconds
    api_cpu_per_start = (roll.cpu_s.get("kube-apiserver", 0.0) - idle_cpu_rate * roll.seconds) / n
    summary: dict[str, Any] = {
        "plugins": n,
        "profile": settings.flags.profile,
        "mig_mode": settings.flags.mig_mode,
        "strategy": "maxSurge=1,maxUnavailable=0" if settings.surge else "maxUnavailable=1",
        "ready": "/readyz 200 (registered by the bench as the kubelet would; slices in sync)",
        "slices": len(before),
        "start": _phase(start)
        | {"all_ready_s": round(ready_all_s, 1), "per_plugin": _per(start.plugin, n, 1)},
        "idle": _phase(idle)
        | {
            "per_plugin_per_hour": _per(idle.plugin, n * idle.seconds / 3600, 1),
            "plugin_cpu_s_per_hour": round(plugin_cpu / n / idle.seconds * 3600, 1),
        },
        "roll": _phase(roll)
        | {
            "wall_s": round(roll_s, 1),
            # Raw: what the other plugins asked meanwhile is in it; idle_in_roll is that
            # at their mean idle rate, but their slice watches, started together, end
            # together every 300 s, so a roll of under 300 s sees all or none of them.
            "per_start": _per(roll.plugin, n),
            "idle_in_roll": round(idle.plugin_total / idle.seconds * roll.seconds, 1),
            "apiserver_cpu_s_per_start": round(api_cpu_per_start, 3),
            "exit_s": _spread([t["exit_s"] for t in turns.values()]),
            "ready_s": _spread([t["ready_s"] for t in turns.values()]),
            "turn_s": _spread([t["turn_s"] for t in turns.values()]),
            "slices_rewritten": changed,
        },
        "load_average": {
            "before": [round(x, 2) for x in load_before],
            "after": [round(x, 2) for x in os.getloadavg()],
        },
    }
    return RollRun(summary, nodes, before, after, turns)
