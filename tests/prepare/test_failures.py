"""Failures on the way in and out: every one rolls back or is retried, none is swallowed.

Regression tests for defects found by hostile probing (issue 11): D2 (an exception of an
unexpected type after MPS started left the daemon, its dirs and tmpfs, and each retry
started another daemon), D3 (a failed reset at unprepare was logged and unprepare
reported success: the next tenant inherited EXCLUSIVE_PROCESS or a Long time-slice),
D6 (overflowing quantities and a malformed checkpoint entry gave unreadable errors).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

import pytest

from dra_driver.gpu.cdi.spec import ContainerEdits
from dra_driver.gpu.checkpoint import Unit
from dra_driver.gpu.config import DeviceConfig, SharingDecoder
from dra_driver.gpu.planning import Steps, Strategies, Target
from dra_driver.gpu.sharing.mpsdaemons import MpsDaemons
from dra_driver.gpu.sharing.strategies.builtin import builtin
from dra_driver.gpu.sharing.tools import GpuCommands
from dra_driver.plugin.claims import ClaimRef, PrepareError
from tests.prepare.hosttree import Node, claim, gpu_config

UID = "0a1b2c3d-0000-4000-8000-000000000001"
UID2 = "0a1b2c3d-0000-4000-8000-000000000002"
MPS = gpu_config({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 40}})
LONG = gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}})


def fail_tool(node: Node, *patterns: str) -> None:
    """Make the emulated GPU tools fail for argv containing any pattern ('' clears)."""
    node.record.with_name(node.record.name + ".fail").write_text(
        "".join(f"{p}\n" for p in patterns)
    )


def entries(node: Node) -> dict[str, dict[str, object]]:
    path = node.state_dir / "checkpoint.json"
    return json.loads(path.read_text())["claims"] if path.exists() else {}


class Exploding:
    """A strategy that fails with a plain Python exception after MPS was applied."""

    name = "Exploding"
    config: SharingDecoder | None = None

    def __init__(self) -> None:
        self.applied = 0

    def wants(self, target: Target, config: DeviceConfig) -> bool:
        return config.sharing is not None and config.sharing.strategy == "MPS"

    def plan(self, claim_uid: str, targets: Sequence[Target], config: DeviceConfig) -> list[Unit]:
        return [Unit(self.name, tuple(t.name for t in targets))]

    def apply(self, unit: Unit, steps: Steps) -> None:
        self.applied += 1
        raise ZeroDivisionError("division by zero")

    def undo(self, unit: Unit, steps: Steps) -> None:
        pass

    def edits(self, unit: Unit, device: str, edits: ContainerEdits) -> ContainerEdits:
        return edits

    def forget(self, claim_uid: str) -> None:
        pass

    def after_reboot(self) -> None:
        pass


def test_d2_any_exception_after_mps_started_rolls_everything_back(node: Node) -> None:
    commands = GpuCommands(tools=node.tools, logger=logging.getLogger("t"))
    daemons = MpsDaemons(root=node.state_dir / "mps", commands=commands, tools=node.tools)
    exploding = Exploding()
    p = node.preparer(
        strategies=Strategies([*builtin(commands, daemons, lambda: node.inventory), exploding])
    )
    for attempt in range(3):  # every retry fails the same way and leaves nothing
        with pytest.raises(PrepareError) as err:
            p.prepare(claim(configs=[MPS]))
        assert "ZeroDivisionError: division by zero" in str(err.value)
        assert "everything applied was rolled back" in str(err.value)
        assert exploding.applied == attempt + 1
        assert node.live_daemons() == []
        assert node.mounts() == []
        assert list((node.state_dir / "mps").iterdir()) == []
        assert entries(node) == {}
        assert not any(node.cdi_dir.glob("*.json"))
    started = [c for c in node.calls("nvidia-cuda-mps-control") if c["argv"] == ["-d"]]
    assert len(started) == 3  # one per attempt, each stopped again
    assert node.calls("nvidia-smi")[-1]["argv"][-2:] == ["-c", "DEFAULT"]


def test_d2_an_overflowing_limit_fails_while_planning_and_names_the_field(node: Node) -> None:
    cfg = gpu_config({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "1e5000"}})
    with pytest.raises(PrepareError) as err:
        node.preparer().prepare(claim(configs=[cfg]))
    assert "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: '1e5000' is out of range" in str(
        err.value
    )
    assert err.value.permanent
    assert node.calls() == [] and entries(node) == {}


@pytest.mark.parametrize(
    ("mps", "device", "kind", "message"),
    [
        ({"defaultPinnedDeviceMemoryLimit": "81921Mi"}, "gpu-3", "GpuConfig", "gpu-3 (GPU-"
         "00000003-1111-2222-3333-444444444444) is 81921Mi, more than its 81920Mi of memory"),
        ({"defaultPerDevicePinnedMemoryLimit": {"0": "11Gi"}}, "gpu-7-mig-1g10gb-19-2",
         "MigDeviceConfig", "gpu-7-mig-1g10gb-19-2 (MIG-79000000-aaaa-bbbb-cccc-dddddddddddd) "
         "is 11264Mi, more than its 10240Mi of memory"),
    ],
    ids=["default-limit-on-a-gpu", "per-device-limit-on-a-mig-device"],
)  # fmt: skip
def test_an_mps_limit_above_the_device_s_memory_is_refused_naming_the_device(
    node: Node, mps: dict[str, object], device: str, kind: str, message: str
) -> None:
    """A pinned-memory limit above the device's memory would mean no limit at all."""
    cfg = gpu_config({"strategy": "MPS", "mpsConfig": mps}, kind=kind)
    with pytest.raises(PrepareError) as err:
        node.preparer().prepare(claim(devices=[("gpu", device)], configs=[cfg]))
    assert message in str(err.value)
    assert err.value.permanent
    assert node.calls() == [] and entries(node) == {}
    fits = gpu_config({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "80Gi"}})
    assert node.preparer().prepare(claim(devices=[("gpu", "gpu-3")], configs=[fits]))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1e999999999", "'1e999999999' is out of range; the maximum is 8Ei"),
        ("9Ei", "'9Ei' is out of range; the maximum is 8Ei"),
        ("1" * 50, "is not a quantity"),
        ("1e-999999999", "below the minimum of 1Mi"),
    ],
)
def test_d6_quantities_out_of_range_get_a_clear_error(
    node: Node, value: str, expected: str
) -> None:
    cfg = gpu_config({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": value}})
    with pytest.raises(PrepareError) as err:
        node.preparer().prepare(claim(configs=[cfg]))
    msg = str(err.value)
    assert msg.startswith("invalid opaque config: config[0] (FromClaim): sharing.mpsConfig.")
    assert expected in msg
    assert "internal error" not in msg and "decimal" not in msg


@pytest.mark.parametrize(
    ("config", "device", "fault"),
    [(MPS, "gpu-1", "-c DEFAULT"), (LONG, "gpu-1", "--set-timeslice 0")],
    ids=["mps-compute-mode-reset", "time-slice-reset"],
)
def test_d3_a_failed_reset_fails_unprepare_and_keeps_the_gpu_reserved(
    node: Node, config: object, device: str, fault: str
) -> None:
    p = node.preparer()
    p.prepare(claim(devices=[("gpu", device)], configs=[config]))  # type: ignore[list-item]
    fail_tool(node, fault)
    with pytest.raises(PrepareError, match=rf"unprepare claim ns/c1: undo incomplete.*{fault}"):
        p.unprepare(ClaimRef("ns", "c1", UID))
    assert entries(node)[UID]["state"] == "Unpreparing"
    assert node.live_daemons() == []  # what could be undone was undone
    # The next tenant does not get the GPU in a half-reset state:
    with pytest.raises(PrepareError, match=r"'gpu-1' is still held by claim ns/c1.*unprepare"):
        p.prepare(claim(uid=UID2, name="c2", devices=[("gpu", device)]))
    # Nor is the half-torn claim ever reported prepared again as it was:
    fail_tool(node)
    p.unprepare(ClaimRef("ns", "c1", UID))  # the kubelet's retry
    assert entries(node) == {}
    uuid = node.inventory.gpus[1].uuid
    smi = [c["argv"] for c in node.calls("nvidia-smi") if uuid in c["argv"]]
    assert smi[-1] in (["-i", uuid, "-c", "DEFAULT"], ["compute-policy", "-i", uuid,
                                                       "--set-timeslice", "0"])  # fmt: skip
    p.prepare(claim(uid=UID2, name="c2", devices=[("gpu", device)]))


def test_d6_a_malformed_entry_is_reported_as_a_corrupt_checkpoint(node: Node) -> None:
    p = node.preparer()
    p.prepare(claim())
    path = node.state_dir / "checkpoint.json"
    data = json.loads(path.read_text())
    data["claims"][UID]["devices"] = None
    path.write_text(json.dumps(data))
    for call in (
        lambda: p.prepare(claim(uid=UID2, name="c2", devices=[("gpu", "gpu-1")])),
        lambda: p.unprepare(ClaimRef("ns", "c2", UID2)),
    ):
        with pytest.raises(PrepareError) as err:
            call()
        msg = str(err.value)
        assert f"is corrupt: claims.{UID}.devices: expected list, got None" in msg
        assert "move the file aside" in msg
        assert "NoneType" not in msg


def test_d3_an_exclusive_claim_whose_spec_cannot_be_removed_stays_reserved(node: Node) -> None:
    """A claim without units has only its spec to remove, in the same checkpoint
    transaction that drops its entry: when the removal fails the entry stays
    (``Unpreparing``, with the error), the GPU is not handed out, the retry finishes."""
    p = node.preparer()
    p.prepare(claim())
    spec = node.cdi_dir / f"k8s.gpu.nvidia.com-claim_{UID}.json"
    spec.unlink()
    (spec / "blocker").mkdir(parents=True)  # unlink() of a non-empty directory fails
    with pytest.raises(PrepareError, match=rf"unprepare claim ns/c1: undo incomplete.*{spec.name}"):
        p.unprepare(ClaimRef("ns", "c1", UID))
    entry = entries(node)[UID]
    assert entry["state"] == "Unpreparing" and spec.name in entry["error"]
    with pytest.raises(PrepareError, match=r"'gpu-0' is still held by claim ns/c1"):
        p.prepare(claim(uid=UID2, name="c2"))
    (spec / "blocker").rmdir()
    spec.rmdir()
    p.unprepare(ClaimRef("ns", "c1", UID))  # the kubelet's retry
    assert entries(node) == {}
    p.prepare(claim(uid=UID2, name="c2"))
