"""Checkpoint: forward compatibility, corruption, reboots, the cross-process lock."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dra_driver.gpu import statefile
from dra_driver.gpu.checkpoint import CheckpointError, SharedEntry, Unit
from dra_driver.gpu.sharing.mpsdaemons import MpsDaemons
from dra_driver.gpu.sharing.tools import GpuCommands
from dra_driver.gpu.statefile import CheckpointStore
from dra_driver.plugin.claims import ClaimRef, PrepareError
from tests.prepare.hosttree import Node, claim

UID = "0a1b2c3d-0000-4000-8000-000000000001"


def read(node: Node) -> dict:
    return json.loads((node.state_dir / "checkpoint.json").read_text())


def write(node: Node, data: object) -> None:
    (node.state_dir / "checkpoint.json").write_text(json.dumps(data))


def test_unknown_fields_from_a_newer_plugin_survive_a_rewrite(node: Node) -> None:
    p = node.preparer()
    p.prepare(claim())
    data = read(node)
    data["futureTopLevel"] = {"x": 1}
    data["claims"][UID]["futureClaimField"] = [1, 2]
    data["claims"][UID]["devices"][0]["futureDeviceField"] = True
    write(node, data)

    assert p.prepare(claim())[0].device_name == "gpu-0"  # still readable
    other = "0a1b2c3d-0000-4000-8000-000000000002"
    p.prepare(claim(uid=other, devices=[("gpu", "gpu-1")]))  # forces a rewrite
    after = read(node)
    assert after["futureTopLevel"] == {"x": 1}
    assert after["claims"][UID]["futureClaimField"] == [1, 2]
    assert after["claims"][UID]["devices"][0]["futureDeviceField"] is True
    assert after["version"] == 2
    assert "checksum" not in after


def test_file_is_private_and_written_atomically(node: Node) -> None:
    p = node.preparer()
    p.prepare(claim())
    p.prepare(claim("0a1b2c3d-0000-4000-8000-000000000002", [("gpu", "gpu-1")], name="c2"))
    path = node.state_dir / "checkpoint.json"
    assert path.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in node.state_dir.iterdir()) == [
        "checkpoint.json",
        "checkpoint.json.spare",  # the previous content (it held state: private too)
        "checkpoint.lock",
        "locks",  # one lock file per GPU
    ]
    assert (node.state_dir / "checkpoint.json.spare").stat().st_mode & 0o777 == 0o600
    assert sorted(f.name for f in (node.state_dir / "locks").iterdir()) == [
        "gpu-0.lock",
        "gpu-1.lock",
    ]


def store_of(node: Node) -> CheckpointStore:
    return CheckpointStore(
        state_dir=node.state_dir, proc_dir=node.host.proc(), logger=logging.getLogger("test")
    )


def test_writes_reuse_two_inodes_and_keep_the_previous_content_in_the_spare(node: Node) -> None:
    """No inode is created per write (ext4 made that the costliest part of a save)."""
    store = store_of(node)
    seen: set[int] = set()
    for n in range(5):
        with store.transaction() as loaded:
            loaded.checkpoint.shared[f"s{n}"] = SharedEntry("MPS", "Ready", {"gpu": f"GPU-{n}"})
            store.save(loaded.checkpoint)
        seen |= {f.stat().st_ino for f in node.state_dir.glob("checkpoint.json*")}
        assert sorted(read(node)["shared"]) == [f"s{i}" for i in range(n + 1)]
        if n:  # the spare holds what the file held before this write
            before = json.loads((node.state_dir / "checkpoint.json.spare").read_text())
            assert sorted(before["shared"]) == [f"s{i}" for i in range(n)]
    assert len(seen) == 2


def test_a_torn_or_longer_spare_never_reaches_the_file(node: Node) -> None:
    """A process killed mid-write leaves the spare torn: the file stays whole, and the next
    write cuts the spare to its own length before it takes the file's place."""
    store = store_of(node)
    with store.transaction() as loaded:
        loaded.checkpoint.shared["s"] = SharedEntry("MPS", "Ready")
        store.save(loaded.checkpoint)
    (node.state_dir / "checkpoint.json.spare").write_text('{"version": 2, "claims": {' + "x" * 9000)
    with store.transaction() as loaded:
        assert list(loaded.checkpoint.shared) == ["s"]
        del loaded.checkpoint.shared["s"]
        store.save(loaded.checkpoint)
    assert read(node)["shared"] == {}
    with store_of(node).transaction() as loaded:  # a fresh process decodes the file
        assert loaded.checkpoint.shared == {}


def test_a_spare_that_cannot_be_written_fails_the_save_and_keeps_the_file(node: Node) -> None:
    store = store_of(node)
    with store.transaction() as loaded:
        store.save(loaded.checkpoint)
    before = (node.state_dir / "checkpoint.json").read_bytes()
    spare = node.state_dir / "checkpoint.json.spare"
    spare.unlink(missing_ok=True)
    spare.symlink_to(node.state_dir / "elsewhere")  # never followed
    with store.transaction() as loaded:
        loaded.checkpoint.shared["s"] = SharedEntry("MPS", "Ready")
        with pytest.raises(CheckpointError, match=r"open .*checkpoint\.json\.spare"):
            store.save(loaded.checkpoint)
    assert (node.state_dir / "checkpoint.json").read_bytes() == before
    assert not (node.state_dir / "elsewhere").exists()


@pytest.mark.parametrize(
    "content", ["{not json", "[]", '{"version": "one"}', '{"version": 1, "claims": []}']
)
def test_corrupt_file_refuses_with_recovery_and_is_not_overwritten(
    node: Node, content: str
) -> None:
    node.state_dir.mkdir(parents=True)
    path = node.state_dir / "checkpoint.json"
    path.write_text(content)
    p = node.preparer()
    for call in (lambda: p.prepare(claim()), lambda: p.unprepare(ClaimRef("ns", "c1", UID))):
        with pytest.raises(PrepareError, match=r"is corrupt.*move the file aside"):
            call()
    assert path.read_text() == content
    assert not node.cdi_dir.exists()


def test_recovery_after_moving_a_corrupt_file_aside_cleans_leftovers(node: Node) -> None:
    p = node.preparer()
    p.prepare(claim())
    path = node.state_dir / "checkpoint.json"
    path.write_text("garbage")
    path.rename(path.with_suffix(".corrupt"))  # the documented recovery
    p.unprepare(ClaimRef("ns", "c1", UID))  # kubelet's retry: the UID-derived spec goes too
    assert list(node.cdi_dir.iterdir()) == []


def test_newer_incompatible_version_is_refused(node: Node) -> None:
    node.state_dir.mkdir(parents=True)
    write(node, {"version": 3, "claims": {}})
    with pytest.raises(PrepareError, match="version 3, written by a newer incompatible plugin"):
        node.preparer().prepare(claim())


def test_reboot_discards_old_state_and_files_without_signalling(node: Node) -> None:
    p = node.preparer()
    p.prepare(claim())
    assert (node.cdi_dir / f"k8s.gpu.nvidia.com-claim_{UID}.json").exists()
    node.host.proc("sys", "kernel", "random", "boot_id").write_text("boot-2\n")
    assert p.prepared_claims() == []
    other = "0a1b2c3d-0000-4000-8000-000000000002"
    p.prepare(claim(uid=other, devices=[("gpu", "gpu-0")]))  # gpu-0 is free again
    data = read(node)
    assert data["nodeBootID"] == "boot-2"
    assert list(data["claims"]) == [other]
    assert [f.name for f in node.cdi_dir.iterdir()] == [f"k8s.gpu.nvidia.com-claim_{other}.json"]


def test_lock_excludes_another_process(node: Node) -> None:
    node.state_dir.mkdir(parents=True)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl,sys,time;f=open(sys.argv[1],'a');fcntl.flock(f,fcntl.LOCK_EX);"
            "print('locked',flush=True);time.sleep(30)",
            str(node.state_dir / "checkpoint.lock"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        store = CheckpointStore(
            state_dir=node.state_dir,
            proc_dir=node.host.proc(),
            logger=logging.getLogger("test"),
            lock_timeout_s=0.3,
        )
        start = time.monotonic()
        with pytest.raises(CheckpointError, match="held by another process"), store.transaction():
            pass
        assert time.monotonic() - start >= 0.3
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    with store.transaction() as loaded:  # released when the holder died
        assert loaded.checkpoint.claims == {}


V1_FILE = Path(__file__).parent / "data" / "checkpoint-v1.json"
"""Written by plugin 0.1 (checkpoint version 1) for two claims: a1 with time-slicing on
gpu-0 and one MPS daemon over gpu-1 and gpu-2, a2 with gpu-3 and a MIG device."""
V1_A1 = "0a1b2c3d-0000-4000-8000-0000000000a1"
V1_A2 = "0a1b2c3d-0000-4000-8000-0000000000a2"


def v1_node(node: Node, state: str = "PrepareCompleted") -> str:
    """The node as plugin 0.1 left it: its checkpoint, CDI specs and the running daemon."""
    data = json.loads(V1_FILE.read_text())
    data["claims"][V1_A1]["state"] = state
    node.state_dir.mkdir(parents=True)
    write(node, data)
    node.cdi_dir.mkdir(parents=True)
    for uid in (V1_A1, V1_A2):
        (node.cdi_dir / f"k8s.gpu.nvidia.com-claim_{uid}.json").write_text("{}\n")
    [group] = data["claims"][V1_A1]["applied"]["mps"]
    tools = node.tools
    daemons = MpsDaemons(
        root=node.state_dir / "mps",
        commands=GpuCommands(tools=tools, logger=logging.getLogger("t")),
        tools=tools,
    )
    daemons.make_dirs(group["id"])
    daemons.mount_shm(group["id"])
    daemons.start(group["id"], group["uuids"])
    assert len(node.live_daemons()) == 1
    return str(group["id"])


def test_a_real_v1_checkpoint_is_migrated_and_its_claims_undone_exactly(node: Node) -> None:
    daemon_id = v1_node(node)
    p = node.preparer()
    gpus = node.inventory.gpus
    # The kubelet re-sends prepare after the upgrade: same CDI IDs, no tool run.
    again = p.prepare(
        claim(uid=V1_A2, name="c2", devices=[("gpu", "gpu-3"), ("mig", "gpu-7-mig-1g10gb-19-6")])
    )
    assert [d.cdi_device_ids for d in again] == [
        (f"k8s.gpu.nvidia.com/claim={V1_A2}-gpu-3",),
        (f"k8s.gpu.nvidia.com/claim={V1_A2}-gpu-7-mig-1g10gb-19-6",),
    ]
    assert node.calls("nvidia-smi") == []
    p.unprepare(ClaimRef("ns", "c1", V1_A1))
    assert node.live_daemons() == []
    assert not (node.state_dir / "mps" / daemon_id).exists()
    assert node.mounts() == []
    smi = [c["argv"] for c in node.calls("nvidia-smi")]
    assert ["compute-policy", "-i", gpus[0].uuid, "--set-timeslice", "0"] in smi
    assert ["-i", gpus[1].uuid, "-c", "DEFAULT"] in smi
    assert ["-i", gpus[2].uuid, "-c", "DEFAULT"] in smi
    assert not (node.cdi_dir / f"k8s.gpu.nvidia.com-claim_{V1_A1}.json").exists()
    after = read(node)
    assert after["version"] == 2
    assert list(after["claims"]) == [V1_A2]
    assert after["claims"][V1_A2]["state"] == "Prepared"
    assert after["claims"][V1_A2]["devices"][0]["request"] == "gpu"
    p.unprepare(ClaimRef("ns", "c2", V1_A2))
    assert read(node)["claims"] == {} and list(node.cdi_dir.iterdir()) == []


def test_an_interrupted_v1_prepare_is_rolled_back_at_start(node: Node) -> None:
    v1_node(node, state="PrepareStarted")
    node.preparer().recover()
    assert node.live_daemons() == []
    assert list(read(node)["claims"]) == [V1_A2]
    assert not (node.cdi_dir / f"k8s.gpu.nvidia.com-claim_{V1_A1}.json").exists()


def test_a_torn_file_from_before_this_boot_is_discarded_not_reported_corrupt(
    node: Node,
) -> None:
    p = node.preparer()
    p.prepare(claim())
    path = node.state_dir / "checkpoint.json"
    path.write_text('{"version": 2, "nodeBoo')  # what a power loss can leave without fsync
    node.host.proc("uptime").write_text("5.00 1.00\n")  # booted 5 s ago
    old = time.time() - 60
    os.utime(path, (old, old))
    assert p.prepared_claims() == []  # discarded as state of the previous boot
    assert not (node.cdi_dir / f"k8s.gpu.nvidia.com-claim_{UID}.json").exists()
    assert read(node)["claims"] == {}
    path.write_text("{not json")  # torn in this boot: that is corruption
    with pytest.raises(PrepareError, match="is corrupt"):
        p.prepare(claim())


def test_an_unchanged_file_is_not_decoded_again_and_changes_never_leak_into_the_next_read(
    node: Node,
) -> None:
    """The store reuses the last decoded checkpoint when the bytes read are identical:
    entries are frozen, and a caller's replacements that were not saved must not show
    up in the next read, and a rewrite by another process of the same size within the
    same timestamp tick must."""
    p = node.preparer()
    p.prepare(claim())
    store = CheckpointStore(
        state_dir=node.state_dir, proc_dir=node.host.proc(), logger=logging.getLogger("test")
    )
    with store.transaction() as loaded:
        cp = loaded.checkpoint
        entry = cp.claims[UID]
        with pytest.raises(dataclasses.FrozenInstanceError):
            entry.state = "Unpreparing"  # type: ignore[misc]
        with pytest.raises(dataclasses.FrozenInstanceError):
            entry.devices[0].device = "gpu-1"  # type: ignore[misc]
        cp.claims[UID] = dataclasses.replace(
            entry, state="Unpreparing", error="not saved", units=(Unit("TimeSlicing", ("gpu-0",)),)
        )
        cp.shared["gpu-0/mps"] = SharedEntry("MPS", "Ready")
        cp.extra = {"notSaved": True}
        del cp.claims[UID]
    with store.transaction() as loaded:
        again = loaded.checkpoint.claims[UID]
        assert (again.state, again.error, again.devices[0].extra) == ("Prepared", "", {})
        assert again.units == () and loaded.checkpoint.shared == {}
        assert loaded.checkpoint.extra == {}
    path = node.state_dir / "checkpoint.json"
    stat = path.stat()
    data = path.read_bytes()
    path.write_bytes(data.replace(b'"name":"c1"', b'"name":"c2"', 1))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size
    with store.transaction() as loaded:
        assert loaded.checkpoint.claims[UID].name == "c2"
    path.write_text("{")  # and an unreadable file is reported, not the last good one
    with pytest.raises(CheckpointError, match="corrupt"), store.transaction():
        pass


def test_a_save_is_read_back_as_saved_without_decoding_and_later_changes_do_not_leak(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a save the next transaction reuses a copy of what was saved (the bytes it
    reads are the ones written): equal to what a fresh process decodes from the file,
    unknown fields included, and blind to changes made to the saved object after."""
    node.preparer().prepare(claim())

    def store() -> CheckpointStore:
        return CheckpointStore(
            state_dir=node.state_dir, proc_dir=node.host.proc(), logger=logging.getLogger("t")
        )

    ours = store()
    with ours.transaction() as loaded:
        cp = loaded.checkpoint
        entry = cp.claims[UID]
        device = dataclasses.replace(entry.devices[0], extra={"fromNewerPlugin": {"kept": [1, 2]}})
        cp.claims[UID] = dataclasses.replace(entry, devices=(device,))
        ours.save(cp)
        cp.claims[UID] = dataclasses.replace(entry, error="changed after the save")
        cp.shared["gpu-0/mps"] = SharedEntry("MPS", "Ready")
    decodes: list[int] = []
    real_decode = statefile.decode
    monkeypatch.setattr(statefile, "decode", lambda raw: decodes.append(1) or real_decode(raw))
    with ours.transaction() as loaded:
        cached = loaded.checkpoint
    assert decodes == []
    with store().transaction() as loaded:
        fresh = loaded.checkpoint
    assert decodes == [1]
    assert cached == fresh
    assert cached.claims[UID].error == "" and cached.shared == {}
    assert cached.claims[UID].devices[0].extra["fromNewerPlugin"] == {"kept": [1, 2]}
