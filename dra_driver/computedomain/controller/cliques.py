"""A domain's cliques and status from its daemon pods (pure functions).

Each daemon pod says where it runs (``spec.nodeName``), its address (``status.podIP``),
its clique (the ``CLIQUE_LABEL`` its daemon puts on it once; an empty value means the
node's GPUs are in no clique, and the node is a clique of its own, :func:`names.no_clique_id`) and
whether it is Ready (its readiness probe asks ``nvidia-imex-ctl``). A pod that has not
labelled itself yet is in no clique yet.

Indices: a node keeps the index its clique object gives it for as long as its pod is in
that clique; a node joining gets the smallest index no other member holds. So a
daemon's peers never renumber when another node comes or goes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dra_driver.computedomain import names

Obj = dict[str, Any]
READY = "Ready"
NOT_READY = "NotReady"


@dataclass(frozen=True)
class Daemon:
    node: str
    ip: str
    clique_id: str
    ready: bool


def daemon_of(pod: Obj) -> Daemon | None:
    """The pod's daemon, or None while it has no node or has not said its clique."""
    node = pod.get("spec", {}).get("nodeName") or ""
    labels = pod.get("metadata", {}).get("labels") or {}
    if not node or names.CLIQUE_LABEL not in labels:
        return None
    clique_id = labels[names.CLIQUE_LABEL] or names.no_clique_id(node)
    conditions = pod.get("status", {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    ip = str(pod.get("status", {}).get("podIP") or "")
    return Daemon(node=node, ip=ip, clique_id=clique_id, ready=ready)


def daemons_of(pods: Iterable[Obj]) -> list[Daemon]:
    """One daemon per node: a pod being deleted gives way to its successor on that node."""
    chosen: dict[str, tuple[bool, str, Daemon]] = {}
    for pod in pods:
        daemon = daemon_of(pod)
        if daemon is None:
            continue
        meta = pod.get("metadata", {})
        rank = (not meta.get("deletionTimestamp"), str(meta.get("creationTimestamp", "")))
        if daemon.node not in chosen or rank > chosen[daemon.node][:2]:
            chosen[daemon.node] = (*rank, daemon)
    return [entry[2] for _, entry in sorted(chosen.items())]


def cliques(daemons: Iterable[Daemon], current: Mapping[str, list[Obj]]) -> dict[str, list[Obj]]:
    """Clique id -> ``daemons`` entries in index order; ``current`` is what the clique
    objects hold now (clique id -> their ``daemons``)."""
    members: dict[str, list[Daemon]] = {}
    for daemon in daemons:
        members.setdefault(daemon.clique_id, []).append(daemon)
    out: dict[str, list[Obj]] = {}
    for clique_id, group in sorted(members.items()):
        held = {str(e.get("nodeName")): int(e.get("index", -1))
                for e in current.get(clique_id, [])}  # fmt: skip
        present = {d.node for d in group}
        taken: set[int] = set()
        index: dict[str, int] = {}
        for node, value in held.items():
            if node in present and value >= 0 and value not in taken:
                index[node] = value
                taken.add(value)
        free = 0
        for daemon in sorted(group, key=lambda d: d.node):
            if daemon.node not in index:
                while free in taken:
                    free += 1
                index[daemon.node] = free
                taken.add(free)
        entries = [
            {"nodeName": d.node, "ipAddress": d.ip, "cliqueID": d.clique_id,
             "index": index[d.node], "status": READY if d.ready else NOT_READY}
            for d in group
        ]  # fmt: skip
        out[clique_id] = sorted(entries, key=lambda e: int(e["index"]))
    return out


def waiting(pods: Iterable[Obj], daemons: Iterable[Daemon]) -> tuple[list[str], int]:
    """Of the pods not being deleted and not in :func:`daemons_of`: the nodes they are
    on (their daemon has not said its clique yet) and how many have no node yet."""
    placed = {d.node for d in daemons}
    nodes: set[str] = set()
    unbound = 0
    for pod in pods:
        if pod.get("metadata", {}).get("deletionTimestamp"):
            continue
        node = pod.get("spec", {}).get("nodeName") or ""
        if not node:
            unbound += 1
        elif node not in placed:
            nodes.add(node)
    return sorted(nodes), unbound


def domain_status(
    entries: Mapping[str, list[Obj]], waiting_nodes: Iterable[str] = (), unbound: int = 0
) -> Obj:
    """``status`` of the domain: Ready once it has daemons, every one is Ready in its
    clique, and no daemon pod is still to be placed or to say its clique."""
    nodes = [
        {"name": e["nodeName"], "ipAddress": e["ipAddress"], "cliqueID": e["cliqueID"],
         "index": e["index"], "status": e["status"]}
        for group in entries.values() for e in group
    ]  # fmt: skip
    nodes += [{"name": n, "status": NOT_READY} for n in waiting_nodes]
    nodes.sort(key=lambda n: str(n["name"]))
    ready = bool(nodes) and not unbound and all(n["status"] == READY for n in nodes)
    return {"status": READY if ready else NOT_READY, "nodes": nodes}
