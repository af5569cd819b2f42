"""Tier 5: the same discovery, slice and prepare code on a real NVIDIA GPU node.

Not part of ``make test`` (CI has no GPU); run on a GPU node as root with
``make test-gpu`` (``scripts/test-gpu``). Nothing here is emulated: pynvml talks
to the real driver, the device nodes and driver files are the host's, time-slicing
and MPS are the real ``nvidia-smi`` and ``nvidia-cuda-mps-control``, and each
check compares what our code says with what NVIDIA's own tool says.

Environment: ``DRA_DRIVER_ROOT`` (default: found from ``nvidia-smi`` on PATH),
``DRA_GPU_TOOLS`` (a dir with ``cdi-harness``, ``runc``, ``busybox`` for the
container test; default: PATH and ``scripts/build-cdi-harness.sh``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from dra_driver.gpu.hardware.devices import build_pool
from dra_driver.gpu.hardware.inventory import Gpu, Inventory
from dra_driver.gpu.hardware.partitions import capacity, partitions
from dra_driver.gpu.preparing import ClaimPreparer
from dra_driver.gpu.sharing.tools import GpuTools
from dra_driver.plugin.resources import Version
from tests.realgpu.realhost import (
    Client,
    assert_nothing_left,
    compute_mode,
    mps_mounts,
    query,
    real_claim,
    record,
    sh,
    smi,
    spec_of,
    tool,
)

REPO = Path(__file__).parents[2]
MIB = 1024 * 1024


def test_discovery_matches_nvidia_smi(inventory: Inventory, tools: GpuTools) -> None:
    fields = ["index", "uuid", "name", "memory.total", "pci.bus_id", "compute_cap",
              "driver_version", "mig.mode.current", "pcie.link.gen.max",
              "pcie.link.width.max", "compute_mode"]  # fmt: skip
    rows = query(tools, fields)
    record("nvidia-smi --query-gpu", json.dumps(rows, indent=1))
    record("discover", json.dumps([g.__repr__() for g in inventory.gpus], indent=1))
    assert len(inventory.gpus) == len(rows) > 0
    assert inventory.driver_version == rows[0]["driver_version"]
    for gpu, row in zip(sorted(inventory.gpus, key=lambda g: g.index), rows, strict=True):
        assert not gpu.degraded, gpu.error
        assert gpu.index == int(row["index"])
        assert gpu.uuid == row["uuid"]
        assert gpu.product_name == row["name"]
        assert gpu.memory_bytes // MIB == int(row["memory.total"])
        domain, rest = row["pci.bus_id"].lower().split(":", 1)
        assert gpu.pci.bus_id == f"{int(domain, 16):04x}:{rest}"
        assert "{}.{}".format(*gpu.cuda_compute_capability) == row["compute_cap"]
        assert gpu.mig_enabled == (row["mig.mode.current"] == "Enabled")
        assert gpu.pci.pcie_generation == int(row["pcie.link.gen.max"])
        assert gpu.pci.pcie_link_width == int(row["pcie.link.width.max"])
        assert gpu.compute_mode.lower().replace("_", "") == row["compute_mode"].lower().replace(
            "_", ""
        )
        # The device node we will hand to containers is this GPU's.
        st = os.stat(f"/dev/nvidia{gpu.minor}")
        assert os.minor(st.st_rdev) == gpu.minor


# "|   0  MIG 1g.10gb         19     7/7        9.75       No     16     1     0   |"
_LGIP = re.compile(r"^\|\s+(\d+)\s+MIG (\S+)\s+(\d+)\s+\d+/\d+\s+([\d.]+)\s+\w+\s+(\d+)\s")


def test_mig_profiles_match_nvidia_smi(inventory: Inventory, tools: GpuTools) -> None:
    capable = [g for g in inventory.gpus if g.mig_capable]
    if not capable:
        pytest.fail("no MIG-capable GPU on this node: this check needs one (A100/H100/H200)")
    out = smi(tools, "mig", "-lgip")
    record("nvidia-smi mig -lgip", out)
    theirs: dict[tuple[int, str], tuple[int, float, int]] = {}
    for line in out.splitlines():
        m = _LGIP.match(line)
        if m:
            theirs[(int(m[1]), m[2])] = (int(m[3]), float(m[4]), int(m[5]))
    assert theirs, out
    for gpu in capable:
        ours = {
            (gpu.index, p.name): (p.gi_profile_id, round(p.memory_bytes / 2**30, 2),
                                  p.multiprocessors)
            for p in gpu.mig_profiles
        }  # fmt: skip
        assert ours == {k: v for k, v in theirs.items() if k[0] == gpu.index}


# "GPU  0 Profile ID 15 Placements: {0,2,4,6}:2" (and "Placement :" for a single one)
_LGIPP = re.compile(r"GPU\s+(\d+)\s+Profile ID\s+(\d+)\s+Placements?\s*:\s*\{([\d,]+)\}:(\d+)")


def test_mig_placements_match_nvidia_smi(inventory: Inventory, tools: GpuTools) -> None:
    """Dynamic MIG publishes one partition per profile x placement: read-only NVML
    queries (no MIG mode change, no instance) must say what NVIDIA's tool says."""
    capable = [g for g in inventory.gpus if g.mig_capable]
    if not capable:
        pytest.fail("no MIG-capable GPU on this node: this check needs one (A100/H100/H200)")
    out = smi(tools, "mig", "-lgipp")
    theirs: dict[tuple[int, int], set[tuple[int, int]]] = {}
    for m in _LGIPP.finditer(out):
        starts = {(int(start), int(m[4])) for start in m[3].split(",")}
        theirs[(int(m[1]), int(m[2]))] = starts
    ours = {
        (gpu.index, p.gi_profile_id): {(pl.start, pl.size) for pl in p.placements}
        for gpu in capable
        for p in gpu.mig_profiles
    }
    record(
        "nvidia-smi mig -lgipp / ours / dynamic partitions",
        f"{out}\nours: {sorted((k, sorted(v)) for k, v in ours.items())}\n"
        + "\n".join(
            f"gpu {g.index}: {[p.name for p in partitions(g)]}\ncounters {capacity(g)}"
            for g in capable
        ),
    )
    assert theirs, f"no placements parsed from nvidia-smi mig -lgipp:\n{out}"
    assert ours == theirs


def test_published_devices_are_typed_and_within_limits(inventory: Inventory) -> None:
    pool = build_pool(inventory, driver_name="gpu.nvidia.com")
    by_uuid = {g.uuid: g for g in inventory.gpus}
    assert len(pool.devices) == len(inventory.gpus) + sum(
        len(g.mig_instances) for g in inventory.gpus
    )
    for device in pool.devices:
        assert len(device.attributes) + len(device.capacity) <= 32
        if device.attributes["type"] != "gpu":
            continue
        gpu: Gpu = by_uuid[str(device.attributes["uuid"])]
        cc = "{}.{}.0".format(*gpu.cuda_compute_capability)
        assert device.attributes["cudaComputeCapability"] == Version(cc)
        assert device.attributes["productName"] == gpu.product_name
        assert device.capacity["memory"].value == f"{gpu.memory_bytes // MIB}Mi"
        assert device.capacity["multiprocessors"].value == str(gpu.multiprocessors)


def test_prepare_uses_the_hosts_device_nodes_and_driver_files(
    preparer: ClaimPreparer, inventory: Inventory, tmp_path: Path
) -> None:
    gpu = min(inventory.gpus, key=lambda g: g.minor)
    c = real_claim(f"gpu-{gpu.minor}")
    (prepared,) = preparer.prepare(c)
    spec = spec_of(tmp_path / "cdi")
    record("CDI spec for one real GPU", json.dumps(spec, indent=1))
    nodes = {
        n["path"]: n
        for e in [spec["containerEdits"], *(d["containerEdits"] for d in spec["devices"])]
        for n in e.get("deviceNodes", [])
    }
    for path, node in nodes.items():
        st = os.stat(node.get("hostPath", path))
        assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (node["major"], node["minor"]), path
    assert f"/dev/nvidia{gpu.minor}" in nodes and "/dev/nvidiactl" in nodes
    mounts = {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}
    assert any("libcuda.so" in c for c in mounts), mounts
    assert any("libnvidia-ml.so" in c for c in mounts), mounts
    assert any(c.endswith("/bin/nvidia-smi") for c in mounts), mounts  # relative to the root
    hooks = [h["args"][1] for h in spec["containerEdits"]["hooks"]]
    assert hooks == ["create-symlinks", "enable-cuda-compat", "update-ldcache",
                     "disable-device-node-modification"]  # fmt: skip
    assert all(Path(h).exists() for h in mounts.values())
    assert prepared.cdi_device_ids[0].startswith("k8s.gpu.nvidia.com/claim=")
    preparer.unprepare(c.ref)
    assert list((tmp_path / "cdi").iterdir()) == []


def cdi_harness() -> str:
    where = os.environ.get("DRA_GPU_TOOLS")
    if where and (Path(where) / "cdi-harness").exists():
        return str(Path(where) / "cdi-harness")
    out = sh(str(REPO / "scripts" / "build-cdi-harness.sh"), timeout=600)
    return out.strip()


def glibc_rootfs(rootfs: Path, program: Path) -> None:
    """busybox plus the host's C library for ``program`` (driver files come from CDI)."""
    (rootfs / "bin").mkdir(parents=True)
    shutil.copy(tool("busybox"), rootfs / "bin" / "busybox")
    for applet in ("sh", "ls", "cat", "env", "grep"):
        (rootfs / "bin" / applet).symlink_to("busybox")
    for d in ("dev", "proc", "sys", "tmp", "etc", "usr/bin"):
        (rootfs / d).mkdir(parents=True, exist_ok=True)
    for line in sh("ldd", str(program)).splitlines():
        m = re.search(r"(/\S+)\s+\(0x", line)
        if m and "nvidia" not in m[1]:
            lib = Path(m[1])
            dest = rootfs / lib.relative_to("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(lib.resolve(), dest)


def test_container_runs_nvidia_smi_on_exactly_its_gpu(
    preparer: ClaimPreparer, inventory: Inventory, tools: GpuTools, tmp_path: Path
) -> None:
    """Our spec through the real CDI library and runc: NVIDIA's tool works inside."""
    gpu = min(inventory.gpus, key=lambda g: g.minor)
    c = real_claim(f"gpu-{gpu.minor}")
    ids = [i for d in preparer.prepare(c) for i in d.cdi_device_ids]
    bundle = tmp_path / "bundle"
    glibc_rootfs(bundle / "rootfs", tools.nvidia_smi)
    runc = tool("runc")
    sh(runc, "spec", "--bundle", str(bundle))
    base = json.loads((bundle / "config.json").read_text())
    base["process"]["terminal"] = False
    spec = spec_of(tmp_path / "cdi")
    (smi_path,) = [m["containerPath"] for m in spec["containerEdits"]["mounts"]
                   if m["containerPath"].endswith("/nvidia-smi")]  # fmt: skip
    base["process"]["args"] = [
        "/bin/sh", "-c",
        f"ls /dev | grep -E '^nvidia'; {smi_path} --query-gpu=uuid,name "
        "--format=csv,noheader; echo rc=$?",
    ]  # fmt: skip
    (bundle / "base.json").write_text(json.dumps(base))
    sh(cdi_harness(), "-spec-dir", str(tmp_path / "cdi"), "-base", str(bundle / "base.json"),
       "-out", str(bundle / "config.json"), *ids)  # fmt: skip
    out = sh(runc, "--root", str(tmp_path / "runc"), "run", "--bundle", str(bundle),
             f"gpu-{c.ref.uid[:8]}", timeout=120)  # fmt: skip
    record("container: ls /dev; nvidia-smi --query-gpu=uuid,name", out)
    assert f"{gpu.uuid}, {gpu.product_name}" in out
    assert "rc=0" in out
    others = {f"nvidia{g.minor}" for g in inventory.gpus} - {f"nvidia{gpu.minor}"}
    assert not others & set(out.split()), out


@pytest.mark.changes_gpu_settings
def test_time_slicing_is_set_and_restored(
    preparer: ClaimPreparer, inventory: Inventory, tools: GpuTools
) -> None:
    gpu = min(inventory.gpus, key=lambda g: g.minor)
    before = smi(tools, "compute-policy", "-l", "-i", str(gpu.index))
    sharing = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}
    c = real_claim(f"gpu-{gpu.minor}", sharing)
    preparer.prepare(c)
    during = smi(tools, "compute-policy", "-l", "-i", str(gpu.index))
    preparer.unprepare(c.ref)
    after = smi(tools, "compute-policy", "-l", "-i", str(gpu.index))
    record("compute-policy before / during (Long) / after", f"{before}\n{during}\n{after}")
    assert re.search(r"Timeslice\s+Long", during), during
    assert re.search(r"Timeslice\s+Default", after), after


@pytest.mark.changes_gpu_settings
def test_mps_daemon_serves_a_cuda_client_and_is_gone_after_unprepare(
    preparer: ClaimPreparer, inventory: Inventory, tools: GpuTools, tmp_path: Path,
    state_dir: Path,
) -> None:  # fmt: skip
    gpu = min(inventory.gpus, key=lambda g: g.minor)
    c = real_claim(f"gpu-{gpu.minor}", {"strategy": "MPS", "mpsConfig": {
        "defaultActiveThreadPercentage": 50,
        "defaultPinnedDeviceMemoryLimit": "10Gi"}})  # fmt: skip
    preparer.prepare(c)
    pipe, shm = mps_mounts(tmp_path / "cdi", c.ref.uid)
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": pipe}
    mode = compute_mode(tools, gpu.index)
    # A CUDA client through the claim's daemon, as a container would (its pipe and shm).
    client = Client("one", pipe, shm)
    try:
        allocated = client.alloc(1 / 1024) if client.up else None  # 1 MiB
        ctl = str(tools.mps_control)
        servers = subprocess.run([ctl], input="get_server_list\n", capture_output=True,
                                 text=True, env=env, timeout=30,
                                 check=False).stdout.split()  # fmt: skip
        assert servers, "no MPS server started for the client"
        pct = subprocess.run([ctl], input=f"get_active_thread_percentage {servers[0]}\n",
                             capture_output=True, text=True, env=env, timeout=30,
                             check=False).stdout  # fmt: skip
        limit = subprocess.run([ctl], input=f"get_device_pinned_mem_limit {servers[0]} 0\n",
                               capture_output=True, text=True, env=env, timeout=30,
                               check=False).stdout  # fmt: skip
    finally:
        client.close()
    record("MPS", f"compute mode during: {mode}\nclient: {client.hello} alloc 1 MiB: "
                  f"{allocated}\nservers: {servers}\nactive thread %: {pct}\n"
                  f"pinned limit dev 0: {limit}")  # fmt: skip
    assert client.up and allocated == 0, client.hello
    assert mode == "Exclusive_Process"
    assert float(pct.strip()) == 50.0
    preparer.unprepare(c.ref)
    assert_nothing_left(tools, gpu.index, state_dir, [pipe])
