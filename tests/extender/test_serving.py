"""The scoring extender's HTTP answers, on a view fed the objects the API serves (the
driver's own consumable slices, claims as the scheduler allocates them) and asked with
the JSON bodies kube-scheduler sends."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.extender.prioritizing import prioritize
from dra_driver.extender.serving import ExtenderServer
from dra_driver.extender.view import ClusterView
from dra_driver.workload.claims import Claims
from dra_driver.workload.modes import publish_shapes
from dra_driver.workload.trace import TraceNode, TracePod

NODES = [TraceNode("big-a", 96000, 786432, 8, "G2"), TraceNode("big-b", 96000, 786432, 8, "G2"),
         TraceNode("small", 64000, 262144, 2, "T4")]  # fmt: skip
SHARE = TracePod("share", 4000, 8192, 1, 470, ())
WHOLE = TracePod("whole", 8000, 16384, 1, 1000, ())
EIGHT = TracePod("eight", 64000, 262144, 8, 1000, ())
Obj = dict[str, Any]


def _node(n: TraceNode) -> Obj:
    alloc = {"cpu": f"{n.cpu_milli}m", "memory": f"{n.memory_mib}Mi"}
    return {"metadata": {"name": n.name}, "status": {"allocatable": alloc}}


def _claim(name: str, spec: Obj, results: list[Obj] | None = None) -> Obj:
    claim: Obj = {"metadata": {"name": name, "namespace": "t"}, "spec": spec}
    if results is not None:
        claim["status"] = {"allocation": {"devices": {"results": results}}}
    return claim


def _pod(name: str, pod: TracePod, claim: str | None, node: str = "") -> Obj:
    req = {"cpu": f"{pod.cpu_milli}m", "memory": f"{pod.memory_mib}Mi"}
    obj: Obj = {"metadata": {"name": name, "namespace": "t"},
                "spec": {"containers": [{"name": "c", "resources": {"requests": req}}]},
                "status": {"phase": "Pending"}}  # fmt: skip
    if claim:
        obj["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": claim}]
    if node:
        obj["spec"]["nodeName"] = node
    return obj


@pytest.fixture(scope="module")
def view(tmp_path_factory: pytest.TempPathFactory) -> ClusterView:
    """big-a has one GPU half used by a running share; big-b and small are untouched."""
    published = publish_shapes(NODES, "consumable", [SHARE, WHOLE, EIGHT],
                               tmp_path_factory.mktemp("ext"))  # fmt: skip
    claims = Claims("consumable", published.models)
    v = ClusterView()
    v.replace("nodes", [_node(n) for n in NODES])
    slices = []
    for n in NODES:
        for i, spec in enumerate(published.shapes[(n.model, n.gpus)].slices):
            slices.append({"metadata": {"name": f"{n.name}-{i}"},
                           "spec": {**spec, "driver": "gpu.nvidia.com", "nodeName": n.name,
                                    "pool": {"name": n.name, "generation": 1,
                                             "resourceSliceCount": 1}}})  # fmt: skip
    v.replace("resourceslices", slices)
    used = {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "big-a", "device": "gpu-0",
            "shareID": "00000000-0000-0000-0000-000000000001",
            "consumedCapacity": {"memory": "7219Mi", "computeShare": "47"}}  # fmt: skip
    v.replace("resourceclaims", [
        _claim("running", claims.spec(SHARE), [used]),
        _claim("share", claims.spec(SHARE)),
        _claim("whole", claims.spec(WHOLE)),
        _claim("eight", claims.spec(EIGHT)),
    ])  # fmt: skip
    v.replace("pods", [_pod("running", SHARE, "running", node="big-a")])
    for pod in [SHARE] * 20 + [EIGHT] * 3:  # the workload it learns from the pods it scores
        prioritize(v, {"Pod": _pod("p", pod, pod.name), "NodeNames": ["big-a"]})
    return v


@pytest.fixture
def url(view: ClusterView) -> Iterator[str]:
    server = ExtenderServer(view=view, logger=logging.getLogger("test"), host="127.0.0.1")
    server.start()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        server.stop()


def _post(url: str, body: bytes) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _args(pod: Obj, names: list[str]) -> bytes:
    return json.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}).encode()


def test_a_share_goes_to_the_half_used_gpu(url: str) -> None:
    code, answer = _post(f"{url}/prioritize", _args(_pod("p", SHARE, "share"),
                                                    ["big-b", "big-a", "small"]))  # fmt: skip
    assert code == 200
    assert [h["Host"] for h in answer] == ["big-b", "big-a", "small"]
    scores = {h["Host"]: h["Score"] for h in answer}
    assert scores["big-a"] == 10  # the share fits beside the running one: nothing stranded
    assert scores["big-b"] < 10  # it would break an untouched 8-GPU node


def test_an_eight_gpu_pod_scores_the_untouched_node(url: str) -> None:
    code, answer = _post(f"{url}/prioritize", _args(_pod("p", EIGHT, "eight"), ["big-a", "big-b"]))
    assert code == 200
    assert {h["Host"]: h["Score"] for h in answer}["big-b"] == 10


def test_a_node_list_instead_of_names(url: str) -> None:
    """Without nodeCacheCapable the scheduler sends whole Node objects."""
    nodes = {"items": [_node(NODES[0]), _node(NODES[1])]}
    body = json.dumps({"Pod": _pod("p", SHARE, "share"), "Nodes": nodes}).encode()
    code, answer = _post(f"{url}/prioritize", body)
    assert code == 200 and [h["Host"] for h in answer] == ["big-a", "big-b"]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"{not json", "not JSON"),
        (b"[]", "ExtenderArgs object"),
        (json.dumps({"NodeNames": ["big-a"]}).encode(), "ExtenderArgs.Pod"),
        (json.dumps({"Pod": {}, "NodeNames": "big-a"}).encode(), "ExtenderArgs.NodeNames"),
        (json.dumps({"Pod": {}}).encode(), "neither NodeNames nor Nodes"),
    ],
)
def test_bad_bodies_are_refused_naming_the_field(url: str, body: bytes, says: str) -> None:
    code, answer = _post(f"{url}/prioritize", body)
    assert code == 400 and says in answer["error"]


def test_healthz_waits_for_every_list(url: str, view: ClusterView) -> None:
    with urllib.request.urlopen(f"{url}/healthz", timeout=10) as resp:
        assert resp.status == 200
    fresh = ClusterView()
    fresh.replace("nodes", [])
    server = ExtenderServer(view=fresh, logger=logging.getLogger("test"), host="127.0.0.1")
    server.start()
    try:
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=10)
        assert err.value.code == 503
        assert "pods" in json.loads(err.value.read())["problems"][0]
    finally:
        server.stop()


def test_unknown_paths_and_verbs(url: str) -> None:
    code, answer = _post(f"{url}/filter", b"{}")
    assert code == 404 and "prioritize" in answer["error"]


@pytest.mark.parametrize("address", ["8888", "host:port", "0.0.0.0:70000"])
def test_a_bad_bind_address_is_refused_naming_the_flag(
    capsys: pytest.CaptureFixture[str], address: str
) -> None:
    from dra_driver.cli import main

    assert main(["scoring-extender", "--bind-address", address]) == 2
    assert "--bind-address (DRA_BIND_ADDRESS)" in capsys.readouterr().err
