"""Clique membership, indices and domain status from daemon pods (pure)."""

from __future__ import annotations

from typing import Any

from dra_driver.computedomain import names
from dra_driver.computedomain.controller.cliques import (
    Daemon,
    cliques,
    daemons_of,
    domain_status,
    waiting,
)


def pod(
    node: str, clique: str | None, *, ready: bool = True, ip: str = "10.0.0.1",
    deleting: bool = False, created: str = "2026-01-01T00:00:00Z",
) -> dict[str, Any]:  # fmt: skip
    labels = {names.DOMAIN_LABEL: "u"} | ({} if clique is None else {names.CLIQUE_LABEL: clique})
    meta: dict[str, Any] = {"labels": labels, "creationTimestamp": created}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-02T00:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": node}, "status": {
        "podIP": ip, "conditions": [{"type": "Ready", "status": str(ready)}]}}  # fmt: skip


def d(node: str, clique: str = "c.1", ready: bool = True) -> Daemon:
    return Daemon(node=node, ip=f"ip-{node}", clique_id=clique, ready=ready)


def indices(entries: list[dict[str, Any]]) -> dict[str, int]:
    return {e["nodeName"]: e["index"] for e in entries}


def test_new_nodes_take_the_smallest_unused_index_and_members_keep_theirs() -> None:
    first = cliques([d("n2"), d("n1")], {})
    assert indices(first["c.1"]) == {"n1": 0, "n2": 1}
    # n1 leaves: n2 keeps 1; n3 joins and takes the freed 0, n4 takes 2.
    second = cliques([d("n2"), d("n3"), d("n4")], first)
    assert indices(second["c.1"]) == {"n2": 1, "n3": 0, "n4": 2}
    assert [e["index"] for e in second["c.1"]] == [0, 1, 2]  # listed in index order
    # Nothing changes when nothing changed (no rewrite of the clique object).
    assert cliques([d("n4"), d("n3"), d("n2")], second) == second


def test_cliques_number_apart_and_a_node_without_clique_is_its_own() -> None:
    pods = [pod("a", "x.1"), pod("b", "y.2"), pod("c", ""), pod("e", None)]
    found = cliques(daemons_of(pods), {})
    assert set(found) == {"x.1", "y.2", "none-c"}  # "e" has not said its clique yet
    assert all(entries[0]["index"] == 0 for entries in found.values())


def test_a_pod_being_replaced_gives_way_to_its_successor() -> None:
    pods = [pod("a", "x.1", ip="old", deleting=True, created="2026-01-01T00:00:00Z"),
            pod("a", "x.1", ip="new", ready=False, created="2026-01-01T00:01:00Z")]  # fmt: skip
    (only,) = daemons_of(pods)
    assert (only.ip, only.ready) == ("new", False)


def test_the_domain_is_ready_once_every_daemon_is() -> None:
    assert domain_status({}) == {"status": "NotReady", "nodes": []}
    found = cliques([d("n1"), d("n2", ready=False)], {})
    status = domain_status(found)
    assert status["status"] == "NotReady"
    assert [(n["name"], n["status"]) for n in status["nodes"]] == [
        ("n1", "Ready"), ("n2", "NotReady")]  # fmt: skip
    assert domain_status(cliques([d("n1"), d("n2")], found))["status"] == "Ready"


def test_a_daemon_pod_not_yet_placed_or_in_a_clique_keeps_the_domain_not_ready() -> None:
    pods = [pod("a", "x.1"), pod("b", None)]
    placed = daemons_of(pods)
    waiting_nodes, unbound = waiting(pods, placed)
    assert (waiting_nodes, unbound) == (["b"], 0)
    status = domain_status(cliques(placed, {}), waiting_nodes, unbound)
    assert status["status"] == "NotReady"
    assert [(n["name"], n["status"]) for n in status["nodes"]] == [
        ("a", "Ready"), ("b", "NotReady")]  # fmt: skip
    unplaced = {"metadata": {"labels": {}}, "spec": {}, "status": {}}
    assert waiting([pod("a", "x.1"), unplaced], placed) == ([], 1)
    assert domain_status(cliques(placed, {}), [], 1)["status"] == "NotReady"
    assert domain_status(cliques(placed, {}))["status"] == "Ready"
