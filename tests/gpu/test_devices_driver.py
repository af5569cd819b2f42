"""GpuDriver: the DeviceBackend composing discovery, devices and claim preparation."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pynvml
import pytest

from dra_driver.emulation import EmulatedNode, gputools
from dra_driver.emulation.hosttree import ci_cap_minor, gi_cap_minor
from dra_driver.gpu.driver import GpuDriver
from dra_driver.gpu.hardware.discovery import DiscoveryError, discover
from dra_driver.gpu.hardware.inventory import Inventory
from dra_driver.gpu.sharing.tools import GpuTools
from dra_driver.plugin.claims import AllocatedDevice, Claim, ClaimRef

LOG = logging.getLogger("tests.gpu.driver")
UID = "6f1d3c2a-9b8e-4f7d-a1c2-3e4f5a6b7c8d"


def gpu_driver(
    node: EmulatedNode,
    tmp_path: Path,
    discover_fn=None,
    *,
    logger: logging.Logger = LOG,
    **options: Any,
) -> GpuDriver:
    """A GpuDriver of ``node`` with its emulated tools, state under ``tmp_path``;
    ``options``: GpuDriver's other arguments."""
    tools = gputools.install(node.bin_dir, tmp_path / "tools.jsonl")
    return GpuDriver(
        driver_name="gpu.nvidia.com",
        discover=discover_fn or (lambda: discover(node.host, logger)),
        host=node.host,
        cdi_dir=tmp_path / "cdi",
        state_dir=tmp_path / "state",
        tools=GpuTools(
            nvidia_smi=tools["nvidia-smi"], mps_control=tools["nvidia-cuda-mps-control"]
        ),
        logger=logger,
        pool_name="node-a",
        **options,
    )


def test_refresh_drops_a_vanished_gpu_and_reports_change_once(make_node, tmp_path: Path) -> None:
    node = make_node("l4-x4")
    with node.nvml():
        driver = gpu_driver(node, tmp_path)
        assert [d.name for d in driver.pool().devices] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
        assert driver.refresh() is False  # nothing changed
        node.remove_gpu(3)  # minor 1
        assert driver.refresh() is True
        assert [d.name for d in driver.pool().devices] == ["gpu-0", "gpu-2", "gpu-3"]
        assert len(driver.inventory().gpus) == 3
        assert driver.refresh() is False


def test_failed_rediscovery_keeps_the_last_inventory(make_node, tmp_path: Path) -> None:
    node = make_node("t4")
    results: list[Inventory | Exception] = []

    def flaky() -> Inventory:
        outcome = results.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    with node.nvml():
        results.append(discover(node.host, LOG))
    driver = gpu_driver(node, tmp_path, flaky)
    before = driver.pool()
    results.append(DiscoveryError("NVML went away"))
    assert driver.refresh() is False
    assert driver.pool() == before and len(before.devices) == 1


def test_first_discovery_failure_fails_construction(make_node, tmp_path: Path) -> None:
    node = make_node("t4")

    def broken() -> Inventory:
        raise DiscoveryError("cannot initialise NVML")

    with pytest.raises(DiscoveryError):
        gpu_driver(node, tmp_path, broken)


def test_claims_are_prepared_by_the_preparer_against_current_inventory(
    make_node, tmp_path: Path
) -> None:
    node = make_node("dgx-a100-mig")
    with node.nvml():
        driver = gpu_driver(node, tmp_path)
    claim = Claim(
        ref=ClaimRef(namespace="ns", name="c", uid=UID),
        devices=(AllocatedDevice(request="gpu", pool="node-a", device="gpu-0-mig-2g20gb-14-4"),),
    )
    (prepared,) = driver.prepare(claim)
    assert prepared.device_name == "gpu-0-mig-2g20gb-14-4" and prepared.request_names == ("gpu",)
    assert [r.uid for r in driver.prepared_claims()] == [UID]
    (spec_file,) = (tmp_path / "cdi").iterdir()
    (device,) = json.loads(spec_file.read_text())["devices"]
    nodes = {(n["path"], n["major"], n["minor"]) for n in device["containerEdits"]["deviceNodes"]}
    gi, ci = gi_cap_minor(0, 5), ci_cap_minor(0, 5, 0)  # GPU 0's 2g.20gb is GI 5, CI 0
    assert nodes == {
        ("/dev/nvidia0", 195, 0),
        (f"/dev/nvidia-caps/nvidia-cap{gi}", 511, gi),
        (f"/dev/nvidia-caps/nvidia-cap{ci}", 511, ci),
    }
    driver.unprepare(claim.ref)
    assert list(driver.prepared_claims()) == [] and not list((tmp_path / "cdi").iterdir())


def test_health_marks_tainted_degraded_devices_unhealthy(make_node, tmp_path: Path) -> None:
    node = make_node("l4-x4")
    node.library.inject_fault(
        1, "nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_GPU_IS_LOST
    )  # minor 3
    with node.nvml():
        driver = gpu_driver(node, tmp_path, taint_degraded=True)
    health = {(h.pool, h.device): (h.health, h.message) for h in driver.device_health()}
    assert health == {
        ("node-a", "gpu-0"): ("Healthy", ""),
        ("node-a", "gpu-1"): ("Healthy", ""),
        ("node-a", "gpu-2"): ("Healthy", ""),
        ("node-a", "gpu-3"): ("Unhealthy", "GPU degraded: an NVML query failed"),
    }


def test_per_claim_usage_labels_the_sharing_strategy(make_node, tmp_path: Path) -> None:
    """The usage sampler's targets carry how each prepared claim shares its GPU."""
    from prometheus_client import CollectorRegistry

    from dra_driver.plugin.claimbook import PreparedClaim
    from dra_driver.plugin.claims import OpaqueConfig

    node = make_node("l4-x4")
    with node.nvml():
        driver = gpu_driver(node, tmp_path, registry=CollectorRegistry(), health_policy=None)
        sliced = OpaqueConfig(source="FromClaim", requests=(), parameters={
            "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing"}})  # fmt: skip
        claims = [
            Claim(ref=ClaimRef("ns", "plain", UID),
                  devices=(AllocatedDevice(request="gpu", pool="node-a", device="gpu-0"),)),
            Claim(ref=ClaimRef("ns", "sliced", UID.replace("6f", "7f")),
                  devices=(AllocatedDevice(request="gpu", pool="node-a", device="gpu-1"),),
                  configs=(sliced,)),
        ]  # fmt: skip
        for c in claims:
            driver.prepare(c)
        driver.watch_claims(lambda: [
            PreparedClaim(c.ref, ((c.devices[0].device, None),), (("p", "uid"),)) for c in claims
        ])  # fmt: skip
        assert driver.usage is not None
        driver.start_background(lambda: None)
        try:
            targets = {s.target.claim: s.target.sharing for s in driver.usage.sample_once()}
        finally:
            driver.stop_background()
        assert targets == {"plain": "exclusive", "sliced": "time-slicing"}
        for c in claims:
            driver.unprepare(c.ref)


def test_consumable_gpus_are_published_and_what_cannot_work_is_said_at_start(
    make_node, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from dra_driver.gpu.hardware.consumable import ConsumableGpus

    node = make_node("l4-x4")  # driver 580: shares cannot be enforced
    selection = ConsumableGpus(names=frozenset({"NVIDIA L4", "NVIDIA H100 80GB HBM3"}))
    with node.nvml(), caplog.at_level(logging.INFO, logger=LOG.name):
        driver = gpu_driver(node, tmp_path, health_policy=None, consumable=selection)
        assert all(d.allow_multiple_allocations for d in driver.pool().devices)
        assert driver.refresh() is False  # stays consumable across re-discoveries
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    warnings = [w for w in warnings if not w.startswith("MPS claims will fail")]  # tmp too deep
    assert warnings == [
        "--consumable-gpus names no GPU of this node: NVIDIA H100 80GB HBM3; this node has "
        "NVIDIA L4",
        "driver 580.95.05 cannot enforce fractional shares (r615+ runs one MPS server per "
        "share on an EXCLUSIVE_PROCESS GPU): a fractional share fails to prepare unless its "
        "config asks for advisory time-slicing (sharing.strategy: TimeSlicing); whole-GPU "
        "claims are unaffected",
    ]


def test_slot_gpus_are_published_and_what_is_not_split_is_said_at_start(
    make_node, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from dra_driver.gpu.hardware.consumable import ConsumableGpus, MpsSlots

    node = make_node("l4-x4")
    with node.nvml(), caplog.at_level(logging.INFO, logger=LOG.name):
        inventory = discover(node.host, LOG)
        first = inventory.gpus[0]
        driver = gpu_driver(
            node,
            tmp_path,
            health_policy=None,
            consumable=ConsumableGpus(names=frozenset({first.uuid})),
            mps_slots=MpsSlots.parse(f"{first.uuid}=4,NVIDIA T4=2"),
        )
        slots = {d.name: d.attributes.get("mpsSlots") for d in driver.pool().devices}
        assert slots == {f"gpu-{g.minor}": (4 if g is first else None) for g in inventory.gpus}
        assert driver.refresh() is False  # stays split across re-discoveries
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "--mps-slots names no GPU of this node: NVIDIA T4; this node has NVIDIA L4" in warnings
    assert (
        f"{first.uuid} is selected by --consumable-gpus and --mps-slots: it is published as "
        "4 slots" in warnings
    )
    # Its only consumable GPU is split into slots: no "cannot enforce shares" warning.
    assert not [w for w in warnings if "cannot enforce fractional shares" in w]
