"""Dynamic MIG on the real scheduler: counters pack MIG claims exactly as the hardware allows.

Nodes publish ``dra-driver slices --mig-mode dynamic`` output for emulated profiles.
The oracle for "as the hardware allows" is the emulated GPU itself
(:class:`~dra_driver.emulation.migstate.MigState`, NVML's placement rules):
after every claim the scheduler answers, the test creates the allocated GPU
instance there (it must succeed) and checks that a claim stayed unallocated
exactly when the GPU had no free placement for its profile.
"""

from __future__ import annotations

import re
import secrets
from pathlib import Path
from typing import Any

import pytest

from dra_driver.commands.slices import resource_slices
from dra_driver.devcluster import Cluster, wait_until
from dra_driver.emulation import load_profile
from dra_driver.emulation.migstate import MigState
from tests.cluster.test_allocation import (
    DRIVER,
    GPU,
    MIG,
    RESOURCE,
    allocation,
    apply_deviceclasses,
    attr,
    cap,
    claim_and_pod,
    emulated_inventory,
    request,
    stays_unallocated,
)

_MIG_NAME = re.compile(r"^gpu-(\d+)-mig-[a-z0-9-]+-(\d+)-(\d+)$")


def one_gpu_profile(tmp_path: Path, model: str) -> Path:
    path = tmp_path / f"one-{model.lower()}.yaml"
    path.write_text(
        'name: one\ndriverVersion: "580.95.05"\ncudaDriverVersion: 13000\ngpus:\n'
        f"  - {{model: {model}, busId: '0000:07:00.0', pcieRoot: pci0000:00, numaNode: 0,"
        " migEnabled: true}\n"
    )
    return path


def publish_dynamic(cluster: Cluster, profile: str | Path) -> tuple[str, list[dict[str, Any]]]:
    name = f"dyn-{Path(str(profile)).stem}-{secrets.token_hex(3)}"
    node = cluster.create_node(name)
    slices = resource_slices(
        emulated_inventory(str(profile)),
        driver_name=DRIVER,
        node_name=name,
        node_uid=node["metadata"]["uid"],
        mig_mode="dynamic",
    )
    for s in slices:
        stored = cluster.rest.create(f"{RESOURCE}/resourceslices", s)
        assert stored["spec"] == s["spec"]  # nothing dropped: partitionable devices are on
    return name, slices


def on(node: str) -> dict[str, str]:
    return {"kubernetes.io/hostname": node}


def mig_claim(cluster: Cluster, ns: str, node: str, name: str, profile: str) -> None:
    claim_and_pod(
        cluster, ns, name, [request("mig", MIG, f"{attr('profile')} == '{profile}'")], on(node)
    )


def release(cluster: Cluster, ns: str, name: str) -> None:
    """Delete the pod and its claim; the claim's devices (and counters) become free."""
    cluster.rest.delete(f"/api/v1/namespaces/{ns}/pods/{name}")
    cluster.rest.delete(f"{RESOURCE}/namespaces/{ns}/resourceclaims/{name}")

    def gone() -> bool:
        listed = cluster.rest.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims")
        return all(c["metadata"]["name"] != name for c in listed.get("items") or [])

    wait_until(gone, timeout=30, what=f"claim {name} deleted")


@pytest.fixture(scope="module")
def classes(cluster: Cluster) -> None:
    apply_deviceclasses(cluster)


SEQUENCES = {
    "A100-SXM4-80GB": [
        "1g.10gb", "1g.10gb", "1g.10gb", "4g.40gb", "1g.20gb", "1g.10gb+me", "2g.20gb",
        "1g.10gb", "7g.80gb", "3g.40gb",
    ],
    "H100-SXM5-80GB": [
        "1g.10gb+me", "1g.10gb+me", "2g.20gb", "2g.20gb", "2g.20gb", "1g.20gb", "1g.10gb",
        "3g.40gb",
    ],
}  # fmt: skip


@pytest.mark.parametrize("model", sorted(SEQUENCES))
def test_mixes_of_profiles_fill_a_gpu_exactly_as_the_placement_rules_allow(
    cluster: Cluster, cluster_namespace: str, classes: None, tmp_path: Path, model: str
) -> None:
    profile = one_gpu_profile(tmp_path, model)
    node, _ = publish_dynamic(cluster, profile)
    hardware = MigState(load_profile(profile))
    gpu = hardware.profile.gpus[0]
    ns, outcomes = cluster_namespace, []
    for i, wanted in enumerate(SEQUENCES[model]):
        emulated = gpu.model.mig_profile(wanted)
        assert emulated is not None
        fits = bool(hardware.free_placements(gpu, emulated))
        name = f"{model.lower()[:4]}-{i}"
        mig_claim(cluster, ns, node, name, wanted)
        if not fits:
            stays_unallocated(cluster, ns, name)
            outcomes.append((wanted, None))
            continue
        ((_, pool, device),) = allocation(cluster, ns, name)
        match = _MIG_NAME.match(device)
        assert pool == node and match, device
        profile_id, start = int(match[2]), int(match[3])
        assert profile_id == emulated.id
        # The scheduler's choice is a placement the GPU really accepts.
        hardware.create_gpu_instance(gpu, emulated, start, emulated.placement_size)
        outcomes.append((wanted, start))
    used = {s for gi in hardware.gpu_instances(0) for s in gi.memory_slices}
    allocated = [w for w, s in outcomes if s is not None]
    assert len(allocated) >= 4 and len(allocated) < len(outcomes)  # filled, then refused
    assert len(used) >= 7  # no memory slice a listed profile could still use was left idle
    for wanted in {w for w, _ in outcomes}:  # and nothing more fits now
        emulated = gpu.model.mig_profile(wanted)
        assert emulated is not None
        assert hardware.free_placements(gpu, emulated) == [], wanted


def test_full_gpu_and_mig_claims_exclude_each_other_on_a_mixed_node(
    cluster: Cluster, cluster_namespace: str, classes: None
) -> None:
    node, _ = publish_dynamic(cluster, "h100-l4-mixed")
    inventory = emulated_inventory("h100-l4-mixed")
    uuid0 = inventory.gpus[0].uuid
    ns = cluster_namespace
    claim_and_pod(
        cluster, ns, "whole", [request("gpu", GPU, f"{attr('uuid')} == '{uuid0}'")], on(node)
    )
    assert allocation(cluster, ns, "whole") == [("gpu", node, "gpu-0")]
    on_gpu0 = f"{attr('parentUUID')} == '{uuid0}' && {attr('profile')} == '1g.10gb'"
    claim_and_pod(cluster, ns, "slice", [request("mig", MIG, on_gpu0)], on(node))
    stays_unallocated(cluster, ns, "slice")
    # The L4s and the MIG-off H100 are plain GPUs next to the partitioned ones.
    claim_and_pod(
        cluster, ns, "l4", [request("gpu", GPU, f"{attr('productName')} == 'NVIDIA L4'")], on(node)
    )
    ((_, _, l4),) = allocation(cluster, ns, "l4")
    assert l4 in {"gpu-3", "gpu-4"}
    release(cluster, ns, "whole")
    ((_, _, device),) = allocation(cluster, ns, "slice")  # retried once the GPU was freed
    assert device.startswith("gpu-0-mig-1g10gb-19-")
    claim_and_pod(
        cluster, ns, "whole-again", [request("gpu", GPU, f"{attr('uuid')} == '{uuid0}'")], on(node)
    )
    stays_unallocated(cluster, ns, "whole-again")


def test_freeing_an_instance_makes_its_placement_allocatable_again(
    cluster: Cluster, cluster_namespace: str, classes: None, tmp_path: Path
) -> None:
    node, _ = publish_dynamic(cluster, one_gpu_profile(tmp_path, "A100-SXM4-80GB"))
    ns = cluster_namespace
    placed: dict[str, str] = {}
    for i in range(7):
        mig_claim(cluster, ns, node, f"one-{i}", "1g.10gb")
        ((_, _, device),) = allocation(cluster, ns, f"one-{i}")
        placed[f"one-{i}"] = device
    assert sorted(placed.values()) == [f"gpu-0-mig-1g10gb-19-{s}" for s in range(7)]
    mig_claim(cluster, ns, node, "eighth", "1g.10gb")
    stays_unallocated(cluster, ns, "eighth")
    victim = next(c for c, d in placed.items() if d.endswith("-19-3"))
    release(cluster, ns, victim)
    assert allocation(cluster, ns, "eighth") == [("mig", node, "gpu-0-mig-1g10gb-19-3")]


@pytest.mark.parametrize(
    ("profile", "devices", "count"), [("dgx-a100-mig-on", 208, 5), ("h100-l4-mixed", 55, 2)]
)
def test_large_and_mixed_pools_are_valid_for_the_scheduler(
    cluster: Cluster, cluster_namespace: str, classes: None, profile: str, devices: int, count: int
) -> None:
    node, slices = publish_dynamic(cluster, profile)
    assert len(slices) == count
    assert sum(len(s["spec"].get("devices", [])) for s in slices) == devices
    ns = cluster_namespace
    # Seven 1g.10gb on one GPU (as many as it holds), and a whole GPU elsewhere.
    same_gpu = [{"matchAttribute": f"{DRIVER}/parentUUID"}]
    one_g = f"{attr('profile')} == '1g.10gb'"
    claim_and_pod(
        cluster, ns, f"seven-{profile}", [request("mig", MIG, one_g, count=7)], on(node), same_gpu
    )
    claim_and_pod(cluster, ns, f"whole-{profile}", [request("gpu", GPU)], on(node))
    seven = allocation(cluster, ns, f"seven-{profile}")
    assert (
        len({d for _, _, d in seven}) == 7 and len({d.split("-mig-")[0] for _, _, d in seven}) == 1
    )
    ((_, _, whole),) = allocation(cluster, ns, f"whole-{profile}")
    assert whole != seven[0][2].split("-mig-")[0]


STD = "device.attributes['resource.kubernetes.io']"
NVIDIA_MIG_SELECTORS = [
    # Every attribute and capacity NVIDIA's driver publishes on a MIG device: a claim
    # written for it may read any of them, and a missing one aborts scheduling.
    f"{attr('type')} == 'mig' && {attr('profile')} == '1g.10gb'",
    f"{attr('parentUUID')}.startsWith('GPU-') && {attr('brand')} == 'Nvidia'",
    f"{attr('productName')}.contains('A100') && {attr('architecture')} == 'Ampere'",
    f"{attr('cudaComputeCapability')}.isGreaterThan(semver('7.5.0'))",
    f"{attr('driverVersion')}.isGreaterThan(semver('550.0.0'))",
    f"{attr('cudaDriverVersion')}.isGreaterThan(semver('12.0.0'))",
    f"{STD}.pciBusID.startsWith('0000:') && {STD}.pcieRoot.startsWith('pci')",
    f"{cap('memory')}.compareTo(quantity('9Gi')) >= 0",
    " && ".join(
        f"{cap(c)}.compareTo(quantity('{v}')) >= 0"
        for c, v in [
            ("multiprocessors", "14"),
            ("copyEngines", "1"),
            ("decoders", "0"),
            ("encoders", "0"),
            ("jpegEngines", "0"),
            ("ofaEngines", "0"),
        ]
    ),
]


def test_claims_written_for_nvidias_driver_match_the_dynamic_pool(
    cluster: Cluster, cluster_namespace: str, classes: None, tmp_path: Path
) -> None:
    """The counters left out and the memorySlice capacities dropped are nothing such a
    claim reads: it binds, and seven of them fill the GPU exactly as the hardware does."""
    node, _ = publish_dynamic(cluster, one_gpu_profile(tmp_path, "A100-SXM4-80GB"))
    ns = cluster_namespace
    for i in range(8):
        claim_and_pod(
            cluster, ns, f"nv-{i}", [request("mig", MIG, *NVIDIA_MIG_SELECTORS)], on(node)
        )
    placed = [allocation(cluster, ns, f"nv-{i}") for i in range(7)]
    assert sorted(d for ((_, _, d),) in placed) == [f"gpu-0-mig-1g10gb-19-{s}" for s in range(7)]
    stays_unallocated(cluster, ns, "nv-7")  # as on the GPU: no eighth 1g.10gb


def test_compact_placements_serve_claims_on_what_they_keep_and_refuse_the_rest(
    cluster: Cluster, cluster_namespace: str, classes: None, tmp_path: Path
) -> None:
    """``--dynamic-mig-attributes compact`` on the real scheduler: a claim on what stays
    binds; one reading a dropped attribute stays pending with the scheduler's CEL error
    (as the chart's values.yaml warns), not silently on another device."""
    profile = one_gpu_profile(tmp_path, "H100-SXM5-80GB")
    name = f"compact-{secrets.token_hex(3)}"
    node = cluster.create_node(name)
    for s in resource_slices(
        emulated_inventory(str(profile)), driver_name=DRIVER, node_name=name,
        node_uid=node["metadata"]["uid"], mig_mode="dynamic", placement_attributes="compact",
    ):  # fmt: skip
        cluster.rest.create(f"{RESOURCE}/resourceslices", s)
    ns = cluster_namespace
    kept = [
        f"{attr('profile')} == '1g.10gb' && {attr('productName')}.contains('H100')",
        f"{attr('cudaComputeCapability')}.isGreaterThan(semver('8.9.0'))",
        f"{STD}.numaNode == 0 && {attr('parentUUID')}.startsWith('GPU-')",
    ]
    claim_and_pod(cluster, ns, "kept", [request("mig", MIG, *kept)], on(name))
    ((_, pool, device),) = allocation(cluster, ns, "kept")
    assert pool == name and "-mig-1g10gb-" in device
    dropped = f"{attr('profile')} == '1g.10gb' && {attr('architecture')} == 'Hopper'"
    claim_and_pod(cluster, ns, "dropped", [request("mig", MIG, dropped)], on(name))
    assert "architecture" in stays_unallocated(cluster, ns, "dropped")
