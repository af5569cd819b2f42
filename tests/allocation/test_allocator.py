"""The allocator's rules, one scenario each, on both CEL engines.

Each expectation follows the scheduler's structured allocator (first fit in
pool/slice/device order, backtracking, constraints, counters, capacity,
taints); the differential test in tests/cluster checks the same against the
real kube-scheduler over a random corpus.
"""

from __future__ import annotations

from tests.allocation.builders import (
    attr,
    claim,
    device,
    device_class,
    exact,
    first_available,
    rslice,
)

GPUS = [device(f"gpu-{i}", numa=i // 2, model="a" if i < 3 else "b") for i in range(4)]


def test_first_fit_in_device_order_and_exact_count(sim) -> None:
    out = sim([rslice("n1", GPUS), device_class(), claim("c", exact("g", count=2))])
    assert out["c"]["devices"] == {"g": ["gpu-0", "gpu-1"]}
    assert out["c"]["node"] == "n1"


def test_each_claim_sees_the_earlier_ones(sim) -> None:
    objs = [rslice("n1", GPUS), device_class()]
    objs += [claim(f"c{i}", exact("g", count=2)) for i in range(3)]
    out = sim(objs)
    assert out["c0"]["devices"] == {"g": ["gpu-0", "gpu-1"]}
    assert out["c1"]["devices"] == {"g": ["gpu-2", "gpu-3"]}
    assert not out["c2"]["allocated"]
    assert "cannot allocate" in out["c2"]["reason"]


def test_match_attribute_backtracks(sim) -> None:
    gpus = [device("a", numa=0), device("b", numa=1), device("c", numa=1)]
    c = claim("c", exact("g", count=2), constraints=[{"matchAttribute": "gpu.example.com/numa"}])
    assert sim([rslice("n1", gpus), device_class(), c])["c"]["devices"] == {"g": ["b", "c"]}


def test_distinct_attribute(sim) -> None:
    c = claim("c", exact("g", count=2), constraints=[{"distinctAttribute": "gpu.example.com/numa"}])
    assert sim([rslice("n1", GPUS), device_class(), c])["c"]["devices"] == {"g": ["gpu-0", "gpu-2"]}


def test_constraint_over_two_requests(sim) -> None:
    c = claim(
        "c",
        exact("x", attr('model == "b"')),
        exact("y", attr('model == "a"')),
        constraints=[{"matchAttribute": "gpu.example.com/numa", "requests": ["x", "y"]}],
    )
    out = sim([rslice("n1", GPUS), device_class(), c])["c"]
    assert out["devices"] == {"x": ["gpu-3"], "y": ["gpu-2"]}


def test_all_mode_takes_every_match_and_fails_if_one_is_in_use(sim) -> None:
    objs = [rslice("n1", GPUS), device_class()]
    out = sim([*objs, claim("all", exact("g", attr('model == "a"'), allocationMode="All"))])
    assert out["all"]["devices"] == {"g": ["gpu-0", "gpu-1", "gpu-2"]}
    out = sim([*objs, claim("one", exact("g")), claim("all", exact("g", allocationMode="All"))])
    assert not out["all"]["allocated"]


def test_first_available_falls_back_and_names_the_subrequest(sim) -> None:
    c = claim(
        "c", first_available("r", ("big", attr('model == "z"')), ("small", attr('model == "b"')))
    )
    out = sim([rslice("n1", GPUS), device_class(), c])["c"]
    assert out["devices"] == {"r/small": ["gpu-3"]}


def test_first_available_prefers_the_node_with_the_earlier_subrequest(sim) -> None:
    objs = [
        rslice("n1", [device("x", model="b")]),
        rslice("n2", [device("y", model="a")]),
        device_class(),
        claim("c", first_available("r", ("a", attr('model == "a"')), ("b", attr('model == "b"')))),
    ]
    out = sim(objs)["c"]
    assert (out["node"], out["devices"]) == ("n2", {"r/a": ["y"]})
    assert "nodeChoice" not in out


def test_equal_nodes_are_reported_as_a_random_choice(sim) -> None:
    objs = [rslice("n1", GPUS), rslice("n2", GPUS), device_class(), claim("c", exact("g"))]
    out = sim(objs)["c"]
    assert out["node"] == "n1" and out["nodeChoice"].startswith("random: 2 nodes")
    assert sim(objs, node="n2")["c"]["node"] == "n2"


def test_admin_access_may_use_allocated_devices(sim) -> None:
    objs = [rslice("n1", [device("only")]), device_class(), claim("user", exact("g"))]
    objs.append(claim("admin", exact("g", adminAccess=True)))
    out = sim(objs)
    assert out["user"]["allocated"] and out["admin"]["devices"] == {"g": ["only"]}


def test_taints_block_unless_tolerated(sim) -> None:
    taint = {"key": "health", "value": "bad", "effect": "NoSchedule"}
    info = {"key": "note", "value": "x", "effect": "None"}
    gpus = [device("sick", taints=[taint]), device("fine", taints=[info])]
    objs = [rslice("n1", gpus), device_class()]
    tol = [{"key": "health", "operator": "Exists", "effect": "NoSchedule"}]
    out = sim([*objs, claim("c", exact("g", count=2))])
    assert not out["c"]["allocated"]
    out = sim([*objs, claim("c", exact("g", count=2, tolerations=tol))])
    assert out["c"]["devices"] == {"g": ["sick", "fine"]}


def test_counters_of_partitionable_devices(sim) -> None:
    counters = [{"name": "gpu-0", "counters": {"mem": {"value": "40Gi"}}}]
    parts = [
        device(
            f"p{i}",
            size=s,
            consumesCounters=[{"counterSet": "gpu-0", "counters": {"mem": {"value": f"{v}Gi"}}}],
        )
        for i, (s, v) in enumerate([("half", 20), ("half", 20), ("full", 40)])
    ]
    objs = [
        rslice("n1", [], name="a-counters", counters=counters, count=2),
        rslice("n1", parts, name="b-devices", count=2),
        device_class(),
        claim("h1", exact("g", attr('size == "half"'))),
        claim("full", exact("g", attr('size == "full"'))),
        claim("h2", exact("g", attr('size == "half"'))),
    ]
    out = sim(objs)
    assert out["h1"]["devices"] == {"g": ["p0"]}
    assert not out["full"]["allocated"]  # 20Gi of 40Gi are gone
    assert out["h2"]["devices"] == {"g": ["p1"]}


def test_consumable_capacity_on_a_shared_device(sim) -> None:
    shared = device(
        "shared",
        allowMultipleAllocations=True,
        capacity={"memory": "40Gi"},
        capacity_policy={
            "memory": {"default": "10Gi", "validRange": {"min": "10Gi", "step": "10Gi"}}
        },
    )
    objs = [rslice("n1", [shared]), device_class()]
    objs += [
        claim(f"c{i}", exact("g", capacity={"requests": {"memory": "15Gi"}})) for i in range(3)
    ]
    out = sim(objs)
    # 15Gi rounds up to 20Gi: two fit in 40Gi, the third does not.
    assert [out[f"c{i}"]["allocated"] for i in range(3)] == [True, True, False]


def test_requested_capacity_filters_unshared_devices(sim) -> None:
    gpus = [
        device("small", capacity={"memory": "16Gi"}),
        device("big", capacity={"memory": "80Gi"}),
    ]
    c = claim("c", exact("g", capacity={"requests": {"memory": "40Gi"}}))
    assert sim([rslice("n1", gpus), device_class(), c])["c"]["devices"] == {"g": ["big"]}


def test_incomplete_and_obsolete_pools(sim) -> None:
    objs = [
        rslice("n1", [device("old")], generation=1),
        rslice("n1", [device("new")], name="n1-new", generation=2, count=2),
        device_class(),
        claim("c", exact("g")),
    ]
    out = sim(objs)["c"]
    # Generation 2 wins but has only 1 of 2 slices: incomplete, nothing allocatable.
    assert not out["allocated"]
    objs[1]["spec"]["pool"]["resourceSliceCount"] = 1
    assert sim(objs)["c"]["devices"] == {"g": ["new"]}


def test_duplicate_device_names_make_the_pool_invalid(sim) -> None:
    objs = [
        rslice("n1", [device("d")], name="s1", count=2),
        rslice("n1", [device("d")], name="s2", count=2),
        device_class(),
        claim("c", exact("g")),
    ]
    assert "invalid resource pools" in sim(objs)["c"]["reason"]


def test_cel_runtime_error_fails_the_claim_with_the_device(sim) -> None:
    gpus = [device("plain"), device("mig", profile="1g")]
    objs = [rslice("n1", gpus), device_class()]
    bad = sim([*objs, claim("c", exact("g", attr('profile == "1g"')))])["c"]
    assert not bad["allocated"]
    assert "gpu.example.com/n1/plain" in bad["reason"] and "CEL runtime error" in bad["reason"]
    good = sim(
        [*objs, claim("c", exact("g", f'has({attr("profile")}) && {attr("profile")} == "1g"'))]
    )
    assert good["c"]["devices"] == {"g": ["mig"]}


def test_missing_device_class_is_reported(sim) -> None:
    out = sim([rslice("n1", GPUS), claim("c", exact("g", cls="nope"))])["c"]
    assert "device class nope does not exist" in out["reason"]


def test_no_execute_taint_tolerated_without_effect_is_allocated_with_a_warning(sim) -> None:
    # The scheduler tolerates it (empty effect matches every effect); the
    # device-taint-eviction controller only honours effect NoExecute and evicts.
    taint = {"key": "health", "value": "bad", "effect": "NoExecute"}
    objs = [rslice("n1", [device("d", taints=[taint])]), device_class()]
    loose = sim(
        [*objs, claim("c", exact("g", tolerations=[{"key": "health", "operator": "Exists"}]))]
    )
    assert loose["c"]["allocated"] and "evicts the pod" in loose["c"]["warnings"][0]
    strict = [{"key": "health", "operator": "Exists", "effect": "NoExecute"}]
    assert "warnings" not in sim([*objs, claim("c", exact("g", tolerations=strict))])["c"]


def test_a_claim_shared_by_two_pods_is_allocated_once(sim) -> None:
    def pod(name: str, claim_name: str) -> dict:
        ref = {"name": "c", "resourceClaimName": claim_name}
        return {"kind": "Pod", "metadata": {"name": name, "namespace": "ns"},
                "spec": {"resourceClaims": [ref]}}  # fmt: skip

    objs = [rslice("n1", GPUS), rslice("n2", GPUS), device_class(), claim("shared", exact("g"))]
    objs += [claim("own", exact("g", count=4)), pod("a", "shared"), pod("b", "shared")]
    objs.append(
        {
            **pod("c", "own"),
            "spec": {
                "resourceClaims": [
                    {"name": "c", "resourceClaimName": "own"},
                    {"name": "d", "resourceClaimName": "shared"},
                ]
            },
        }
    )
    out = sim(objs)
    assert out["shared"]["devices"] == {"g": ["gpu-0"]} and out["shared"]["node"] == "n1"
    # The third pod also uses the shared claim, so it must go to n1, where 3 GPUs are left.
    assert not out["own"]["allocated"]
