"""The Extender API's ``prioritize`` verb: kube-scheduler POSTs ``ExtenderArgs``
(``Pod``, and ``NodeNames`` with ``nodeCacheCapable: true``, else ``Nodes``, a
NodeList) and reads a ``HostPriorityList`` (``[{"Host": ..., "Score": 0..10}]``);
field names as in k8s.io/kube-scheduler/extender/v1 (Go's default JSON names).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dra_driver.extender.view import ClusterView, Gpu, demand_on
from dra_driver.scoring.fragmentation import Demand, priorities


class BadArgs(ValueError):
    """The request body is not ``ExtenderArgs``; the message names the field."""


def node_names(args: Mapping[str, Any]) -> list[str]:
    """The candidate nodes of ``args``: ``NodeNames``, or the names in ``Nodes.items``."""
    names = args.get("NodeNames")
    if names is None:
        nodes = args.get("Nodes")
        if not isinstance(nodes, Mapping):
            raise BadArgs("ExtenderArgs: neither NodeNames nor Nodes given")
        items = nodes.get("items") or []
        names = [(n.get("metadata") or {}).get("name") for n in items if isinstance(n, Mapping)]
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise BadArgs("ExtenderArgs.NodeNames: want a list of node names")
    return names


def prioritize(view: ClusterView, args: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Scores for the candidate nodes of ``args``: fewer stranded GPU capacity, more."""
    pod = args.get("Pod")
    if not isinstance(pod, Mapping):
        raise BadArgs("ExtenderArgs.Pod: want a Pod object")
    names = node_names(args)
    states = view.states(names)
    cpu, mem, request = view.pod_request(pod)
    demands: dict[int | None, Demand] = {}

    def demand(gpu: Gpu | None) -> Demand:
        key = None if gpu is None else id(gpu.capacity)  # one mapping per model (the view)
        if key not in demands:
            demands[key] = demand_on(cpu, mem, request, gpu)
        return demands[key]

    first = next((g for _, g in states.values() if g is not None), None)
    scorer = view.scorer(demand(first))
    increases: list[float | None] = []
    for name in names:
        known = states.get(name)
        if known is None:
            increases.append(None)
            continue
        state, gpu = known
        increases.append(scorer.increase(state, demand(gpu)))
    scores = priorities(increases)
    return [{"Host": n, "Score": s} for n, s in zip(names, scores, strict=True)]
