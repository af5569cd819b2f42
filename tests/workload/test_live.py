"""``plan --from-cluster``'s reading of a live cluster (:mod:`dra_driver.workload.live`),
on the slices the driver's own code builds: what each pod holds of its GPUs, and what
usage metrics cut a barely used whole GPU down to."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.gpu.hardware.consumable import ConsumableGpus
from dra_driver.workload.live import live_workload
from dra_driver.workload.pools import DriverFlags, api_slices, node_pool
from dra_driver.workload.trace import TracePod

Obj = dict[str, Any]
H100 = "H100-SXM5-80GB"


def _slices(node: str, flags: DriverFlags, profile: str = "dgx-h100") -> list[Obj]:
    return [
        {"spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                  "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, **spec}}
        for spec in api_slices(node_pool(profile, flags))
    ]  # fmt: skip


def _node(name: str) -> Obj:
    return {"metadata": {"name": name}, "status": {"allocatable": {"cpu": "96", "memory": "1Ti"}}}


def _claim(name: str, node: str, *results: Obj) -> Obj:
    full = [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": node, **r} for r in results]
    return {"metadata": {"namespace": "ml", "name": name},
            "status": {"allocation": {"devices": {"results": full}}}}  # fmt: skip


def _pod(name: str, claim: str | None, phase: str = "Running", cpu: str = "4") -> Obj:
    refs = [{"name": "gpu", "resourceClaimName": claim}] if claim else []
    return {
        "metadata": {"namespace": "ml", "name": name},
        "spec": {"resourceClaims": refs,
                 "containers": [{"resources": {"requests": {"cpu": cpu, "memory": "8Gi"}}},
                                {"resources": {"requests": {"cpu": "500m"}}}]},
        "status": {"phase": phase},
    }  # fmt: skip


def test_pods_ask_what_their_claims_hold_and_usage_cuts_an_idle_whole_gpu() -> None:
    slices = _slices("n0", DriverFlags()) + _slices(
        "n1", DriverFlags(consumable=ConsumableGpus(all=True))
    )
    claims = [
        _claim("idle", "n0", {"device": "gpu-0"}),
        _claim("busy", "n0", {"device": "gpu-1"}),
        _claim("pair", "n0", {"device": "gpu-2"}, {"device": "gpu-3"}),
        _claim("share", "n1", {"device": "gpu-0", "shareID": "0d9c1f2e-0000-4000-8000-000000000001",
                               "consumedCapacity": {"memory": "20389Mi", "computeShare": "10"}}),
    ]  # fmt: skip
    pods = [_pod("a", "idle"), _pod("b", "busy"), _pod("c", "pair"), _pod("d", "share"),
            _pod("e", None), _pod("f", "idle", phase="Succeeded")]  # fmt: skip
    usage = {("ml", "idle"): 0.24, ("ml", "busy"): 1.3}
    live = live_workload([_node("n1"), _node("n0")], slices, claims, pods, usage)
    assert [(n.name, n.gpus, n.model, n.cpu_milli, n.memory_mib) for n in live.nodes] == [
        ("n0", 8, H100, 96_000, 1024 * 1024), ("n1", 8, H100, 96_000, 1024 * 1024)]  # fmt: skip
    assert live.pods == [
        TracePod("ml/a", 4500, 8192, 1, 240, (H100,)),  # a whole GPU used at 20 % (x1.2)
        TracePod("ml/b", 4500, 8192, 1, 1000, (H100,)),
        TracePod("ml/c", 4500, 8192, 2, 1000, (H100,)),
        TracePod("ml/d", 4500, 8192, 1, 250, (H100,)),  # the larger of 25 % memory, 10 % SMs
        TracePod("ml/e", 4500, 8192, 0, 0, ()),
    ]
    assert (live.claims, live.rightsized) == (4, 1)


def test_mig_devices_hold_their_slices_or_memory_and_unknown_products_are_refused() -> None:
    slices = _slices("m0", DriverFlags(), profile="dgx-a100-mig")
    mig = next(d for s in slices for d in s["spec"]["devices"] if "3g" in d["name"])
    live = live_workload([_node("m0")], slices, [_claim("c", "m0", {"device": mig["name"]})],
                         [_pod("p", "c")])  # fmt: skip
    # gpu-5 is in MIG mode with no instance: it publishes nothing, so it is not counted
    assert live.nodes[0].gpus == 7 and live.nodes[0].model == "A100-SXM4-80GB"
    assert live.pods[0].num_gpu == 1 and live.pods[0].gpu_milli == 491  # 40192 of 81920 MiB > 3/7
    odd = _slices("x", DriverFlags())
    odd[0]["spec"]["devices"][0]["attributes"]["productName"] = {"string": "NVIDIA B300"}
    with pytest.raises(ValueError, match=r"products \['NVIDIA B300'\] have no emulator board"):
        live_workload([_node("x")], odd, [], [])
