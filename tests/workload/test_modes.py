"""How the slots, time-slicing and MIG modes publish a trace's GPUs and write its claims,
checked on the driver's own slices with the project's allocator."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dra_driver.allocation.model import parse_device_class
from dra_driver.cel import SelectorEvaluator
from dra_driver.workload.claims import Claims
from dra_driver.workload.modes import choose_slots, publish_shapes, slot_waste
from dra_driver.workload.packing import Packer
from dra_driver.workload.trace import TraceNode, TracePod

GIB = 1 << 30
DEVICECLASSES = Path(__file__).resolve().parents[2] / "deploy" / "deviceclasses"


def _pod(name: str, num_gpu: int, milli: int, spec: tuple[str, ...] = ()) -> TracePod:
    return TracePod(name, 1000, 1024, num_gpu, milli, spec)


def _classes() -> dict[str, object]:
    found = (parse_device_class(yaml.safe_load(p.read_text())) for p in DEVICECLASSES.glob("*"))
    return {c.name: c for c in found}


NODES = [TraceNode("t4", 64000, 1 << 18, 2, "T4"), TraceNode("g2", 96000, 1 << 18, 8, "G2")]


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    pods = [_pod("a", 1, 470), _pod("b", 1, 230), _pod("w", 2, 1000)]
    work = tmp_path_factory.mktemp("modes")
    return {m: publish_shapes(NODES, m, pods, work) for m in ("slots", "time-slicing", "mig")}


def test_slot_count_wastes_least_within_the_claim_limit() -> None:
    # 4 slots of 250: a 470 share takes 2 (30 lost), a 230 share 1 (20 lost)
    assert slot_waste([470, 230], 4) == pytest.approx(50)
    shares = [_pod(f"s{m}", 1, m) for m in (500, 250, 750)]
    assert choose_slots(16 * GIB, shares) == 4  # quarters fit exactly; 2 wastes 250
    # an 8-GPU pod takes 8 x N slots: more than 4 slots breaks the 32-device limit
    assert choose_slots(16 * GIB, [*shares, _pod("w", 8, 1000)]) == 4
    assert choose_slots(16 * GIB, [_pod("x", 1, 330), _pod("w", 8, 1000)]) == 3
    assert choose_slots(16 * GIB, [_pod("x", 1, 330)]) == 3
    assert choose_slots(1 << 20, [_pod("x", 1, 330)]) == 0  # 1 MiB cannot be split


def test_slots_publish_as_the_mps_slots_flag_and_a_share_takes_its_slots_on_one_gpu(
    published: dict[str, object],
) -> None:
    pub = published["slots"]
    assert pub.settings()["flags"] == [  # type: ignore[attr-defined]
        "--mps-slots=Alibaba G2 (stand-in)=4,Tesla T4=4"
    ]
    claims = Claims("slots", pub.models)  # type: ignore[attr-defined]
    share = claims.spec(_pod("a", 1, 470))["devices"]
    assert [r["name"] for r in share["requests"]] == ["g0s0", "g0s1"]
    assert share["constraints"] == [
        {"requests": ["g0s0", "g0s1"], "matchAttribute": "gpu.nvidia.com/uuid"}
    ]
    whole = claims.spec(_pod("w", 2, 1000))["devices"]
    assert len(whole["requests"]) == 8 and len(whole["constraints"]) == 2
    packer = Packer(NODES[:1], pub, _classes(), SelectorEvaluator())  # type: ignore[arg-type]
    out = packer.run([_pod("a", 1, 470), _pod("a2", 1, 470), _pod("b", 1, 230)])
    assert out.placed == 3
    # 2 + 2 slots fill one T4, the third share's slot goes to the other GPU
    assert sorted(packer.free[0]) == [0, 750]
    assert packer.run([_pod("w", 2, 1000)]).unschedulable == {"2": 1}


def test_time_slicing_fills_shared_whole_gpu_claims_in_draw_order(
    published: dict[str, object],
) -> None:
    pub = published["time-slicing"]
    assert pub.settings() == {  # type: ignore[attr-defined]
        "flags": [], "claim_config": {"sharing": {"strategy": "TimeSlicing"}}
    }  # fmt: skip
    claims = Claims("time-slicing", pub.models)  # type: ignore[attr-defined]
    refs = [claims.claim_for(_pod(n, 1, m)) for n, m in
            [("a", 600), ("b", 300), ("c", 500), ("d", 100), ("e", 500)]]  # fmt: skip
    assert [r.name for r in refs] == ["ts-0", "ts-0", "ts-1", "ts-0", "ts-1"]
    assert all(r.shared for r in refs)
    config = claims.shared["ts-0"]["devices"]["config"][0]["opaque"]
    assert config["parameters"]["sharing"] == {"strategy": "TimeSlicing"}
    assert not claims.claim_for(_pod("w", 1, 1000)).shared
    packer = Packer(NODES[:1], pub, _classes(), SelectorEvaluator())  # type: ignore[arg-type]
    placed = [packer.place(_pod(n, 1, 300), ref) for n, ref in
              [("a", "ts-0"), ("b", "ts-0"), ("c", "ts-1"), ("d", "ts-2")]]  # fmt: skip
    assert placed == [True, True, True, False]  # 2 GPUs: 2 claims; pods of one share one
    assert packer.free[0] == [0, 0]


@pytest.mark.parametrize(
    ("milli", "profile"),
    [(100, "1g.10gb"), (230, "2g.20gb"), (320, "3g.40gb"), (470, "4g.40gb"), (810, "7g.80gb")],
)
def test_mig_share_takes_the_smallest_profile_covering_memory_and_sms(
    published: dict[str, object], milli: int, profile: str
) -> None:
    pub = published["mig"]
    claims = Claims("mig", pub.models)  # type: ignore[attr-defined]
    exactly = claims.spec(_pod("s", 1, milli, ("T4",)))["devices"]["requests"][0]["exactly"]
    assert exactly["deviceClassName"] == "mig.nvidia.com"
    cel = [s["cel"]["expression"] for s in exactly["selectors"]]
    assert cel[0] == f"device.attributes['gpu.nvidia.com'].profile == '{profile}'"
    assert "NVIDIA A100-SXM4-80GB" in cel[1]


def test_mig_nodes_are_redeclared_and_shares_pack_by_placement(
    published: dict[str, object],
) -> None:
    pub = published["mig"]
    names = {c: m.product_name for c, m in pub.models.items()}  # type: ignore[attr-defined]
    assert names == {"T4": "NVIDIA A100-SXM4-80GB", "G2": "NVIDIA H100 80GB HBM3"}
    assert pub.settings()["flags"] == ["--mig-mode=dynamic"]  # type: ignore[attr-defined]
    packer = Packer(NODES[:1], pub, _classes(), SelectorEvaluator())  # type: ignore[arg-type]
    # A100: a 4g and a 3g share one GPU; a second 4g takes the other; a third cannot fit
    pods = [_pod("a", 1, 470), _pod("b", 1, 320), _pod("c", 1, 470), _pod("d", 1, 470)]
    out = packer.run(pods)
    assert (out.placed, out.unschedulable) == (3, {"share": 1})
    assert packer.run([_pod("w", 1, 1000)]).unschedulable == {"1": 1}
