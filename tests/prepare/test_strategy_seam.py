"""The sharing-strategy seam, exercised by the kinds of strategy still to come.

``Shares`` is a minimal fractional-GPU strategy (the real ones are
:mod:`~dra_driver.gpu.sharing.strategies.mpsshares` and ``timeslicedshares``, left out
here): many claims, each with a ``share_id``, share one per-GPU resource that
must exist while any share does and be gone after the last. ``Instances`` stands
in for dynamic MIG (issue 12): it learns an ID from the hardware while applying
and must record it before the next step can fail. Both are plain implementations
of the protocol; the pipeline does the recording, reference counting, crash
recovery and rollback.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dra_driver.gpu.cdi.spec import ContainerEdits
from dra_driver.gpu.checkpoint import Unit
from dra_driver.gpu.config import DeviceConfig, SharingDecoder
from dra_driver.gpu.planning import Steps, Strategies, Target, gpu_name_of
from dra_driver.gpu.sharing.mpsdaemons import MpsDaemons
from dra_driver.gpu.sharing.strategies.builtin import builtin
from dra_driver.gpu.sharing.strategies.mpsshares import MpsSharesStrategy
from dra_driver.gpu.sharing.strategies.timeslicedshares import TimeSlicedSharesStrategy
from dra_driver.gpu.sharing.tools import GpuCommands
from dra_driver.plugin.claims import AllocatedDevice, Claim, ClaimRef, PrepareError
from tests.prepare.hosttree import Node

UIDS = [f"5a5a5a5a-0000-4000-8000-00000000000{i}" for i in range(4)]


class Killed(BaseException):
    """Stands in for SIGKILL: the pipeline catches Exception, so nothing is rolled back."""


class Shares:
    """Claims with a share_id get a marker file; each GPU with shares one shared file."""

    name = "TestShares"
    config: SharingDecoder | None = None

    def __init__(self, root: Path) -> None:
        self.root = root
        self.acquired: list[str] = []
        self.released: list[str] = []

    def wants(self, target: Target, config: DeviceConfig) -> bool:
        return target.share_id is not None

    def plan(self, claim_uid: str, targets: Sequence[Target], config: DeviceConfig) -> list[Unit]:
        return [
            Unit(
                self.name,
                (t.name,),
                record={"share": t.share_id, "capacity": dict(t.consumed_capacity)},
                shared=(f"{gpu_name_of(t.name)}/daemon",),
            )
            for t in targets
        ]

    def acquire(self, key: str, steps: Steps) -> Mapping[str, Any]:
        path = self.root / key.replace("/", "_")
        path.write_text("running\n")
        self.acquired.append(key)
        steps.done(f"daemon-started:{key}")
        return {"path": str(path)}

    def release(self, key: str, record: Mapping[str, Any], steps: Steps) -> None:
        (self.root / key.replace("/", "_")).unlink(missing_ok=True)
        self.released.append(key)

    def apply(self, unit: Unit, steps: Steps) -> None:
        (self.root / f"share-{unit.record['share']}").write_text(json.dumps(unit.record))
        steps.done(f"share:{unit.record['share']}")

    def undo(self, unit: Unit, steps: Steps) -> None:
        (self.root / f"share-{unit.record['share']}").unlink(missing_ok=True)

    def edits(self, unit: Unit, device: str, edits: ContainerEdits) -> ContainerEdits:
        return edits.merged(ContainerEdits(env=(f"SHARE={unit.record['share']}",)))

    def forget(self, claim_uid: str) -> None:
        pass

    def after_reboot(self) -> None:
        pass


class Instances:
    """Creates an 'instance' whose ID only the hardware knows, records it, then goes on."""

    name = "TestInstances"
    config: SharingDecoder | None = None

    def __init__(self, root: Path) -> None:
        self.root = root
        self.next_id = 7

    def wants(self, target: Target, config: DeviceConfig) -> bool:
        return target.share_id is None and config.sharing is None

    def plan(self, claim_uid: str, targets: Sequence[Target], config: DeviceConfig) -> list[Unit]:
        return [Unit(self.name, (t.name,), record={"gpu": t.name}) for t in targets]

    def apply(self, unit: Unit, steps: Steps) -> None:
        instance = self.next_id
        self.next_id += 1
        (self.root / f"instance-{instance}").write_text(unit.record["gpu"])
        steps.record({**unit.record, "instance": instance})  # before anything else can fail
        steps.done("instance-created")
        if unit.record["gpu"] == "gpu-6":
            raise RuntimeError("compute instance creation failed")

    def undo(self, unit: Unit, steps: Steps) -> None:
        if "instance" in unit.record:
            (self.root / f"instance-{unit.record['instance']}").unlink(missing_ok=True)

    def edits(self, unit: Unit, device: str, edits: ContainerEdits) -> ContainerEdits:
        return edits.merged(ContainerEdits(env=(f"INSTANCE={unit.record['instance']}",)))

    def forget(self, claim_uid: str) -> None:
        pass

    def after_reboot(self) -> None:
        pass


def _strategies(node: Node, *extra: Any) -> Strategies:
    commands = GpuCommands(tools=node.tools, logger=logging.getLogger("t"))
    daemons = MpsDaemons(root=node.state_dir / "mps", commands=commands, tools=node.tools)
    builtins = builtin(commands, daemons, lambda: node.inventory)
    real_shares = (MpsSharesStrategy.name, TimeSlicedSharesStrategy.name)
    return Strategies([*extra, *(s for s in builtins if s.name not in real_shares)])


def share(i: int, device: str = "gpu-2") -> Claim:
    return Claim(
        ref=ClaimRef(f"ns{i}", f"share{i}", UIDS[i]),
        devices=(
            AllocatedDevice(
                request="gpu",
                pool="node-a",
                device=device,
                share_id=f"5e5e5e5e-0000-4000-8000-00000000000{i}",
                consumed_capacity={"memory": f"{i + 1}Gi"},
            ),
        ),
    )


def files(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


@pytest.fixture
def hw(tmp_path: Path) -> Path:
    """Where the test strategies keep their 'hardware' state."""
    path = tmp_path / "hw"
    path.mkdir()
    return path


def test_shares_of_one_gpu_share_one_resource_until_the_last_goes(node: Node, hw: Path) -> None:
    shares = Shares(hw)
    p = node.preparer(strategies=_strategies(node, shares))
    for i in range(3):  # three claims from three namespaces on one GPU
        [device] = p.prepare(share(i))
        assert device.share_id == f"5e5e5e5e-0000-4000-8000-00000000000{i}"
    p.prepare(share(3, device="gpu-4"))
    assert shares.acquired == ["gpu-2/daemon", "gpu-4/daemon"]  # once per GPU
    spec = json.loads(next(node.cdi_dir.glob(f"*{UIDS[1]}.json")).read_text())
    assert (
        "SHARE=5e5e5e5e-0000-4000-8000-000000000001" in spec["devices"][0]["containerEdits"]["env"]
    )
    for i in (0, 1):
        p.unprepare(share(i).ref)
    assert shares.released == []  # share 2 still uses gpu-2's daemon
    assert "gpu-2_daemon" in files(hw)
    p.unprepare(share(2).ref)
    assert shares.released == ["gpu-2/daemon"]
    p.unprepare(share(3).ref)
    assert files(hw) == []
    cp = json.loads((node.state_dir / "checkpoint.json").read_text())
    assert cp["claims"] == {} and cp["shared"] == {}


@pytest.mark.parametrize("kill_at", ["shared-acquiring", "daemon-started", "shared-ready", "share"])
def test_a_kill_during_a_first_share_leaves_nothing_after_restart(
    node: Node, hw: Path, kill_at: str
) -> None:
    def on_step(name: str) -> None:
        if name.split(":")[0] == kill_at:
            raise Killed

    shares = Shares(hw)
    with pytest.raises(Killed):
        node.preparer(strategies=_strategies(node, shares), on_step=on_step).prepare(share(0))
    restarted = node.preparer(strategies=_strategies(node, Shares(hw)))
    restarted.recover()
    assert files(hw) == []
    cp = json.loads((node.state_dir / "checkpoint.json").read_text())
    assert cp["claims"] == {} and cp["shared"] == {}


def test_an_id_recorded_while_applying_is_undone_after_a_kill_and_on_rollback(
    node: Node, hw: Path
) -> None:
    def on_step(name: str) -> None:
        if name == "instance-created":
            raise Killed

    claim = Claim(
        ref=ClaimRef("ns", "c", UIDS[0]), devices=(AllocatedDevice("g", "node-a", "gpu-5"),)
    )
    with pytest.raises(Killed):
        node.preparer(strategies=_strategies(node, Instances(hw)), on_step=on_step).prepare(claim)
    assert files(hw) == ["instance-7"]
    cp = json.loads((node.state_dir / "checkpoint.json").read_text())
    assert cp["claims"][UIDS[0]]["units"][0]["record"] == {"gpu": "gpu-5", "instance": 7}
    instances = Instances(hw)
    p = node.preparer(strategies=_strategies(node, instances))
    p.recover()
    assert files(hw) == []
    p.prepare(claim)  # and prepared for real, the ID reaching the CDI edits
    spec = json.loads(next(node.cdi_dir.glob("*.json")).read_text())
    assert spec["devices"][0]["containerEdits"]["env"] == ["INSTANCE=7"]
    failing = Claim(
        ref=ClaimRef("ns", "f", UIDS[1]), devices=(AllocatedDevice("g", "node-a", "gpu-6"),)
    )
    with pytest.raises(PrepareError, match="RuntimeError: compute instance creation failed"):
        p.prepare(failing)
    assert files(hw) == ["instance-7"]  # the failed claim's instance 8 was destroyed


class OtherShares(Shares):
    """Another strategy naming the same per-GPU resource, for requests named ``other``."""

    name = "OtherShares"

    def wants(self, target: Target, config: DeviceConfig) -> bool:
        return target.share_id is not None and target.request == "other"


class FirstShares(Shares):
    def wants(self, target: Target, config: DeviceConfig) -> bool:
        return target.share_id is not None and target.request != "other"


def test_a_shared_resource_belongs_to_one_strategy_until_its_last_user_goes(
    node: Node, hw: Path
) -> None:
    first, other = FirstShares(hw), OtherShares(hw)
    p = node.preparer(strategies=_strategies(node, first, other))
    p.prepare(share(0))
    theirs = share(1)
    theirs = Claim(theirs.ref, (replace(theirs.devices[0], request="other"),))
    with pytest.raises(PrepareError) as err:
        p.prepare(theirs)
    assert str(err.value).endswith(
        "gpu-2/daemon is in use by strategy TestShares (claims: ns0/share0); a OtherShares "
        "unit cannot use it until they are unprepared; retried"
    )
    assert not err.value.permanent and other.acquired == []
    cp = json.loads((node.state_dir / "checkpoint.json").read_text())
    assert list(cp["claims"]) == [UIDS[0]]
    p.unprepare(share(0).ref)
    p.prepare(theirs)
    assert other.acquired == ["gpu-2/daemon"]
    cp = json.loads((node.state_dir / "checkpoint.json").read_text())
    assert cp["shared"]["gpu-2/daemon"]["strategy"] == "OtherShares"
    p.unprepare(theirs.ref)
    assert files(hw) == []
