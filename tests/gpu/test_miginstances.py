"""Creating and destroying dynamic MIG instances through NVML (emulated GPUs)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from dra_driver.emulation import EmulatedNode
from dra_driver.emulation.hosttree import ci_cap_minor, gi_cap_minor
from dra_driver.gpu.sharing.miginstances import MigError, MigInstances, MigRequest

LOG = logging.getLogger("tests.miginstances")


def _request(node: EmulatedNode, index: int, profile: str, start: int) -> MigRequest:
    gpu = node.profile.gpus[index]
    p = gpu.model.mig_profile(profile)
    assert p is not None
    return MigRequest(
        gpu_uuid=gpu.uuid, gpu_minor=gpu.minor, gpu_index=index, profile_id=p.id,
        profile_name=p.name, slices=p.slices, start=start, size=p.placement_size,
    )  # fmt: skip


def test_create_wait_and_destroy(make_node) -> None:
    node = make_node("dgx-a100-mig-on")
    req = _request(node, 2, "3g.40gb", 4)
    with node.nvml():
        mig = MigInstances(host=node.host, logger=LOG)
        try:
            gi_id = mig.create_gpu_instance(req)
            ci_id, uuid = mig.create_compute_instance(req, gi_id)
            assert (gi_id, ci_id) == (2, 0) and uuid.startswith("MIG-")
            assert mig.wait_for_nodes(req, gi_id, ci_id) == (
                gi_cap_minor(2, 2),
                ci_cap_minor(2, 2, 0),
            )
            assert [gi.gi_id for gi in node.mig.gpu_instances(2)] == [2]
            with pytest.raises(MigError, match="placement is taken"):
                mig.create_gpu_instance(_request(node, 2, "2g.20gb", 4))
            assert mig.destroy(req, gi_id) is True
            assert node.mig.gpu_instances(2) == []
            assert mig.destroy(req, gi_id) is False  # idempotent
        finally:
            mig.close()


def test_undo_without_a_recorded_id_finds_the_instance_by_its_placement(make_node) -> None:
    node = make_node("dgx-a100-mig-on")
    req = _request(node, 0, "1g.10gb", 5)
    with node.nvml():
        mig = MigInstances(host=node.host, logger=LOG)
        try:
            gi_id = mig.create_gpu_instance(req)  # "killed" before the ID was recorded
            mig.create_compute_instance(req, gi_id)
            other = mig.create_gpu_instance(_request(node, 0, "1g.10gb", 4))
            assert mig.destroy(req, None) is True
            assert [gi.gi_id for gi in node.mig.gpu_instances(0)] == [other]
        finally:
            mig.close()


def test_an_instance_that_is_not_ours_is_never_touched(make_node) -> None:
    node = make_node("dgx-a100-mig")  # GPU 0: an admin's 3g.40gb (GI 1), 2g.20gb, 1g.10gb
    with node.nvml():
        mig = MigInstances(host=node.host, logger=LOG)
        try:
            # A record claiming GI 1 for a 4g.40gb at 0: GI 1 is a 3g.40gb, not ours.
            assert mig.destroy(_request(node, 0, "4g.40gb", 0), 1) is False
            # A record of GI 5 (the admin's 2g.20gb at 4) for a 2g.20gb at 2: not ours either.
            assert mig.destroy(_request(node, 0, "2g.20gb", 2), 5) is False
            assert [gi.gi_id for gi in node.mig.gpu_instances(0)] == [1, 5, 13]
        finally:
            mig.close()


def test_waits_for_device_nodes_that_come_late(tmp_path: Path) -> None:
    profile = tmp_path / "late.yaml"
    profile.write_text(
        'name: late\ndriverVersion: "580.95.05"\ncudaDriverVersion: 13000\n'
        "deviceNodeDelay: 0.4\ngpus:\n"
        "  - {model: H100-SXM5-80GB, busId: '0000:1b:00.0', pcieRoot: pci0000:16,"
        " migEnabled: true}\n"
    )
    node = EmulatedNode.create(profile, tmp_path / "root")
    req = _request(node, 0, "2g.20gb", 2)
    with node.nvml():
        mig = MigInstances(host=node.host, logger=LOG)
        try:
            gi_id = mig.create_gpu_instance(req)
            ci_id, _ = mig.create_compute_instance(req, gi_id)
            started = time.monotonic()
            gi_minor, ci_minor = mig.wait_for_nodes(req, gi_id, ci_id)
            assert time.monotonic() - started >= 0.2
            for minor in (gi_minor, ci_minor):
                assert node.host.dev("nvidia-caps", f"nvidia-cap{minor}").exists()
        finally:
            mig.close()


def test_capabilities_that_never_appear_fail_the_wait(make_node) -> None:
    node = make_node("dgx-a100-mig-on")
    req = _request(node, 1, "1g.10gb", 0)
    with node.nvml():
        mig = MigInstances(host=node.host, logger=LOG, node_timeout_s=0.2)
        try:
            with pytest.raises(MigError, match=r"did not appear in 0\.2 s"):
                mig.wait_for_nodes(req, 7, 0)  # nothing was created
        finally:
            mig.close()
