"""Differential test: ``simulate``'s allocator against the real kube-scheduler.

A seeded random corpus (tests/allocation/corpus.py: a few hundred inventories
on hand-made nodes, several hundred claims covering every allocator feature
and the tricky CEL cases) is applied to the dev cluster in one or two phases.
Then, for every pod, against the real final state of every other claim:

- a pod the scheduler bound: its real allocation must be one our allocator
  accepts (the same search, restricted to exactly the devices it got);
- a pod the scheduler left pending: our allocator must find no allocation,
  and a CEL error on one side must be a CEL error on the other.

It also replays the phases in order with ``Simulation`` and counts how often
the very same devices were chosen (the allocator is deterministic, so all of
them should be). Every difference fails the test unless it is listed in
EXCEPTIONS with its justification.

Two checks fall back to the claims created before the pod when the final state
disagrees, for reasons that are Kubernetes behaviour, not allocator rules:
admin-access shares are not counted in the cluster's allocated state, so a
later claim may use capacity an admin share took at the time; and a pod whose
last attempt met a CEL error on a device that is in use by the end stays
pending until the scheduler's backoff retry, which may come after the test
reads the state. Both are counted in the printed stats.

A NoExecute taint tolerated by a toleration without an effect is left out of
the corpus: the scheduler allocates the device, then the device-taint-eviction
controller (which only honours effect NoExecute) deletes the pod; ``simulate``
warns about exactly this.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dra_driver.allocation.allocator import Attempt
from dra_driver.allocation.inputs import build
from dra_driver.allocation.inventory import AllocationFailed, Inventory
from dra_driver.allocation.model import Claim, DeviceId, Request, parse_claim
from dra_driver.allocation.simulation import Simulation
from dra_driver.allocation.state import AllocatedState
from dra_driver.cel import SelectorEvaluator, load_engine
from dra_driver.devcluster import Cluster
from tests.allocation.corpus import NAMESPACE_LABEL, Generator, device_classes

RESOURCE = "/apis/resource.k8s.io/v1"
SCENARIOS = int(os.environ.get("DRA_DIFF_SCENARIOS", "200"))
SEED = int(os.environ.get("DRA_DIFF_SEED", "15"))
SETTLE_TIMEOUT = 180.0

EXCEPTIONS: list[tuple[Callable[[dict[str, Any]], bool], str]] = []
"""(predicate over a difference record, why it is not a bug)."""


def _condition(pod: dict[str, Any]) -> dict[str, Any] | None:
    for cond in (pod.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "PodScheduled":
            return dict(cond)
    return None


def _settled(pod: dict[str, Any]) -> bool:
    if (pod.get("spec") or {}).get("nodeName"):
        return True
    cond = _condition(pod)
    return (
        cond is not None
        and cond.get("status") == "False"
        and "not found" not in str(cond.get("message", ""))
    )


def _wait_settled(cluster: Cluster, ns: str, names: set[str]) -> None:
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while True:
        pods = cluster.rest.get(f"/api/v1/namespaces/{ns}/pods")["items"]
        pending = {
            p["metadata"]["name"]
            for p in pods
            if p["metadata"]["name"] in names and not _settled(p)
        }
        if not pending:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"{len(pending)} pods never settled, e.g. {sorted(pending)[:5]}")
        time.sleep(0.5)


def _create(cluster: Cluster, ns: str, obj: dict[str, Any]) -> None:
    if obj["kind"] == "Pod":
        cluster.rest.create(f"/api/v1/namespaces/{ns}/pods", obj)
    else:
        cluster.rest.create(f"{RESOURCE}/namespaces/{ns}/resourceclaims", obj)


@pytest.mark.timeout(1200)
def test_simulate_agrees_with_the_kube_scheduler(cluster: Cluster, tmp_path: Path) -> None:
    suffix = secrets.token_hex(2)
    ns = f"differential-{suffix}"
    cluster.apply({"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": ns, "labels": NAMESPACE_LABEL}})  # fmt: skip
    cluster.apply(device_classes())
    gen = Generator(SEED, ns, suffix)
    scenarios = [gen.scenario(i) for i in range(SCENARIOS)]
    node_objs = []
    for sc in scenarios:
        node_objs.append(cluster.create_node(sc.node))
        for s in sc.slices:
            cluster.rest.create(f"{RESOURCE}/resourceslices", s)
    phase_pods: list[list[dict[str, Any]]] = []
    for phase in range(2):
        created = []
        for sc in scenarios:
            for obj in sc.phases[phase] if phase < len(sc.phases) else ():
                _create(cluster, ns, obj)
                if obj["kind"] == "Pod":
                    created.append(obj)
        _wait_settled(cluster, ns, {p["metadata"]["name"] for p in created})
        phase_pods.append(created)
    time.sleep(2)  # let late retries land before reading the final state
    pods = {
        p["metadata"]["name"]: p for p in cluster.rest.get(f"/api/v1/namespaces/{ns}/pods")["items"]
    }
    claim_objs = cluster.rest.get(f"{RESOURCE}/resourceclaims")["items"]
    slices = cluster.rest.get(f"{RESOURCE}/resourceslices")["items"]
    classes = cluster.rest.get(f"{RESOURCE}/deviceclasses")["items"]

    objects = (
        [{"kind": "ResourceSlice", **s} for s in slices]
        + [{"kind": "DeviceClass", **c} for c in classes]
        + [{"kind": "Node", **n} for n in node_objs]
    )
    inputs = build(objects)
    evaluator = SelectorEvaluator(load_engine("cel-expr-python"))
    inventory = Inventory(inputs.slices, inputs.classes, inputs.nodes, evaluator)
    nodes = {n.name: n for n in inputs.nodes}
    real = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in claim_objs}

    differences: list[dict[str, Any]] = []
    stats = dict.fromkeys(
        ("pods", "bound", "pending", "pending_cel", "claims", "same_devices",
         "other_valid_devices", "valid_in_creation_order", "reason_in_creation_order"),
        0,
    )  # fmt: skip
    missing: list[str] = []
    before: list[dict[str, Any]] = []
    for phase in phase_pods:
        for pod_spec in phase:
            name = pod_spec["metadata"]["name"]
            pod = pods.get(name)
            if pod is None:
                missing.append(name)
                continue
            claim_names = [r["resourceClaimName"] for r in pod_spec["spec"]["resourceClaims"]]
            mine = [real[(ns, n)] for n in claim_names]
            others = [
                parse_claim(c)
                for key, c in real.items()
                if key not in {(ns, n) for n in claim_names}
            ]
            state = AllocatedState.from_claims(others)
            fresh = [parse_claim({k: v for k, v in c.items() if k != "status"}) for c in mine]
            node = nodes[pod_spec["spec"]["nodeSelector"]["kubernetes.io/hostname"]]
            stats["pods"] += 1
            stats["claims"] += len(mine)
            record: dict[str, Any] = {
                "pod": name,
                "node": node.name,
                "claims": [c["spec"] for c in mine],
            }
            if pod["spec"].get("nodeName"):
                stats["bound"] += 1
                wanted = [_results(c) for c in mine]
                record["real"] = [{k: sorted(v) for k, v in w.items()} for w in wanted]
                ok = _accepts(inventory, state, node, fresh, wanted, record)
                if ok is None:
                    # Against the claims created before this pod instead: admin-access
                    # shares are not counted in the cluster's allocated state, so a later
                    # claim may legitimately use capacity this pod's admin share took.
                    earlier = AllocatedState.from_claims(parse_claim(c) for c in before)
                    ok = _accepts(inventory, earlier, node, fresh, wanted, record)
                    stats["valid_in_creation_order"] += ok is not None
                if ok is None:
                    record["difference"] = (
                        "scheduler allocated; our allocator rejects that allocation"
                    )
                    differences.append(record)
            else:
                stats["pending"] += 1
                message = str((_condition(pod) or {}).get("message", ""))
                record["scheduler_message"] = message
                found, sim_error = _attempt(inventory, state, node, fresh)
                if ("CEL" in message) != ("CEL" in sim_error):
                    # The scheduler's message is from its last attempt; a device whose
                    # selector errored then may be in use by now and no longer evaluated
                    # (its next retry, after a backoff, would then succeed).
                    earlier = AllocatedState.from_claims(parse_claim(c) for c in before)
                    found_then, error_then = _attempt(inventory, earlier, node, fresh)
                    if found_then is None and ("CEL" in message) == ("CEL" in error_then):
                        stats["reason_in_creation_order"] += 1
                        found, sim_error = None, error_then
                if found is not None:
                    record["difference"] = "scheduler left it pending; our allocator allocates"
                    record["simulated"] = [[str(ch.device_id) for ch in cl] for cl in found]
                    differences.append(record)
                elif ("CEL" in message) != ("CEL" in sim_error):
                    record["difference"] = "pending on both sides, for different reasons"
                    record["simulated_error"] = sim_error
                    differences.append(record)
                stats["pending_cel"] += "CEL" in message
            before += mine
    # Replay in order: the deterministic first fit should pick the very same devices.
    replay_objects = list(objects)
    for phase in phase_pods:
        for pod_spec in phase:
            for n in (r["resourceClaimName"] for r in pod_spec["spec"]["resourceClaims"]):
                c = real[(ns, n)]
                replay_objects.append(
                    {"kind": "ResourceClaim", **{k: v for k, v in c.items() if k != "status"}}
                )
            replay_objects.append({"kind": "Pod", **pod_spec})
    replay = build(replay_objects)
    sim = Simulation(
        Inventory(replay.slices, replay.classes, replay.nodes, evaluator), AllocatedState()
    )
    for outcome in sim.run(replay.workloads):
        got = real[(ns, outcome.claim.name)]
        alloc = (got.get("status") or {}).get("allocation")
        if not outcome.allocated or not alloc:
            continue
        theirs = sorted((r["request"], r["device"]) for r in alloc["devices"]["results"])
        ours = sorted((k, d) for k, ds in outcome.devices().items() for d in ds)
        stats["same_devices" if theirs == ours else "other_valid_devices"] += 1

    assert not missing, (
        f"pods deleted during the test: {missing} {[_events(cluster, ns, m) for m in missing]}"
    )
    unexplained = [d for d in differences if not any(pred(d) for pred, _ in EXCEPTIONS)]
    report = tmp_path / "differential.json"
    report.write_text(json.dumps({"stats": stats, "differences": differences}, indent=1))
    print(f"differential: seed={SEED} scenarios={SCENARIOS} {json.dumps(stats)}; report {report}")
    assert stats["bound"] > stats["pods"] // 3 and stats["pending"] > 5, stats
    assert not unexplained, json.dumps(unexplained[:5], indent=1)


def _accepts(
    inventory: Inventory,
    state: AllocatedState,
    node: Any,
    claims: list[Claim],
    wanted: list[dict[str, set[str]]],
    record: dict[str, Any],
) -> Any:
    """Our allocator's answer when restricted to exactly the devices the scheduler chose."""
    try:
        return Attempt(inventory, state, node, claims, allowed=_allow(wanted)).run()
    except AllocationFailed as err:
        record["simulated_error"] = str(err)
        return None


def _attempt(
    inventory: Inventory, state: AllocatedState, node: Any, claims: list[Claim]
) -> tuple[Any, str]:
    try:
        return Attempt(inventory, state, node, claims).run(), ""
    except AllocationFailed as err:
        return None, str(err)


def _results(claim: dict[str, Any]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for r in claim["status"]["allocation"]["devices"]["results"]:
        out.setdefault(r["request"], set()).add(str(DeviceId(r["driver"], r["pool"], r["device"])))
    return out


def _allow(wanted: list[dict[str, set[str]]]) -> Callable[[int, Request, DeviceId], bool]:
    def allowed(ci: int, request: Request, device: DeviceId) -> bool:
        return str(device) in wanted[ci].get(request.result_name, set())

    return allowed


def _events(cluster: Cluster, ns: str, name: str) -> list[str]:
    events = cluster.rest.get(f"/api/v1/namespaces/{ns}/events")["items"]
    return [
        f"{e.get('reason')}: {e.get('message')}"
        for e in events
        if (e.get("involvedObject") or {}).get("name", "").startswith(name)
    ]
