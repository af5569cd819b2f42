"""Checkpoint: forward compatibility, corruption, reboots, the cross-process lock."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from dra_driver.gpu.checkpoint import CheckpointError, CheckpointStore
from dra_driver.plugin.backend import PrepareError
from dra_driver.plugin.claims import ClaimRef
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
    assert "checksum" not in after


def test_file_is_private_and_written_atomically(node: Node) -> None:
    node.preparer().prepare(claim())
    path = node.state_dir / "checkpoint.json"
    assert path.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in node.state_dir.iterdir()) == [
        "checkpoint.json",
        "checkpoint.lock",
    ]


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
    write(node, {"version": 2, "claims": {}})
    with pytest.raises(PrepareError, match="version 2, written by a newer incompatible plugin"):
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
            boot_id_path=node.host.proc("sys", "kernel", "random", "boot_id"),
            lock_timeout=0.3,
        )
        start = time.monotonic()
        with pytest.raises(CheckpointError, match="held by another process"), store.locked():
            pass
        assert time.monotonic() - start >= 0.3
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    with store.locked() as cp:  # released when the holder died
        assert cp.claims == {}
