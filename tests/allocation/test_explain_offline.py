"""``explain``'s per-device reasons and fixes, from files (no cluster)."""

from __future__ import annotations

from typing import Any

from dra_driver.commands.explain import explain
from tests.allocation.builders import DRIVER, attr, claim, device, device_class, exact, rslice


def reasons(objects: list[Any], name: str, engine: str = "cel-expr-python") -> dict[str, Any]:
    body = explain(objects, "ns", name, None, engine)
    (node,) = body["nodes"]
    return {d["device"]: d for r in node["requests"] for d in r["devices"]} | {"_node": node}


def test_each_device_gets_the_first_reason_in_the_schedulers_order() -> None:
    taint = {"key": "maint", "value": "yes", "effect": "NoSchedule"}
    counters = [{"name": "g0", "counters": {"mem": {"value": "10Gi"}}}]
    part = {
        "consumesCounters": [{"counterSet": "g0", "counters": {"mem": {"value": "10Gi"}}}],
        "capacity": {"memory": "16Gi"},
    }
    mem = {"capacity": {"memory": "16Gi"}}
    objs = [
        rslice("n1", [], name="a", counters=counters, count=2),
        rslice(
            "n1",
            [
                device("held", **mem),
                device("other-model", model="z", **mem),
                device("tainted", taints=[taint], **mem),
                device("small", capacity={"memory": "8Gi"}),
                device("p-used", **part),
                device("p-free", **part),
                device("good"),
            ],
            name="b",
            count=2,
        ),
        device_class(),
        {
            **claim("holder", exact("g")),
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {"request": "g", "driver": DRIVER, "pool": "n1", "device": "held"},
                            {"request": "g", "driver": DRIVER, "pool": "n1", "device": "p-used"},
                        ]
                    }
                }
            },
        },
        claim(
            "c",
            exact(
                "g",
                f'!has({attr("model")}) || {attr("model")} != "z"',
                capacity={"requests": {"memory": "4Gi"}},
                count=3,
            ),
        ),
    ]
    r = reasons(objs, "c")
    assert r["held"]["reason"] == "in use by claim ns/holder"
    assert r["other-model"]["reason"].startswith("claim selector #0 is false")
    assert "tainted maint=yes:NoSchedule, not tolerated" in r["tainted"]["reason"]
    assert r["tainted"]["fix"] == "add a matching toleration to the request"
    assert r["small"]["qualifies"]
    assert "has no capacity memory" in r["good"]["reason"]
    assert r["p-free"]["reason"].startswith("counter g0/mem: needs 10Gi")
    assert r["_node"]["fits"] is False
    assert r["_node"]["hints"] == ["request g: 1 device(s) qualify, 3 needed"]


def test_fix_points_at_the_standard_attribute() -> None:
    dev = device("d")
    dev["attributes"]["resource.kubernetes.io/pciBusID"] = {"string": "0000:01:00.0"}
    objs = [
        rslice("n1", [dev]),
        device_class(),
        claim("c", exact("g", f'{attr("pciBusID")} != ""')),
    ]
    for engine in ("cel-expr-python", "cel-python"):
        d = reasons(objs, "c", engine)["d"]
        assert "CEL runtime error" in d["reason"]
        assert d["fix"] == (
            "the attribute is published as resource.kubernetes.io/pciBusID: use "
            'device.attributes["resource.kubernetes.io"].pciBusID'
        )


def test_fix_for_quantities_compared_with_plain_numbers() -> None:
    objs = [
        rslice("n1", [device("d", capacity={"memory": "80Gi"})]),
        device_class(),
        claim("c", exact("g", f'device.capacity["{DRIVER}"].memory == "80Gi"')),
        claim(
            "ok", exact("g", f'device.capacity["{DRIVER}"].memory.compareTo(quantity("40Gi")) > 0')
        ),
    ]
    # Kubernetes rejects comparing a quantity with a string at compile time; cel-expr-python
    # cannot see the type (documented divergence), so the selector is simply false there.
    d = reasons(objs, "c")["d"]
    assert d["reason"].startswith("claim selector #0 is false")
    assert reasons(objs, "ok")["_node"]["fits"] is True


def test_match_attribute_hint_lists_the_values() -> None:
    gpus = [device(f"g{i}", numa=i % 2) for i in range(4)]
    match = [{"matchAttribute": f"{DRIVER}/numa"}]
    objs = [rslice("n1", gpus), device_class(), claim("c", exact("g", count=3), constraints=match)]
    (hint,) = reasons(objs, "c")["_node"]["hints"]
    assert "matchAttribute gpu.example.com/numa" in hint
    assert "0 (2 devices), 1 (2 devices)" in hint


def test_replay_sees_earlier_claims_and_template_claims() -> None:
    template = {
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t", "namespace": "ns"},
        "spec": {"spec": claim("x", exact("g", count=2))["spec"]},
    }
    ref = {"name": "gpus", "resourceClaimTemplateName": "t"}
    pod = {"kind": "Pod", "metadata": {"name": "p", "namespace": "ns"},
           "spec": {"resourceClaims": [ref]}}  # fmt: skip
    objs = [rslice("n1", [device("a"), device("b")]), device_class(), claim("first", exact("g")),
            template, pod]  # fmt: skip
    body = explain(objs, "ns", "p-gpus", None, "cel-expr-python", replay=True)
    assert body["pod"] == "p" and body["allocated"] is False
    (node,) = body["nodes"]
    devices = {d["device"]: d["reason"] for d in node["requests"][0]["devices"]}
    assert devices == {"a": "in use by claim ns/first", "b": "qualifies"}
