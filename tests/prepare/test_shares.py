"""Fractional GPUs prepared: one MPS control daemon per claim with its allocation's limits,
the GPU exclusive to MPS while it has shares, shares coming and going without touching
each other, advisory time-sliced shares only when asked for, nothing after the last."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from dra_driver.plugin.claims import AllocatedDevice, Claim, ClaimRef, PrepareError
from tests.prepare.crash_shares import daemons_by_dir, gpu_modes
from tests.prepare.hosttree import ENFORCING_VERSION, Node, gpu_config, share_claim

UIDS = [f"3c3c3c3c-0000-4000-8000-00000000000{i}" for i in range(6)]
TIME_SLICED = gpu_config({"strategy": "TimeSlicing"})


@pytest.fixture
def r615(node: Node) -> Node:
    node.inventory = dataclasses.replace(node.inventory, driver_version=ENFORCING_VERSION)
    return node


def uuid(node: Node, index: int) -> str:
    return node.inventory.gpus[index].uuid


def spec_env(node: Node, uid: str) -> dict[str, str]:
    spec = json.loads((node.cdi_dir / f"k8s.gpu.nvidia.com-claim_{uid}.json").read_text())
    (device,) = spec["devices"]
    return dict(e.split("=", 1) for e in device["containerEdits"].get("env", []))


def spec_mounts(node: Node, uid: str) -> dict[str, str]:
    spec = json.loads((node.cdi_dir / f"k8s.gpu.nvidia.com-claim_{uid}.json").read_text())
    (device,) = spec["devices"]
    return {m["containerPath"]: m["hostPath"] for m in device["containerEdits"]["mounts"]}


def daemon_commands(node: Node) -> dict[str, list[str]]:
    """Commands each emulated daemon received, by the GPUs it serves."""
    started = {c["pid"]: c["env"] for c in node.calls("mps-daemon") if c.get("event") == "started"}
    out: dict[str, list[str]] = {}
    for c in node.calls("mps-daemon"):
        if "command" in c:
            out.setdefault(started[c["pid"]]["CUDA_VISIBLE_DEVICES"], []).append(c["command"])
    return out


def checkpoint(node: Node) -> dict[str, Any]:
    """The checkpoint as JSON; none written yet reads as empty."""
    path = node.state_dir / "checkpoint.json"
    if not path.exists():
        return {"claims": {}, "shared": {}}
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def test_shares_from_three_namespaces_get_their_own_daemon_and_limits(r615: Node) -> None:
    node, gpu = r615, uuid(r615, 2)
    p = node.preparer()
    sizes = [("20Gi", "0"), ("8Gi", "50"), ("40Gi", "0")]
    for i, (memory, compute) in enumerate(sizes):
        claim = share_claim(UIDS[i], namespace=f"team-{i}", memory=memory, compute=compute)
        [device] = p.prepare(claim)
        assert device.share_id == claim.devices[0].share_id
    assert gpu_modes(node) == {gpu: "EXCLUSIVE_PROCESS"}
    assert [c["argv"] for c in node.calls("nvidia-smi")] == [["-i", gpu, "-c", "EXCLUSIVE_PROCESS"]]
    daemons = daemons_by_dir(node)
    assert len(daemons) == 3
    envs = [spec_env(node, UIDS[i]) for i in range(3)]
    expected = [("25", "20480"), ("50", "8192"), ("50", "40960")]  # 20/80 -> 25 %; 40/80 -> 50 %
    for env, (pct, mib) in zip(envs, expected, strict=True):
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == pct
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={mib}M"
    pipes = [Path(spec_mounts(node, UIDS[i])["/tmp/nvidia-mps"]) for i in range(3)]
    assert len(set(pipes)) == 3 and set(pipes) == {Path(d) / "pipe" for d in daemons}
    commands = sorted(
        c["command"] for c in node.calls("mps-daemon") if "command" in c
    )  # each daemon: its own limits, set before any client can connect
    assert commands == sorted(
        f"set_default_{what}"
        for pct, mib in expected
        for what in (f"active_thread_percentage {pct}", f"device_pinned_mem_limit {gpu} {mib}M")
    )
    # The checkpoint knows each share by its share ID.
    cp = checkpoint(node)
    for i in range(3):
        entry = cp["claims"][UIDS[i]]
        share_id = entry["devices"][0]["shareID"]
        assert entry["units"][0]["record"]["shares"] == {gpu: [share_id]}
        assert entry["units"][0]["shared"] == ["gpu-2/shares"]
    assert cp["shared"]["gpu-2/shares"]["state"] == "Ready"

    # One goes; the others keep their daemons (same processes) and the GPU its mode.
    p.unprepare(ClaimRef("team-1", "share", UIDS[1]))
    left = daemons_by_dir(node)
    assert {d: daemons[d] for d in left} == left and len(left) == 2
    assert not pipes[1].exists()
    assert gpu_modes(node) == {gpu: "EXCLUSIVE_PROCESS"}
    for i in (0, 2):
        p.unprepare(ClaimRef(f"team-{i}", "share", UIDS[i]))
    assert gpu_modes(node) == {gpu: "DEFAULT"}
    assert node.live_daemons() == [] and node.mounts() == []
    assert list((node.state_dir / "mps").iterdir()) == []
    assert checkpoint(node)["claims"] == {} and checkpoint(node)["shared"] == {}
    assert list(node.cdi_dir.iterdir()) == []


def test_whole_gpu_share_is_a_plain_gpu_on_any_driver(node: Node) -> None:
    p = node.preparer()
    whole = share_claim(UIDS[0], memory="80Gi")
    p.prepare(whole)
    assert node.calls() == []  # no MPS daemon, no compute mode
    assert "CUDA_MPS_PIPE_DIRECTORY" not in spec_env(node, UIDS[0])
    p.unprepare(whole.ref)


def test_fractional_share_on_an_older_driver_fails_and_names_the_advisory_way(node: Node) -> None:
    with pytest.raises(PrepareError) as err:
        node.preparer().prepare(share_claim(UIDS[0], memory="10Gi"))
    message = str(err.value)
    assert "driver 580.95.05 cannot enforce a share's memory and SM limits" in message
    assert "sharing.strategy: TimeSlicing" in message
    assert err.value.permanent
    assert node.calls() == [] and checkpoint(node)["claims"] == {}


def test_time_sliced_shares_are_advisory_and_explicit(node: Node) -> None:
    p = node.preparer()  # driver 580: works, nothing enforced
    gpu = uuid(node, 2)
    for i in range(2):
        p.prepare(share_claim(UIDS[i], memory="10Gi", configs=[TIME_SLICED]))
    assert [c["argv"] for c in node.calls()] == [["-i", gpu, "-c", "DEFAULT"]]
    assert "CUDA_MPS_PIPE_DIRECTORY" not in spec_env(node, UIDS[0])
    assert checkpoint(node)["shared"]["gpu-2/shares"]["strategy"] == "TimeSlicedShares"
    long = gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}})
    with pytest.raises(PrepareError, match="takes the GPU's Default") as err:
        p.prepare(share_claim(UIDS[2], memory="1Gi", configs=[long]))
    assert err.value.permanent
    for i in range(2):
        p.unprepare(ClaimRef("ns", "share", UIDS[i]))
    assert checkpoint(node)["claims"] == {} and checkpoint(node)["shared"] == {}


def test_enforced_and_advisory_shares_never_mix_on_one_gpu(r615: Node) -> None:
    node = r615
    p = node.preparer()
    p.prepare(share_claim(UIDS[0], namespace="a", memory="10Gi"))
    advisory = share_claim(UIDS[1], namespace="b", memory="10Gi", configs=[TIME_SLICED])
    with pytest.raises(PrepareError) as err:
        p.prepare(advisory)
    assert "gpu-2/shares is in use by strategy MpsShares (claims: a/share)" in str(err.value)
    assert not err.value.permanent  # the kubelet retries; it fits once the MPS shares are gone
    assert gpu_modes(node) == {uuid(node, 2): "EXCLUSIVE_PROCESS"}
    assert UIDS[1] not in checkpoint(node)["claims"]
    p.unprepare(ClaimRef("a", "share", UIDS[0]))
    p.prepare(advisory)
    assert gpu_modes(node) == {uuid(node, 2): "DEFAULT"}
    p.unprepare(advisory.ref)


def test_mps_config_on_a_share_is_refused(r615: Node) -> None:
    cfg = gpu_config({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 90}})
    with pytest.raises(PrepareError, match="a share's limits are what the scheduler allocated"):
        r615.preparer().prepare(share_claim(UIDS[0], memory="10Gi", configs=[cfg]))
    bare = share_claim(UIDS[1], memory="10Gi", configs=[gpu_config({"strategy": "MPS"})])
    r615.preparer().prepare(bare)  # strategy MPS alone: the default for shares, spelled out
    assert spec_env(r615, UIDS[1])["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "13"


def test_shares_of_two_gpus_in_one_claim_use_one_daemon(r615: Node) -> None:
    node = r615
    devices = tuple(
        AllocatedDevice(
            request=req,
            pool="node-a",
            device=dev,
            share_id=f"5e5e5e5e-0000-4000-8000-0000000000{n}0",
            consumed_capacity={"memory": mem, "computeShare": pct},
        )
        for n, (req, dev, mem, pct) in enumerate(
            [("a", "gpu-2", "10Gi", "60"), ("b", "gpu-3", "20Gi", "0"), ("c", "gpu-2", "6Gi", "0")]
        )
    )
    claim = Claim(ref=ClaimRef("ns", "multi", UIDS[0]), devices=devices)
    result = node.preparer().prepare(claim)
    assert [d.share_id for d in result] == [d.share_id for d in devices]
    assert len(daemons_by_dir(node)) == 1
    gpus = {uuid(node, 2): "16384", uuid(node, 3): "20480"}  # gpu-2: its two shares summed
    assert daemon_commands(node) == {
        f"{uuid(node, 2)},{uuid(node, 3)}": [
            "set_default_active_thread_percentage 25",  # the smaller: gpu-3's 20/80
            *(f"set_default_device_pinned_mem_limit {u} {m}M" for u, m in gpus.items()),
        ]
    }
    spec = json.loads(next(node.cdi_dir.iterdir()).read_text())
    for device in spec["devices"]:
        env = device["containerEdits"]["env"]
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in env
        assert not any(e.startswith("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") for e in env)
    assert gpu_modes(node) == {u: "EXCLUSIVE_PROCESS" for u in gpus}
    node.preparer().unprepare(claim.ref)
    assert gpu_modes(node) == {u: "DEFAULT" for u in gpus}
    assert node.live_daemons() == []


def test_an_unreadable_allocation_fails_before_anything_is_done(r615: Node) -> None:
    claim = share_claim(UIDS[0], memory="1.5Mi")
    with pytest.raises(PrepareError, match="not a whole number of MiB") as err:
        r615.preparer().prepare(claim)
    assert err.value.permanent and r615.calls() == []
