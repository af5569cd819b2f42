"""MPS slots prepared on a driver before r615: one control daemon per GPU whose defaults
are one slot, shared by the slot claims of every namespace; the GPU EXCLUSIVE_PROCESS
while any slot is prepared and back to its earlier mode after the last; a client that
drops or raises its CUDA_MPS_* variables still gets one slot; everything else refused
with the reason."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from pathlib import Path

import pytest

from dra_driver.gpu.planning import Target, resolve
from dra_driver.gpu.sharing.mpsdaemons import MpsDaemons
from dra_driver.gpu.sharing.strategies.builtin import builtin
from dra_driver.gpu.sharing.strategies.mpsslots import slot_daemon_id
from dra_driver.gpu.sharing.tools import GpuCommands
from dra_driver.plugin.claims import AllocatedDevice, Claim, ClaimRef, PrepareError
from tests.prepare.crash_shares import daemons_by_dir, gpu_modes
from tests.prepare.hosttree import (
    ENFORCING_VERSION,
    SLOT_GPU,
    SLOTS,
    Node,
    gpu_config,
    share_claim,
    slot_claim,
)
from tests.prepare.test_shares import checkpoint, daemon_commands, spec_env, spec_mounts

UIDS = [f"5107a000-0000-4000-8000-00000000000{i}" for i in range(6)]
SLOT_DEFAULTS = [
    "set_default_active_thread_percentage 25",
    f"set_default_device_pinned_mem_limit {SLOT_GPU} 20480M",
]


def client(pipe: Path, line: str, cid: str) -> dict[str, str]:
    """Act as a CUDA process through the emulated daemon's client protocol: send ``line``,
    return the daemon's answer for client ``cid`` once it reflects the line."""
    answer = pipe / "clients" / cid
    before = answer.read_text() if answer.exists() else None
    fd = os.open(pipe / "control", os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        text = answer.read_text() if answer.exists() else None
        if text is not None and (text != before or line.startswith("alloc")):
            time.sleep(0.05)  # an alloc may leave the answer as it was only in "last"
            return dict(x.split("=", 1) for x in answer.read_text().splitlines())
        time.sleep(0.01)
    raise AssertionError(f"no answer to {line!r}")


@pytest.mark.parametrize("earlier", ["DEFAULT", "PROHIBITED"])
def test_slots_of_three_namespaces_share_one_daemon_with_one_slot_defaults(
    node: Node, earlier: str
) -> None:
    Path(f"{node.record}.mode.{SLOT_GPU}").write_text(earlier)  # the admin's mode
    p = node.preparer(mps_slots=SLOTS)
    for i in range(3):
        [device] = p.prepare(slot_claim(UIDS[i], namespace=f"team-{i}"))
        assert device.share_id is not None
    daemons = daemons_by_dir(node)
    assert list(daemons) == [str(node.state_dir / "mps" / slot_daemon_id(SLOT_GPU))]
    assert daemon_commands(node) == {SLOT_GPU: SLOT_DEFAULTS}  # limits set once, for all
    assert gpu_modes(node) == {SLOT_GPU: "EXCLUSIVE_PROCESS"}
    pipes = {spec_mounts(node, UIDS[i])["/tmp/nvidia-mps"] for i in range(3)}
    shms = {spec_mounts(node, UIDS[i])["/dev/shm"] for i in range(3)}
    assert pipes == {f"{next(iter(daemons))}/pipe"} and shms == {f"{next(iter(daemons))}/shm"}
    for i in range(3):
        env = spec_env(node, UIDS[i])
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    cp = checkpoint(node)
    shared = cp["shared"]["gpu-2/shares"]
    assert shared["strategy"] == "MpsSlots" and shared["record"]["previousMode"] == earlier
    assert {e["units"][0]["strategy"] for e in cp["claims"].values()} == {"MpsSlots"}

    p.unprepare(ClaimRef("team-1", "slot", UIDS[1]))
    p.unprepare(ClaimRef("team-0", "slot", UIDS[0]))
    assert daemons_by_dir(node) == daemons  # the same process, untouched
    assert gpu_modes(node) == {SLOT_GPU: "EXCLUSIVE_PROCESS"}
    p.unprepare(ClaimRef("team-2", "slot", UIDS[2]))
    assert node.live_daemons() == [] and node.mounts() == []
    assert gpu_modes(node) == {SLOT_GPU: earlier}  # the mode it had before the first slot
    assert list((node.state_dir / "mps").iterdir()) == []
    assert checkpoint(node) == {"claims": {}, "shared": {}, **_version(node)}
    assert list(node.cdi_dir.iterdir()) == []


def _version(node: Node) -> dict[str, object]:
    cp = json.loads((node.state_dir / "checkpoint.json").read_text())
    return {k: v for k, v in cp.items() if k not in ("claims", "shared")}


def test_a_client_gets_one_slot_whatever_its_variables_say(node: Node) -> None:
    p = node.preparer(mps_slots=SLOTS)
    p.prepare(slot_claim(UIDS[0], namespace="a"))
    p.prepare(slot_claim(UIDS[1], namespace="b"))
    pipe = Path(spec_mounts(node, UIDS[0])["/tmp/nvidia-mps"])
    env = spec_env(node, UIDS[0])
    dropped = client(pipe, "client dropped - -", "dropped")  # unset its CUDA_MPS_* vars
    assert dropped["memory_limit_mib"] == "20480" and dropped["active_thread_percentage"] == "25"
    greedy = client(pipe, "client greedy 0=40G 100", "greedy")  # asks for half the GPU
    assert greedy["memory_limit_mib"] == "20480" and greedy["active_thread_percentage"] == "25"
    given = env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]
    as_given = client(pipe, f"client given {given[0]} {given[1]}", "given")
    assert as_given["memory_limit_mib"] == "20480"
    tighter = client(pipe, "client small 0=4G 10", "small")  # a client may tighten
    assert tighter["memory_limit_mib"] == "4096" and tighter["active_thread_percentage"] == "10"
    assert client(pipe, "alloc dropped 20000", "dropped")["last"] == "allocated 20000"
    over = client(pipe, "alloc dropped 481", "dropped")
    assert over["last"].startswith("out of memory") and over["allocated_mib"] == "20000"
    assert client(pipe, "alloc greedy 20480", "greedy")["allocated_mib"] == "20480"  # unharmed
    assert client(pipe, "alloc greedy 1", "greedy")["last"].startswith("out of memory")


def test_time_slicing_or_mps_config_on_a_slot_is_refused(node: Node) -> None:
    p = node.preparer(mps_slots=SLOTS)
    ts = gpu_config({"strategy": "TimeSlicing"})
    with pytest.raises(PrepareError) as err:
        p.prepare(slot_claim(UIDS[0], configs=[ts]))
    assert "sharing.strategy TimeSlicing: gpu-2 is split into enforced MPS slots" in str(err.value)
    assert err.value.permanent
    mps = gpu_config({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 90}})
    with pytest.raises(PrepareError, match=r"sharing\.mpsConfig: a slot's limits are one slot"):
        p.prepare(slot_claim(UIDS[1], configs=[mps]))
    p.prepare(slot_claim(UIDS[2], configs=[gpu_config({"strategy": "MPS"})]))  # spelled out
    assert checkpoint(node)["claims"][UIDS[2]]["units"][0]["strategy"] == "MpsSlots"
    assert UIDS[0] not in checkpoint(node)["claims"]


def _two(devices: list[tuple[str, str]], configs: list[object] | None = None) -> Claim:
    return Claim(
        ref=ClaimRef("ns", "two", UIDS[0]),
        devices=tuple(
            AllocatedDevice(
                request=req,
                pool="node-a",
                device=dev,
                share_id=f"5e5e5e5e-0000-4000-8000-00000000000{n}",
                consumed_capacity={"memory": "20Gi", "computeShare": "25"},
            )
            for n, (req, dev) in enumerate(devices)
        ),
        configs=tuple(configs or ()),  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("devices", "configs", "why"),
    [
        ([("a", "gpu-2"), ("b", "gpu-2")], None, "slots cannot be summed"),
        ([("a", "gpu-2"), ("b", "gpu-3")], None, "a CUDA process talks to one MPS pipe"),
        # Two configs: two plan groups, still one claim.
        (
            [("a", "gpu-2"), ("b", "gpu-2")],
            [gpu_config({"strategy": "MPS"}, requests=("b",))],
            "slots cannot be summed",
        ),
    ],
    ids=["one-gpu", "two-gpus", "two-configs"],
)
def test_a_claim_holds_one_slot(node: Node, devices, configs, why: str) -> None:
    slots = dataclasses.replace(SLOTS, counts=(*SLOTS.counts, (node.inventory.gpus[3].uuid, 4)))
    with pytest.raises(PrepareError) as err:
        node.preparer(mps_slots=slots).prepare(_two(devices, configs))
    assert "the claim holds 2 MPS slots" in str(err.value) and why in str(err.value)
    assert err.value.permanent and node.calls() == []


def test_an_allocation_of_other_than_one_slot_is_refused(node: Node) -> None:
    claim = share_claim(UIDS[0], memory="40Gi", compute="0")  # before --mps-slots was set
    with pytest.raises(PrepareError, match=r"not one slot \(20480Mi of 4\)") as err:
        node.preparer(mps_slots=SLOTS).prepare(claim)
    assert err.value.permanent and node.calls() == []


def test_from_r615_a_slot_is_an_enforced_share_with_its_own_daemon(node: Node) -> None:
    node.inventory = dataclasses.replace(node.inventory, driver_version=ENFORCING_VERSION)
    p = node.preparer(mps_slots=SLOTS)
    for i in range(2):
        p.prepare(slot_claim(UIDS[i], namespace=f"team-{i}"))
    assert len(daemons_by_dir(node)) == 2  # per-claim daemons, limits = the one slot
    assert checkpoint(node)["shared"]["gpu-2/shares"]["strategy"] == "MpsShares"
    assert sorted(daemon_commands(node)[SLOT_GPU]) == sorted(SLOT_DEFAULTS * 2)
    ts = gpu_config({"strategy": "TimeSlicing"})
    with pytest.raises(PrepareError, match="split into enforced MPS slots"):
        p.prepare(slot_claim(UIDS[2], configs=[ts]))


def test_a_slot_daemon_that_died_is_started_again_by_the_next_slot(node: Node) -> None:
    p = node.preparer(mps_slots=SLOTS)
    p.prepare(slot_claim(UIDS[0]))
    (first,) = daemons_by_dir(node).values()
    os.kill(first, 9)
    while first in node.live_daemons():
        time.sleep(0.01)
    p.prepare(slot_claim(UIDS[1], namespace="b"))
    (again,) = daemons_by_dir(node).values()
    assert again != first
    assert daemon_commands(node) == {SLOT_GPU: SLOT_DEFAULTS * 2}
    for i in range(2):
        p.unprepare(ClaimRef("ns" if i == 0 else "b", "slot", UIDS[i]))
    assert node.live_daemons() == [] and gpu_modes(node) == {SLOT_GPU: "DEFAULT"}


def test_a_whole_gpu_claim_beside_slots_stays_exclusive(node: Node) -> None:
    """A slot GPU's slots never hand the whole GPU to a claim; the other GPUs are as
    they were (no capacity: exclusive, no MPS)."""
    p = node.preparer(mps_slots=SLOTS)
    whole = share_claim(UIDS[0], device="gpu-3", memory="80Gi")
    p.prepare(whole)
    assert node.calls() == []
    assert "CUDA_MPS_PIPE_DIRECTORY" not in spec_env(node, UIDS[0])


CONFIGS = {
    "none": None,
    "mps": gpu_config({"strategy": "MPS"}),
    "mps-config": gpu_config(
        {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 9}}
    ),
    "time-slicing": gpu_config({"strategy": "TimeSlicing"}),
}


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("driver", ["580.95.05", ENFORCING_VERSION])
@pytest.mark.parametrize("device", ["gpu-2", "gpu-3"], ids=["slot-gpu", "consumable-gpu"])
def test_exactly_one_strategy_wants_each_share(
    node: Node, config: str, driver: str, device: str
) -> None:
    """Two strategies wanting one target would both act on it (planning groups by
    strategy); none would leave a fractional share unprepared."""
    node.inventory = dataclasses.replace(node.inventory, driver_version=driver)
    commands = GpuCommands(tools=node.tools, logger=logging.getLogger("t"))
    daemons = MpsDaemons(root=node.state_dir / "mps", commands=commands, tools=node.tools)
    strategies = builtin(commands, daemons, lambda: node.inventory, slots=SLOTS)
    cfg = CONFIGS[config]
    # gpu-3: an ordinary consumable GPU's share of the same size as a slot.
    claim = slot_claim(UIDS[0], device=device, configs=[cfg] if cfg else None)
    (dev,) = claim.devices
    gpu = next(g for g in node.inventory.gpus if f"gpu-{g.minor}" == device)
    target = Target(dev.device, dev.request, gpu, share_id=dev.share_id,
                    consumed_capacity=dev.consumed_capacity)  # fmt: skip
    resolved = resolve(claim, {device: "gpu"}, strategies.decoders())[(dev.request, device)]
    sharing = resolved.sharing.strategy if resolved.sharing is not None else None
    wanting = [s.name for s in strategies.asked(sharing, True) if s.wants(target, resolved)]
    slot_gpu, old = device == "gpu-2", driver != ENFORCING_VERSION
    if slot_gpu and (old or config == "time-slicing"):
        expected = "MpsSlots"
    elif config == "time-slicing":
        expected = "TimeSlicedShares"
    else:
        expected = "MpsShares"
    assert wanting == [expected]
