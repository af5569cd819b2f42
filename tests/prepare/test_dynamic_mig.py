"""Dynamic MIG through the claim pipeline on emulated GPUs: prepare creates the GPU and
compute instance at the allocated placement and writes its CDI spec, unprepare destroys
them, a failed prepare destroys what it made, a SIGKILL at any step leaves no instance
once the plugin is back, and instances somebody else made are never touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from dra_driver.emulation.hosttree import ci_cap_minor, gi_cap_minor
from dra_driver.gpu.driver import GpuDriver
from dra_driver.gpu.hardware.discovery import discover
from dra_driver.gpu.hardware.partitions import whole_gpu_profile
from dra_driver.gpu.sharing.tools import GpuTools
from dra_driver.plugin.claims import PrepareError
from tests.prepare.hosttree import gpu_config
from tests.prepare.migsetup import LOG, MIG_REF, MIG_UID, MigNode, mig_claim, open_mig_node

REPO = Path(__file__).parents[2]


@pytest.fixture
def node(tmp_path: Path) -> Iterator[MigNode]:
    mig_node = open_mig_node(tmp_path, "dgx-a100-mig-on")
    yield mig_node
    mig_node.close()


def _spec(node: MigNode) -> dict:  # type: ignore[type-arg]
    (path,) = node.cdi_dir.iterdir()
    return json.loads(path.read_text())


def _checkpoint(node: MigNode) -> dict:  # type: ignore[type-arg]
    return json.loads((node.state_dir / "checkpoint.json").read_text())


def test_prepare_creates_the_instance_and_unprepare_destroys_it(node: MigNode) -> None:
    preparer = node.preparer()
    (prepared,) = preparer.prepare(mig_claim("gpu-2-mig-3g40gb-9-4"))
    assert prepared.device_name == "gpu-2-mig-3g40gb-9-4"
    assert prepared.cdi_device_ids == (f"k8s.gpu.nvidia.com/claim={MIG_UID}-gpu-2-mig-3g40gb-9-4",)
    assert node.instances(2) == [(2, "3g.40gb", 4, [0])]
    (unit,) = _checkpoint(node)["claims"][MIG_UID]["units"]
    record = unit["record"]
    assert unit["strategy"] == "DynamicMIG" and record["request"]["start"] == 4
    assert (record["giId"], record["ciId"]) == (2, 0) and record["uuid"].startswith("MIG-")
    assert (record["giCapMinor"], record["ciCapMinor"]) == (
        gi_cap_minor(2, 2),
        ci_cap_minor(2, 2, 0),
    )
    # The container gets the parent GPU's node and exactly the new GI's and CI's caps.
    (device,) = _spec(node)["devices"]
    nodes = {n["path"]: n for n in device["containerEdits"]["deviceNodes"]}
    assert set(nodes) == {
        "/dev/nvidia2",
        f"/dev/nvidia-caps/nvidia-cap{gi_cap_minor(2, 2)}",
        f"/dev/nvidia-caps/nvidia-cap{ci_cap_minor(2, 2, 0)}",
    }
    assert nodes[f"/dev/nvidia-caps/nvidia-cap{ci_cap_minor(2, 2, 0)}"]["minor"] == ci_cap_minor(
        2, 2, 0
    )
    # The same call again is answered from the checkpoint: nothing created twice.
    assert preparer.prepare(mig_claim("gpu-2-mig-3g40gb-9-4")) == [prepared]
    assert node.instances(2) == [(2, "3g.40gb", 4, [0])]
    preparer.unprepare(MIG_REF)
    assert node.instances(2) == [] and list(node.cdi_dir.iterdir()) == []
    assert _checkpoint(node)["claims"] == {}
    preparer.unprepare(MIG_REF)  # idempotent


def test_whole_gpu_and_several_partitions(node: MigNode) -> None:
    preparer = node.preparer()
    preparer.prepare(mig_claim("gpu-5"))  # the whole GPU: the instance that spans it
    assert node.instances(5) == [(0, "7g.80gb", 0, [0])]
    two = mig_claim(
        "gpu-1-mig-1g10gb-me-20-6",
        "gpu-1-mig-2g20gb-14-0",
        uid="0a1b2c3d-2222-4000-8000-0000000d1a90",
    )
    preparer.prepare(two)
    assert node.instances(1) == [(3, "2g.20gb", 0, [0]), (13, "1g.10gb+me", 6, [0])]
    specs = {p.name: json.loads(p.read_text()) for p in node.cdi_dir.iterdir()}
    assert sorted(len(s["devices"]) for s in specs.values()) == [1, 2]
    preparer.unprepare(two.ref)
    preparer.unprepare(MIG_REF)
    assert node.instances(1) == [] and node.instances(5) == []


def test_the_whole_gpu_is_prepared_as_the_full_gpu_instance(node: MigNode) -> None:
    """In MIG mode CUDA runs only inside an instance: the whole GPU of a dynamic node is
    the GPU's own all-spanning profile at placement 0, created, handed over and destroyed
    like any other partition."""
    (gpu,) = [g for g in node.inventory().gpus if g.minor == 5]
    full = whole_gpu_profile(gpu)  # from NVML's profile list, not a name
    assert full is not None and full.name == "7g.80gb"
    preparer = node.preparer()
    preparer.prepare(mig_claim("gpu-5"))
    assert node.instances(5) == [(0, full.name, 0, [0])]  # exactly one GI with one CI
    assert [node.instances(i) for i in range(8) if i != 5] == [[]] * 7
    (unit,) = _checkpoint(node)["claims"][MIG_UID]["units"]
    record = unit["record"]
    assert unit["strategy"] == "DynamicMIG"
    assert (record["request"]["profile_id"], record["request"]["start"]) == (full.gi_profile_id, 0)
    assert (record["giId"], record["ciId"]) == (0, 0) and record["uuid"].startswith("MIG-")
    (device,) = _spec(node)["devices"]
    assert {n["path"] for n in device["containerEdits"]["deviceNodes"]} == {
        "/dev/nvidia5",
        f"/dev/nvidia-caps/nvidia-cap{gi_cap_minor(5, 0)}",
        f"/dev/nvidia-caps/nvidia-cap{ci_cap_minor(5, 0, 0)}",
    }
    # The hardware agrees with the counters: no other placement fits beside it.
    beside = mig_claim("gpu-5-mig-1g10gb-19-6", uid="0a1b2c3d-5555-4000-8000-0000000d1a90")
    with pytest.raises(PrepareError, match="placement is taken"):
        preparer.prepare(beside)
    preparer.unprepare(MIG_REF)
    assert node.instances(5) == [] and list(node.cdi_dir.iterdir()) == []
    assert _checkpoint(node)["claims"] == {}
    # And the other way round: a partition makes the full instance impossible.
    preparer.prepare(beside)
    with pytest.raises(PrepareError, match="placement is taken"):
        preparer.prepare(mig_claim("gpu-5"))
    preparer.unprepare(beside.ref)
    assert node.instances(5) == []


def test_a_failed_prepare_destroys_what_it_created(node: MigNode) -> None:
    preparer = node.preparer()
    node.node.library.inject_fault(
        4, "nvmlGpuInstanceCreateComputeInstance", pynvml.NVML_ERROR_UNKNOWN
    )
    with pytest.raises(
        PrepareError, match=r"create compute instance.*everything applied was rolled back"
    ):
        preparer.prepare(mig_claim("gpu-4-mig-4g40gb-5-0"))
    assert node.instances(4) == []  # the GPU instance made before the failure is gone
    assert _checkpoint(node)["claims"] == {}
    assert not node.cdi_dir.exists() or list(node.cdi_dir.iterdir()) == []
    node.node.library.clear_faults()
    preparer.prepare(mig_claim("gpu-4-mig-4g40gb-5-0"))  # the placement is free again
    assert node.instances(4) == [(1, "4g.40gb", 0, [0])]


def test_a_taken_placement_fails_clearly_and_touches_nothing(node: MigNode) -> None:
    preparer = node.preparer()
    gpu = node.node.profile.gpus[6]
    profile = gpu.model.mig_profile("2g.20gb")
    assert profile is not None
    node.node.mig.create_gpu_instance(gpu, profile, 4, 2)  # someone else, after publishing
    with pytest.raises(PrepareError, match="placement is taken"):
        preparer.prepare(mig_claim("gpu-6-mig-3g40gb-9-4"))
    assert node.instances(6) == [(5, "2g.20gb", 4, [])]


def test_sharing_configs_are_refused_on_dynamic_mig_devices(node: MigNode) -> None:
    mps = gpu_config({"strategy": "MPS"}, kind="MigDeviceConfig")
    claim = mig_claim("gpu-0-mig-1g10gb-19-0")
    claim = type(claim)(ref=claim.ref, devices=claim.devices, configs=(mps,))
    with pytest.raises(PrepareError, match="MPS is not supported on dynamic MIG devices") as err:
        node.preparer().prepare(claim)
    assert err.value.permanent and node.instances(0) == []


def test_instances_somebody_else_made_are_never_touched(tmp_path: Path) -> None:
    node = open_mig_node(tmp_path, "dgx-a100-mig")  # GPUs 0, 1, 4 partitioned by an admin
    try:
        before = [node.instances(i) for i in range(8)]
        preparer = node.preparer()
        # The admin's 3g.40gb is published as a static device: prepared as it is.
        preparer.prepare(mig_claim("gpu-0-mig-3g40gb-9-0"))
        # A partition beside an admin's instance on GPU 5 (MIG on, empty) and on GPU 0.
        other = mig_claim("gpu-5-mig-1g10gb-19-3", uid="0a1b2c3d-3333-4000-8000-0000000d1a90")
        preparer.prepare(other)
        assert node.instances(0) == before[0]
        assert node.instances(5) == [(10, "1g.10gb", 3, [0])]
        preparer.unprepare(MIG_REF)
        preparer.unprepare(other.ref)
        preparer.recover()
        assert [node.instances(i) for i in range(8)] == before
    finally:
        node.close()


def _run(root: Path, call: str, device: str, kill_at: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DRA_TEST_KILL_AT": str(kill_at), "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "tests.prepare.migsetup", str(root), "dgx-a100-mig-on", call,
         device],
        env=env, capture_output=True, text=True, timeout=120, cwd=REPO, check=False,
    )  # fmt: skip


PREPARE_STEPS = [
    "checkpoint-preparing", "mig-gi", "record", "mig-ci", "record",
    "record", "mig-nodes", "checkpoint-prepared", "cdi-spec",
]  # fmt: skip
UNPREPARE_STEPS = [
    "checkpoint-unpreparing", "mig-ci-destroyed", "mig-gi-destroyed", "cdi-spec-removed",
    "checkpoint-removed",
]  # fmt: skip


@pytest.mark.parametrize(
    ("device", "made"),
    [
        ("gpu-7-mig-2g20gb-14-2", (4, "2g.20gb", 2, [0])),
        ("gpu-7", (0, "7g.80gb", 0, [0])),  # the whole GPU: the full-GPU instance
    ],
    ids=["partition", "whole-gpu"],
)
@pytest.mark.parametrize(
    ("call", "steps"), [("prepare", PREPARE_STEPS), ("unprepare", UNPREPARE_STEPS)]
)
def test_sigkill_at_every_step_leaves_no_instance_after_restart(
    tmp_path: Path, call: str, steps: list[str], device: str, made: tuple[object, ...]
) -> None:
    listed = _run(tmp_path / "names", call, device, 0)
    assert listed.returncode == 0, listed.stderr
    assert [s.split(":")[0] for s in listed.stdout.split()] == steps
    for kill_at in range(1, len(steps) + 1):
        root = tmp_path / f"{call}-{kill_at}"
        done = _run(root, call, device, kill_at)
        assert done.returncode == -9, (kill_at, done.stderr)
        node = open_mig_node(root, "dgx-a100-mig-on")  # the plugin comes back
        try:
            preparer = node.preparer()
            preparer.recover()
            state = _checkpoint(node)["claims"]
            if call == "prepare" and kill_at == len(steps):
                # Killed after its spec was written (the last step): prepared, nothing to undo.
                assert state[MIG_UID]["state"] == "Prepared", kill_at
                assert node.instances(7) == [made]
                preparer.unprepare(MIG_REF)
            assert node.instances(7) == [], (call, kill_at, steps[kill_at - 1])
            assert _checkpoint(node)["claims"] == {}, (call, kill_at)
            assert not node.cdi_dir.exists() or list(node.cdi_dir.iterdir()) == []
            # The placement is free again for the next claim.
            preparer.prepare(mig_claim(device))
            assert node.instances(7) == [made]
        finally:
            node.close()


def test_driver_pool_stays_the_same_while_instances_come_and_go(tmp_path: Path) -> None:
    """GpuDriver in dynamic mode: prepares change no published device; an inventory older
    than an unprepare (it still lists the destroyed instance) does not hide a placement."""
    node = open_mig_node(tmp_path, "h100-l4-mixed")
    try:
        driver = GpuDriver(
            driver_name="gpu.nvidia.com",
            discover=lambda: discover(node.node.host, LOG),
            host=node.node.host,
            cdi_dir=node.cdi_dir,
            state_dir=node.state_dir,
            tools=GpuTools(nvidia_smi=Path("/nonexistent"), mps_control=Path("/nonexistent")),
            logger=LOG,
            pool_name="node-a",
            health_policy=None,
            mig_mode="dynamic",
        )
        try:
            pool = driver.pool()
            assert len(pool.devices) == 55 and len(pool.counter_sets) == 2
            first = mig_claim("gpu-1-mig-3g40gb-9-0")
            driver.prepare(first)
            assert driver.refresh() is False and driver.pool() == pool  # ours: no change
            assert node.instances(1) == [(1, "3g.40gb", 0, [0])]
            driver.unprepare(first.ref)  # the inventory still lists the instance
            again = mig_claim("gpu-1-mig-3g40gb-9-0", uid="0a1b2c3d-4444-4000-8000-0000000d1a90")
            driver.prepare(again)
            assert node.instances(1) == [(1, "3g.40gb", 0, [0])]
            driver.unprepare(again.ref)
            assert driver.refresh() is False and driver.pool() == pool
            whole = mig_claim("gpu-1", uid="0a1b2c3d-6666-4000-8000-0000000d1a90")
            driver.prepare(whole)  # the full-GPU instance is ours too: the pool stays
            assert node.instances(1) == [(0, "7g.80gb", 0, [0])]
            assert driver.refresh() is False and driver.pool() == pool
            driver.unprepare(whole.ref)
            assert node.instances(1) == [] and driver.refresh() is False
            # An instance somebody else makes is worked around at the next discovery.
            gpu = node.node.profile.gpus[0]
            profile = gpu.model.mig_profile("1g.10gb")
            assert profile is not None
            node.node.mig.create_gpu_instance(gpu, profile, 6, 1)
            assert driver.refresh() is True
            names = {d.name for d in driver.pool().devices}
            assert "gpu-0" not in names and "gpu-0-mig-1g10gb-19-6" not in names
            assert "gpu-0-mig-1g10gb-19-5" in names and "gpu-1" in names
        finally:
            driver.close()
    finally:
        node.close()


def test_unprepare_fails_while_a_process_runs_and_succeeds_after(node: MigNode) -> None:
    """NVML refuses to destroy a compute instance a process runs on; the unprepare fails
    (the kubelet retries it), the claim keeps its instance, and the next try finishes."""
    preparer = node.preparer()
    preparer.prepare(mig_claim("gpu-3-mig-2g20gb-14-2"))
    ((gi_id, *_),) = node.instances(3)
    process = {"pid": 4242, "usedMiB": 100, "gi": gi_id, "ci": 0}
    node.node.library.apply({"op": "processes", "gpu": 3, "processes": [process]})
    with pytest.raises(PrepareError, match="In use by another client"):
        preparer.unprepare(MIG_REF)
    assert node.instances(3) == [(gi_id, "2g.20gb", 2, [0])]
    assert _checkpoint(node)["claims"][MIG_UID]["state"] == "Unpreparing"
    node.node.library.apply({"op": "processes", "gpu": 3, "processes": []})
    preparer.unprepare(MIG_REF)
    assert node.instances(3) == [] and _checkpoint(node)["claims"] == {}


def test_a_compact_pool_prepares_like_a_full_one(tmp_path: Path) -> None:
    """``--dynamic-mig-attributes compact`` reaches the published pool through GpuDriver
    and changes nothing else: same devices and counters, same instance made at prepare."""
    node = open_mig_node(tmp_path, "h100-l4-mixed")
    try:
        drivers = [
            GpuDriver(
                driver_name="gpu.nvidia.com",
                discover=lambda: discover(node.node.host, LOG),
                host=node.node.host,
                cdi_dir=node.cdi_dir,
                state_dir=node.state_dir / form,
                tools=GpuTools(nvidia_smi=Path("/nonexistent"), mps_control=Path("/nonexistent")),
                logger=LOG,
                pool_name="node-a",
                health_policy=None,
                mig_mode="dynamic",
                placement_attributes=form,
            )
            for form in ("full", "compact")
        ]
        try:
            full, compact = (d.pool() for d in drivers)
            assert [d.name for d in compact.devices] == [d.name for d in full.devices]
            assert compact.counter_sets == full.counter_sets
            placement = next(d for d in compact.devices if d.name == "gpu-1-mig-3g40gb-9-0")
            assert "architecture" not in placement.attributes
            assert (
                "architecture"
                in next(d for d in full.devices if d.name == placement.name).attributes
            )
            claim = mig_claim(placement.name)
            drivers[1].prepare(claim)
            assert node.instances(1) == [(1, "3g.40gb", 0, [0])]
            drivers[1].unprepare(claim.ref)
            assert node.instances(1) == []
        finally:
            for d in drivers:
                d.close()
    finally:
        node.close()
