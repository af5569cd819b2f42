"""Per-claim GPU usage from emulated NVML processes: PIDs mapped to pods through their
cgroups, utilization and memory per (claim, pod, device), shares of a shared GPU, MIG
devices by instance, and series that vanish with their claim."""

from __future__ import annotations

import logging

import pynvml
import pytest
from prometheus_client import CollectorRegistry

from dra_driver.gpu.hardware.nvml import Nvml
from dra_driver.gpu.monitoring.usage import UsageCollector, UsageSampler, UsageTarget, pod_uid_of

POD_A = "11111111-2222-4333-8444-555555555555"
POD_B = "66666666-7777-4888-9999-aaaaaaaaaaaa"
GIB = 2**30


@pytest.fixture
def sampled(make_node):
    node = make_node("dgx-a100-mig")
    targets: list[UsageTarget] = []
    with node.nvml():
        nvml = Nvml()
        nvml.init()
        sampler = UsageSampler(nvml=nvml, host=node.host, targets=lambda: list(targets),
                               interval_s=3600, logger=logging.getLogger("t"))  # fmt: skip
        try:
            yield node, targets, sampler
        finally:
            nvml.shutdown()
    assert pynvml.nvmlLib is None


def test_cgroup_paths_of_both_drivers_name_the_pod(make_node) -> None:
    node = make_node("t4")
    node.set_processes(0, [{"pid": 10, "usedMiB": 1}], pods={10: POD_A})
    assert pod_uid_of(node.host, 10) == POD_A
    cgroupfs = node.host.proc("11", "cgroup")
    cgroupfs.parent.mkdir(parents=True)
    cgroupfs.write_text(f"12:memory:/kubepods/burstable/pod{POD_B}/0123abcd\n")
    assert pod_uid_of(node.host, 11) == POD_B
    node.set_processes(0, [{"pid": 12, "usedMiB": 1}])  # a host process, no pod
    assert pod_uid_of(node.host, 12) is None
    assert pod_uid_of(node.host, 99) is None  # gone


def test_exclusive_and_shared_gpus_by_pod(sampled) -> None:
    node, targets, sampler = sampled
    gpu = node.profile.gpus[2]  # a full A100 (not in MIG mode)
    shared = UsageTarget(namespace="ml", claim="train", pods=(("a", POD_A), ("b", POD_B)),
                         device="gpu-2", gpu_uuid=gpu.uuid, mig=None, allocated_bytes=80 * GIB,
                         sharing="time-slicing", product="NVIDIA A100-SXM4-80GB")  # fmt: skip
    targets.append(shared)
    node.set_processes(2, [
        {"pid": 100, "usedMiB": 4096, "smUtil": 30},
        {"pid": 101, "usedMiB": 2048, "smUtil": 10},
        {"pid": 200, "usedMiB": 2048, "smUtil": 20},
        {"pid": 300, "usedMiB": 512, "smUtil": 5},  # someone else's (no pod)
    ], pods={100: POD_A, 101: POD_A, 200: POD_B})  # fmt: skip
    a, b = sampler.sample_once()
    assert (a.pod, a.utilization, a.memory_used_bytes) == ("a", 0.4, 6 * GIB)
    assert (b.pod, b.utilization, b.memory_used_bytes) == ("b", 0.2, 2 * GIB)
    assert a.utilization_share == pytest.approx(40 / 65)
    assert b.memory_share == pytest.approx(2048 / 8704)


def test_mig_devices_report_memory_by_instance(sampled) -> None:
    node, targets, sampler = sampled
    gpu = node.profile.gpus[0]
    mig = gpu.mig_instances[1]
    targets.append(UsageTarget(namespace="ml", claim="small", pods=(("p", POD_A),),
                               device="gpu-0-mig-2g20gb-14-4", gpu_uuid=gpu.uuid,
                               mig=(mig.gi_id, mig.ci_id), allocated_bytes=19968 * 2**20,
                               profile="2g.20gb"))  # fmt: skip
    node.set_processes(0, [
        {"pid": 7, "usedMiB": 3000, "gi": mig.gi_id, "ci": mig.ci_id},
        {"pid": 8, "usedMiB": 5000, "gi": gpu.mig_instances[0].gi_id, "ci": 0},
    ], pods={7: POD_A, 8: POD_A})  # fmt: skip
    (s,) = sampler.sample_once()
    assert (s.utilization, s.memory_used_bytes) == (None, 3000 * 2**20)


def test_metrics_follow_the_prepared_claims(sampled) -> None:
    node, targets, sampler = sampled
    gpu = node.profile.gpus[3]
    targets.append(UsageTarget(namespace="ml", claim="c1", pods=(("p1", POD_A),),
                               device="gpu-3", gpu_uuid=gpu.uuid, mig=None,
                               allocated_bytes=80 * GIB))  # fmt: skip
    node.set_processes(3, [{"pid": 5, "usedMiB": 1024, "smUtil": 15}], pods={5: POD_A})
    sampler.sample_once()
    registry = CollectorRegistry()
    registry.register(UsageCollector(sampler))
    labels = {"namespace": "ml", "claim": "c1", "pod": "p1", "device": "gpu-3"}
    assert registry.get_sample_value("dra_driver_claim_gpu_utilization_ratio", labels) == 0.15
    assert registry.get_sample_value("dra_driver_claim_gpu_memory_used_bytes", labels) == 2**30
    assert (
        registry.get_sample_value("dra_driver_claim_gpu_memory_allocated_bytes", labels) == 80 * GIB
    )
    targets.clear()  # unprepared: its series go at once, before the next sample
    assert registry.get_sample_value("dra_driver_claim_gpu_memory_used_bytes", labels) is None


def test_targets_follow_the_claim_book_and_the_inventory(make_node, discover_node) -> None:
    from dra_driver.gpu.monitoring.usage import targets_for
    from dra_driver.plugin.claimbook import PreparedClaimBook
    from dra_driver.plugin.claims import ClaimRef

    inventory = discover_node(make_node("dgx-a100-mig"))
    objects = {}

    def claim(name: str, uid: str, devices: list[str], pods: list[tuple[str, str]]) -> ClaimRef:
        objects[name] = {
            "metadata": {"uid": uid},
            "status": {
                "allocation": {"devices": {"results": [
                    {"driver": "gpu.nvidia.com", "pool": "node-a", "device": d, "request": "r"}
                    for d in devices] + [
                    {"driver": "other.example.com", "pool": "node-a", "device": "x", "request": "r"}
                ]}},
                "reservedFor": [{"resource": "pods", "name": n, "uid": u} for n, u in pods],
            },
        }  # fmt: skip
        return ClaimRef("ml", name, uid)

    book = PreparedClaimBook(driver_name="gpu.nvidia.com", pool_name="node-a",
                             get_claim=lambda ns, n: objects.get(n),
                             logger=logging.getLogger("t"))  # fmt: skip
    full = claim("full", "u1", ["gpu-2"], [("p1", POD_A)])
    mig = claim("mig", "u2", ["gpu-0-mig-2g20gb-14-4"], [("p2", POD_B)])
    book.prepared(full, objects["full"])
    book.reload([full, mig])  # after a restart: rebuilt from the backend's claims
    objects["full"]["status"]["reservedFor"].append(
        {"resource": "pods", "name": "p3", "uid": POD_B}
    )
    book.refresh()  # a second pod joined the shared claim without a prepare call
    targets = {t.claim: t for t in targets_for(book.claims(), inventory, {"u1": "time-slicing"})}
    assert targets["full"].pods == (("p1", POD_A), ("p3", POD_B))
    assert (targets["full"].device, targets["full"].mig, targets["full"].sharing) == (
        "gpu-2",
        None,
        "time-slicing",
    )
    assert targets["full"].allocated_bytes == 80 * GIB
    assert (targets["mig"].mig, targets["mig"].profile) == ((5, 0), "2g.20gb")  # GI 5, CI 0
    assert targets["mig"].allocated_bytes == 19968 * 2**20
    book.unprepared(full)
    assert [t.claim for t in targets_for(book.claims(), inventory)] == ["mig"]
