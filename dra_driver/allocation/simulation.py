"""Allocate claims one after the other, each seeing the earlier ones, over every candidate node.

For each claim (or each pod, whose claims the scheduler allocates together)
every candidate node gets its own allocation attempt. A CEL error on any node
fails the claim, as it fails the scheduler's whole attempt. Among several
feasible nodes the scheduler's choice depends on scores that DRA does not
set (beyond preferring earlier ``firstAvailable`` subrequests), so it is
effectively random: the result says so and names the first.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from dra_driver.allocation.allocator import Attempt, Choice
from dra_driver.allocation.inventory import AllocationFailed, Inventory
from dra_driver.allocation.model import AllocatedDevice, Claim, Node
from dra_driver.allocation.pools import selector_matches
from dra_driver.allocation.state import AllocatedState


@dataclass
class Workload:
    """What to allocate together: one claim, or a pod's unallocated claims."""

    claims: list[Claim]
    pod: str = ""
    node_name: str = ""
    node_selector: Mapping[str, str] = field(default_factory=dict)
    node_affinity: Mapping[str, Any] | None = None
    pinned_node: str = ""
    """Set when the pod also uses an already allocated claim bound to a node."""


@dataclass
class Outcome:
    claim: Claim
    allocated: bool
    node: str = ""
    choices: list[Choice] = field(default_factory=list)
    reason: str = ""
    feasible_nodes: int = 0
    pod: str = ""
    preallocated: bool = False

    def devices(self) -> dict[str, list[str]]:
        if self.preallocated:
            out: dict[str, list[str]] = {}
            for r in self.claim.allocated or ():
                out.setdefault(r.request, []).append(r.device.device)
            return out
        grouped: dict[str, list[str]] = {}
        for c in self.choices:
            grouped.setdefault(c.request.result_name, []).append(c.device_id.device)
        return grouped

    def warnings(self) -> list[str]:
        """What will go wrong after allocation although the scheduler allocates."""
        out = []
        for c in self.choices:
            for taint in c.device.taints:
                if taint.effect != "NoExecute":
                    continue
                if any(
                    t.effect == "NoExecute" and t.tolerates(taint) for t in c.request.tolerations
                ):
                    continue
                out.append(
                    f"device {c.device_id.device} has the NoExecute taint "
                    f"{taint.key}={taint.value}, tolerated only by a toleration without an "
                    "effect: the scheduler allocates it, but the device-taint-eviction "
                    "controller evicts the pod (name effect NoExecute in the toleration)"
                )
        return out

    def as_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "name": self.claim.name,
            "namespace": self.claim.namespace,
            "allocated": self.allocated,
        }
        if self.pod:
            body["pod"] = self.pod
        if self.allocated:
            body["node"] = self.node
            body["devices"] = self.devices()
            if self.feasible_nodes > 1:
                body["nodeChoice"] = (
                    f"random: {self.feasible_nodes} nodes fit equally well for DRA; the "
                    "scheduler picks by other plugins' scores (e.g. spreading) or at random; "
                    "shown is the first by name"
                )
            if self.preallocated:
                body["preallocated"] = True
            if warnings := self.warnings():
                body["warnings"] = warnings
        else:
            body["reason"] = self.reason
        return body


def node_allowed(workload: Workload, node: Node) -> bool:
    if workload.pinned_node and node.name != workload.pinned_node:
        return False
    if workload.node_name and node.name != workload.node_name:
        return False
    if any(node.labels.get(k) != v for k, v in workload.node_selector.items()):
        return False
    required = (workload.node_affinity or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    return not required or selector_matches(required, node)


FIRST_AVAILABLE_MAX = 8


def _spec_key(claim: Claim) -> str:
    """Equal for claims with equal specs (e.g. from one template)."""
    key = claim.__dict__.get("_spec_key")
    if key is None:
        key = claim.__dict__["_spec_key"] = repr((claim.requests, claim.constraints))
    return str(key)


def _score(claims: Sequence[Claim], result: Sequence[Sequence[Choice]]) -> int:
    """The scheduler's DRA node score: higher for earlier ``firstAvailable`` subrequests."""
    score = 0
    for claim, choices in zip(claims, result, strict=True):
        chosen = {c.request.result_name for c in choices if c.request.parent}
        for alternatives in claim.requests:
            for i, sub in enumerate(alternatives):
                if sub.parent and sub.result_name in chosen:
                    score += FIRST_AVAILABLE_MAX - i
    return score


_Result = list[list[Choice]] | None | AllocationFailed


class Simulation:
    """Allocates workloads in order, remembering each node's answer while nothing it sees changed.

    An attempt's outcome depends only on the claims' specs and the state of the
    pools the node sees, so it is cached under (specs, pool versions); an
    allocation bumps the versions of the pools it used. With many identical
    claims (templates), most nodes then cost a dictionary lookup.
    """

    def __init__(self, inventory: Inventory, state: AllocatedState) -> None:
        self.inventory = inventory
        self.state = state
        self._versions: dict[tuple[str, str], int] = {}
        self._memo: dict[tuple[object, ...], _Result] = {}
        self.attempts = 0

    def _attempt(self, node: Node, claims: list[Claim]) -> _Result:
        pools = self.inventory.pools(node)
        key = (
            node.name,
            tuple(_spec_key(c) for c in claims),
            tuple(self._versions.get((p.driver, p.name), 0) for p in pools),
        )
        if key in self._memo:
            return self._memo[key]
        self.attempts += 1
        result: _Result
        try:
            result = Attempt(self.inventory, self.state, node, claims).run()
        except AllocationFailed as err:
            result = err
        self._memo[key] = result
        return result

    def run(self, workloads: Iterable[Workload], only_node: str | None = None) -> list[Outcome]:
        outcomes: list[Outcome] = []
        for workload in workloads:
            outcomes.extend(self.allocate(workload, only_node))
        return outcomes

    def candidates(self, workload: Workload, only_node: str | None) -> list[Node]:
        return [
            n
            for n in self.inventory.nodes
            if (only_node is None or n.name == only_node) and node_allowed(workload, n)
        ]

    def allocate(self, workload: Workload, only_node: str | None = None) -> list[Outcome]:
        # A claim shared by several pods is allocated with the first; later pods only
        # follow it to its node.
        claims = [c for c in workload.claims if c.allocated is None]
        if not claims:
            return []
        pinned = [c.allocated_node for c in workload.claims if c.allocated and c.allocated_node]
        if pinned and not workload.pinned_node:
            workload = replace(workload, pinned_node=pinned[0])
        nodes = self.candidates(workload, only_node)
        feasible: list[tuple[Node, list[list[Choice]]]] = []
        error = ""
        for node in nodes:
            result = self._attempt(node, claims)
            if isinstance(result, AllocationFailed):
                error = error or f"node {node.name}: {result}"
                continue
            if result is not None:
                feasible.append((node, result))
        if error:
            reason = f"{error} (the scheduler aborts the whole attempt on this error" + (
                "; on a large cluster whether it meets it first depends on its node order)"
                if feasible
                else ")"
            )
            return [self._failed(c, workload, reason) for c in claims]
        if not feasible:
            if not nodes:
                reason = "no candidate node" + (f" named {only_node}" if only_node else "")
            else:
                reason = (
                    f"cannot allocate all claims: none of {len(nodes)} candidate node(s) has "
                    "matching free devices for every request (dra-driver explain says why)"
                )
            return [self._failed(c, workload, reason) for c in claims]
        best = max(_score(claims, r) for _, r in feasible)
        feasible = [(n, r) for n, r in feasible if _score(claims, r) == best]
        node, result = feasible[0]
        outcomes = []
        for claim, choices in zip(claims, result, strict=True):
            self._commit(claim, node, choices)
            outcomes.append(
                Outcome(
                    claim, True, node.name, choices, feasible_nodes=len(feasible), pod=workload.pod
                )
            )
        return outcomes

    @staticmethod
    def _failed(claim: Claim, workload: Workload, reason: str) -> Outcome:
        return Outcome(claim, False, reason=reason, pod=workload.pod)

    def _commit(self, claim: Claim, node: Node, choices: Sequence[Choice]) -> None:
        results = [
            AllocatedDevice(
                request=c.request.result_name,
                device=c.device_id,
                admin_access=c.request.admin_access,
                share_id=str(uuid.uuid4()) if c.consumed is not None else "",
                consumed=c.consumed or {},
            )
            for c in choices
        ]
        claim.allocated = results
        claim.allocated_node = node.name
        self.state.add(claim.key, results)
        for r in results:
            pool = (r.device.driver, r.device.pool)
            self._versions[pool] = self._versions.get(pool, 0) + 1
