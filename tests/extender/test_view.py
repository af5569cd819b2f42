"""The extender's view follows watch events: a claim's allocation takes its share of a
GPU and gives it back when deleted; a bound pod takes CPU and memory; a relist drops
what is gone."""

from __future__ import annotations

from typing import Any

from dra_driver.extender.view import ClusterView, demand_on
from dra_driver.scoring.fragmentation import Demand

Obj = dict[str, Any]
GPU_CAPS = {"memory": {"value": "16Gi"}, "computeShare": {"value": "100"}}


def _slice(node: str, gpus: int) -> Obj:
    devices = [{"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}},
                "capacity": GPU_CAPS} for i in range(gpus)]  # fmt: skip
    devices.append({"name": "mig-x", "attributes": {"type": {"string": "mig"}}})
    return {"metadata": {"name": f"{node}-s"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node, "pool": {"name": node},
                     "devices": devices}}  # fmt: skip


def _claim(name: str, device: str, consumed: Obj | None) -> Obj:
    result: Obj = {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n", "device": device}
    if consumed is not None:
        result["consumedCapacity"] = consumed
    return {"metadata": {"name": name, "namespace": "t"},
            "status": {"allocation": {"devices": {"results": [result]}}}}  # fmt: skip


def _view() -> ClusterView:
    v = ClusterView()
    v.replace("nodes", [{"metadata": {"name": "n"},
                         "status": {"allocatable": {"cpu": "8", "memory": "32Gi"}}}])  # fmt: skip
    v.replace("resourceslices", [_slice("n", 2)])
    v.replace("resourceclaims", [])
    v.replace("pods", [])
    return v


def test_allocations_take_and_give_back_gpu_shares() -> None:
    v = _view()
    v.apply(
        "resourceclaims", "ADDED", _claim("a", "gpu-0", {"memory": "4Gi", "computeShare": "30"})
    )
    v.apply(
        "resourceclaims", "ADDED", _claim("b", "gpu-0", {"memory": "2Gi", "computeShare": "10"})
    )
    v.apply("resourceclaims", "ADDED", _claim("w", "gpu-1", None))  # exclusive: all of it
    (state, gpu) = v.states(["n"])["n"]
    assert state.free == (600, 0)  # 40 % of compute, 37.5 % of memory: the larger counts
    assert gpu is not None and gpu.name == "gpu-0"
    v.apply("resourceclaims", "DELETED", _claim("a", "gpu-0", {"memory": "4Gi"}))
    v.apply("resourceclaims", "MODIFIED", {"metadata": {"name": "w", "namespace": "t"}})
    assert v.states(["n"])["n"][0].free == (875, 1000)  # b alone (2 of 16 Gi); w deallocated
    v.replace("resourceclaims", [])
    assert v.states(["n", "unknown"]).keys() == {"n"}
    assert v.states(["n"])["n"][0].free == (1000, 1000)


def test_bound_pods_take_cpu_and_memory_until_they_finish() -> None:
    v = _view()
    pod = {"metadata": {"name": "p", "namespace": "t"},
           "spec": {"nodeName": "n", "containers": [
               {"resources": {"requests": {"cpu": "1500m", "memory": "1Gi"}}},
               {"resources": {"requests": {"cpu": "500m"}}}]},
           "status": {"phase": "Running"}}  # fmt: skip
    v.apply("pods", "ADDED", pod)
    state = v.states(["n"])["n"][0]
    assert (state.cpu_free, state.memory_free) == (6000, 31 * 1024)
    v.apply("pods", "MODIFIED", {**pod, "status": {"phase": "Succeeded"}})
    state = v.states(["n"])["n"][0]
    assert (state.cpu_free, state.memory_free) == (8000, 32 * 1024)


def test_a_pod_demand_resolved_against_the_node_gpu() -> None:
    v = _view()
    gpu = v.states(["n"])["n"][1]
    share = {"capacity": {"requests": {"memory": "4Gi", "computeShare": "47"}}}
    assert demand_on(100, 200, share, gpu) == Demand(100, 200, share=470)
    assert demand_on(100, 200, {"count": 2}, gpu) == Demand(100, 200, gpus=2)
    assert demand_on(100, 200, None, gpu) == Demand(100, 200)
