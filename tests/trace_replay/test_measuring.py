"""What the replay reads back: a MIG instance counts as its share of its GPU, and a pod
that names a shared claim is placed when that claim is allocated."""

from __future__ import annotations

from pathlib import Path

from bench.trace_replay.measuring import Snapshot, device_parts, held_milli, pod_claim
from dra_driver.workload.modes import profile_yaml
from dra_driver.workload.pools import DriverFlags, api_slices, node_pool


def _slices(tmp_path: Path) -> list[dict[str, object]]:
    path = tmp_path / "a100.yaml"
    path.write_text(profile_yaml("T4", 1, "mig"))
    specs = api_slices(node_pool(path, DriverFlags(mig_mode="dynamic")))
    return [{"spec": {**s, "pool": {"name": "n1"}}} for s in specs]


def _claim(*devices: str) -> dict[str, object]:
    results = [{"pool": "n1", "device": d} for d in devices]
    return {"status": {"allocation": {"devices": {"results": results}}}}


def test_a_mig_instance_holds_its_share_of_its_gpu(tmp_path: Path) -> None:
    slices = _slices(tmp_path)
    parts = device_parts(slices)
    four = next(k for k in parts if "4g40gb" in k[1])
    three = next(k for k in parts if "3g40gb" in k[1])
    assert parts[four].gpu == parts[three].gpu == "gpu-0"
    assert parts[four].milli == 571  # 4 of 7 compute slices (more than 4 of 8 memory)
    assert parts[("n1", "gpu-0")].milli == 1000
    snap = Snapshot(pods=[], claims=[_claim(four[1]), _claim(three[1])], slices=slices)
    assert held_milli(snap) == {("n1", "gpu-0"): 1000}  # 571 + 497, at most the GPU


def test_a_pod_naming_a_shared_claim_uses_it() -> None:
    named = {"spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "ts-3"}]}}
    templated = {
        "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]},
        "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p1-gpu-x"}]},
    }
    assert pod_claim(named) == "ts-3"
    assert pod_claim(templated) == "p1-gpu-x"
