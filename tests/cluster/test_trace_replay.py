"""The Alibaba trace replay at CI size: a stratified 1/20 of the nodes, the seed-42 draw,
through the real v1.37 kube-scheduler, with whole GPUs, consumable shares and
time-sliced shared claims. The checks read the API objects each replay left (pods,
claims, slices) and recompute what the replay reports, rather than trusting its figures."""

from __future__ import annotations

import tempfile
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.fleet.run import CLIENT_BURST, CLIENT_QPS
from bench.trace_replay.building import MODEL_LABEL
from bench.trace_replay.replaying import Replay, ReplaySettings, replay
from dra_driver.devcluster import BinariesError, Cluster, ClusterOptions, find_binaries
from dra_driver.quantity import parse
from dra_driver.workload.claims import ANNOTATION
from dra_driver.workload.drawing import scale_nodes
from dra_driver.workload.modes import Mode
from dra_driver.workload.trace import NODES_FILE, PODS_FILE, read_nodes, read_pods
from tests.trace_replay.test_trace_files import trace_dir

SUBSET = 20
MODES: tuple[Mode, ...] = ("whole", "consumable", "time-slicing")
pytestmark = pytest.mark.timeout(900)  # the three replays run in the first test's setup
Obj = dict[str, Any]


@pytest.fixture(scope="module")
def replays() -> Iterator[dict[str, tuple[Replay, list[Obj]]]]:
    """Each mode's replay and the Node objects of its cluster."""
    try:
        binaries = find_binaries()
    except BinariesError as err:
        pytest.fail(f"control-plane binaries unavailable: {err}", pytrace=False)
    nodes = scale_nodes(read_nodes(trace_dir() / NODES_FILE), 1 / SUBSET)
    pods = read_pods(trace_dir() / PODS_FILE)
    options = ClusterOptions(client_qps=CLIENT_QPS, client_burst=CLIENT_BURST)
    out = {}
    for mode in MODES:
        settings = ReplaySettings(mode=mode, seed=42, scale=1 / SUBSET, timeout_s=150, settle_s=2)
        with (
            tempfile.TemporaryDirectory(prefix="dra-trace-test-") as work,
            Cluster(binaries, Path(work), options) as cluster,
        ):
            run = replay(cluster, nodes, pods, settings, Path(work))
            print(run.summary)  # the figures (pytest -s)
            cluster.check_running()
            out[mode] = (run, cluster.rest.get("/api/v1/nodes")["items"])
    yield out


def _attr(device: Obj, name: str) -> Any:
    return next(iter(device["attributes"][name].values()))


def _devices(slices: list[Obj]) -> dict[tuple[str, str], Obj]:
    return {(s["spec"]["pool"]["name"], d["name"]): d for s in slices for d in s["spec"]["devices"]}


def _claims_by_name(claims: list[Obj]) -> dict[str, Obj]:
    return {c["metadata"]["name"]: c for c in claims}


def _claim_of(pod: Obj) -> str:
    (ref,) = pod["spec"]["resourceClaims"]
    if "resourceClaimName" in ref:  # time-slicing: a claim shared with other pods
        return str(ref["resourceClaimName"])
    (status,) = pod["status"]["resourceClaimStatuses"]
    return str(status["resourceClaimName"])


def _bound_gpu_pods(pods: list[Obj]) -> list[Obj]:
    return [p for p in pods if p["spec"].get("nodeName") and p["spec"].get("resourceClaims")]


@pytest.mark.cluster
@pytest.mark.parametrize("mode", MODES)
def test_every_bound_pod_holds_devices_of_its_node_and_product(
    replays: dict[str, tuple[Replay, list[Obj]]], mode: str
) -> None:
    run, node_objs = replays[mode]
    final = run.snapshots[-1]
    devices, claims = _devices(final.slices), _claims_by_name(final.claims)
    product = {m.code: m.product_name for m in run.fleet.models.values()}
    model_of = {n["metadata"]["name"]: n["metadata"]["labels"].get(MODEL_LABEL) for n in node_objs}
    bound = _bound_gpu_pods(final.pods)
    assert len(bound) > 100
    for pod in bound:
        node = pod["spec"]["nodeName"]
        allocation = claims[_claim_of(pod)]["status"]["allocation"]
        terms = allocation["nodeSelector"]["nodeSelectorTerms"]
        assert [f["values"] for t in terms for f in t["matchFields"]] == [[node]]
        results = allocation["devices"]["results"]
        gpus = int(pod["metadata"]["annotations"][f"{ANNOTATION}/gpu-milli"]) // 1000 or 1
        assert len({r["device"] for r in results}) == len(results) == gpus
        for r in results:
            device = devices[(r["pool"], r["device"])]
            assert r["pool"] == node
            assert _attr(device, "type") == "gpu"
            assert _attr(device, "productName") == product[model_of[node]]


@pytest.mark.cluster
@pytest.mark.parametrize("mode", MODES)
def test_no_gpu_gives_out_more_than_it_has(
    replays: dict[str, tuple[Replay, list[Obj]]], mode: str
) -> None:
    final = replays[mode][0].snapshots[-1]
    devices = _devices(final.slices)
    used: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    exclusive: dict[tuple[str, str], int] = defaultdict(int)
    for claim in final.claims:
        for r in claim["status"].get("allocation", {}).get("devices", {}).get("results", []):
            key = (r["pool"], r["device"])
            if not devices[key].get("allowMultipleAllocations"):
                exclusive[key] += 1
            for name, value in (r.get("consumedCapacity") or {}).items():
                used[key][name] += float(parse(value))
    assert all(n == 1 for n in exclusive.values())
    assert (mode == "consumable") == bool(used)
    for key, consumed in used.items():
        for name, total in consumed.items():
            assert total <= float(parse(devices[key]["capacity"][name]["value"])), (key, name)


@pytest.mark.cluster
@pytest.mark.parametrize("mode", MODES)
def test_allocation_rate_is_what_the_allocated_claims_asked(
    replays: dict[str, tuple[Replay, list[Obj]]], mode: str
) -> None:
    run = replays[mode][0]
    for pct, snap in zip((100, 130), run.snapshots, strict=True):
        capacity = 1000 * sum(1 for s in snap.slices for _ in s["spec"]["devices"])
        claims = _claims_by_name(snap.claims)
        asked, held = 0, 0.0
        for pod in _bound_gpu_pods(snap.pods):
            claim = claims[_claim_of(pod)]
            assert claim["status"]["allocation"]
            asked += int(pod["metadata"]["annotations"][f"{ANNOTATION}/gpu-milli"])
            for r in claim["status"]["allocation"]["devices"]["results"]:
                share = (r.get("consumedCapacity") or {}).get("computeShare")
                memory = (r.get("consumedCapacity") or {}).get("memory")
                whole = share is None or (int(share) == 0 and memory is not None)
                held += 1000 if whole else 10 * int(share)
        assert run.summary[f"allocation_rate_{pct}"] == round(100 * asked / capacity, 2)
        if mode == "consumable":  # shares hold exactly what they ask
            assert run.summary[f"held_rate_{pct}"] == round(100 * held / capacity, 2)
        else:  # whole GPUs hold more than the shares they were rounded up from
            assert held >= asked
    unplaced = [p for p in run.snapshots[-1].pods if not p["spec"].get("nodeName")]
    for pod in unplaced:  # decided by the scheduler, not cut off by the wait
        reasons = {(c["type"], c["status"], c["reason"]) for c in pod["status"]["conditions"]}
        assert ("PodScheduled", "False", "Unschedulable") in reasons
    assert run.summary["undecided"] == 0
    assert sum(run.summary["unschedulable"].values()) == len(unplaced)


@pytest.mark.cluster
def test_consumable_shares_place_at_least_what_whole_gpus_do(
    replays: dict[str, tuple[Replay, list[Obj]]],
) -> None:
    whole, consumable = replays["whole"][0], replays["consumable"][0]
    assert whole.draw == consumable.draw  # the same pods, in the same order
    for pct in (100, 130):
        assert consumable.summary[f"allocation_rate_{pct}"] >= whole.summary[
            f"allocation_rate_{pct}"]  # fmt: skip
    assert consumable.summary["allocation_rate_100"] > 85


@pytest.mark.cluster
def test_time_sliced_shares_run_together_on_their_claims_gpu(
    replays: dict[str, tuple[Replay, list[Obj]]],
) -> None:
    run = replays["time-slicing"][0]
    final = run.snapshots[-1]
    claims = _claims_by_name(final.claims)
    on: dict[str, set[str]] = defaultdict(set)
    asked: dict[str, int] = defaultdict(int)
    pods: dict[str, int] = defaultdict(int)
    for pod in _bound_gpu_pods(final.pods):
        (ref,) = pod["spec"]["resourceClaims"]
        if "resourceClaimName" not in ref:
            continue
        name = ref["resourceClaimName"]
        on[name].add(pod["spec"]["nodeName"])
        asked[name] += int(pod["metadata"]["annotations"][f"{ANNOTATION}/gpu-milli"])
        pods[name] += 1
        config = claims[name]["spec"]["devices"]["config"][0]["opaque"]["parameters"]
        assert config["sharing"] == {"strategy": "TimeSlicing"}
    assert len(on) > 20
    assert all(len(nodes) == 1 for nodes in on.values())  # a claim's pods share its node
    assert max(asked.values()) <= 1000 < sum(asked.values())
    assert sum(1 for n in pods.values() if n > 1) > 10  # GPUs really shared
    whole = replays["whole"][0].summary
    assert run.summary["allocation_rate_100"] > whole["allocation_rate_100"]
