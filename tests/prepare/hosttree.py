"""A small hand-built host tree, emulated GPU tools and claim builders for prepare tests.

``hand_node`` is a hand-built host (``/proc/devices``, device nodes, MIG caps,
driver libraries) with an :class:`Inventory` written in the test, so the CDI
and sharing rules can be tested on exact, known values. The emulated GPU tools
are real executables that record what they were asked.
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from dra_driver.emulation import gputools
from dra_driver.gpu.hardware.consumable import MpsSlots
from dra_driver.gpu.hardware.inventory import (
    Gpu,
    Inventory,
    MigInstance,
    MigPlacement,
    MigProfile,
    PciInfo,
)
from dra_driver.gpu.host.hostpaths import HostPaths
from dra_driver.gpu.preparing import ClaimPreparer
from dra_driver.gpu.sharing.tools import GpuTools
from dra_driver.plugin.claims import AllocatedDevice, Claim, ClaimRef, OpaqueConfig

DRIVER = "gpu.nvidia.com"
VERSION = "580.95.05"
ENFORCING_VERSION = "615.20.01"
"""A driver branch on which MPS shares are enforced (fictional patch numbers)."""
PROC_DEVICES = """Character devices:
  1 mem
195 nvidia-frontend
195 nvidia
226 drm
508 nvidia-caps
511 nvidia-uvm

Block devices:
  8 sd
"""
PROFILE_1G = MigProfile("1g.10gb", 19, 0, 1, 10 << 30, 14, 1, 0, 0, 0, 0)


def _gpu(i: int, **kw: object) -> Gpu:
    return Gpu(
        index=i,
        minor=i,
        uuid=f"GPU-0000000{i}-1111-2222-3333-444444444444",
        product_name="NVIDIA A100-SXM4-80GB",
        brand="Nvidia",
        architecture="Ampere",
        cuda_compute_capability=(8, 0),
        memory_bytes=80 << 30,
        multiprocessors=108,
        pci=PciInfo(bus_id=f"0000:{0x10 + i:02x}:00.0"),
        **kw,  # type: ignore[arg-type]
    )


def _mig(parent: int, gi: int, start: int) -> MigInstance:
    return MigInstance(
        uuid=f"MIG-{parent}{gi}000000-aaaa-bbbb-cccc-dddddddddddd",
        profile=PROFILE_1G,
        gi_id=gi,
        ci_id=0,
        placement=MigPlacement(start, 1),
        parent_uuid=f"GPU-0000000{parent}-1111-2222-3333-444444444444",
        parent_index=parent,
        parent_minor=parent,
    )


def hand_inventory(count: int = 8) -> Inventory:
    """``count`` GPUs (at least 8); gpu-7 is in MIG mode with two 1g.10gb instances."""
    gpus = [_gpu(i) for i in range(7)]
    gpus.append(
        _gpu(7, mig_capable=True, mig_enabled=True, mig_instances=(_mig(7, 9, 2), _mig(7, 13, 6)))
    )
    gpus += [_gpu(i) for i in range(8, count)]
    return Inventory(driver_version=VERSION, cuda_driver_version=(13, 0), gpus=tuple(gpus))


# GI 9 -> cap minor 84, its CI 0 -> 85; GI 13 -> 120, CI -> 121 (as the kernel assigns).
MIG_CAPS = {9: (84, 85), 13: (120, 121)}


def build_host(root: Path, *, boot_id: str = "boot-1", gpus: int = 8) -> HostPaths:
    host = HostPaths(root=root, driver_root=root / "driver")
    host.proc().mkdir(parents=True)
    host.proc("devices").write_text(PROC_DEVICES)
    boot = host.proc("sys", "kernel", "random", "boot_id")
    boot.parent.mkdir(parents=True)
    boot.write_text(boot_id + "\n")
    host.dev().mkdir()
    for name in [
        "nvidiactl",
        "nvidia-uvm",
        "nvidia-uvm-tools",
        *(f"nvidia{i}" for i in range(gpus)),
    ]:
        host.dev(name).touch(mode=0o666)
        host.dev(name).chmod(0o666)
    for gi, (gi_minor, ci_minor) in MIG_CAPS.items():
        base = host.proc("driver", "nvidia", "capabilities", "gpu7", "mig", f"gi{gi}")
        (base / "ci0").mkdir(parents=True)
        (base / "access").write_text(f"DeviceFileMinor: {gi_minor}\nDeviceFileMode: 292\n")
        (base / "ci0" / "access").write_text(f"DeviceFileMinor: {ci_minor}\nDeviceFileMode: 292\n")
    lib = host.driver("usr", "lib", "x86_64-linux-gnu")
    lib.mkdir(parents=True)
    for name in ("libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler"):
        (lib / f"{name}.so.{VERSION}").write_bytes(b"\x7fELF emulated")
        (lib / f"{name}.so.1").symlink_to(f"{name}.so.{VERSION}")
    (lib / "libunrelated.so.2").write_bytes(b"not ours")
    fw = host.driver("lib", "firmware", "nvidia", VERSION)
    fw.mkdir(parents=True)
    (fw / "gsp_ga10x.bin").write_bytes(b"fw")
    return host


@dataclass
class Node:
    root: Path
    host: HostPaths
    inventory: Inventory
    record: Path
    tools: GpuTools
    cdi_dir: Path
    state_dir: Path
    preparers: list[ClaimPreparer] = field(default_factory=list)

    def preparer(self, **kw: object) -> ClaimPreparer:
        p = ClaimPreparer(
            driver_name=DRIVER,
            inventory=lambda: self.inventory,
            host=self.host,
            cdi_dir=self.cdi_dir,
            state_dir=self.state_dir,
            logger=logging.getLogger("test.prepare"),
            tools=self.tools,
            **kw,  # type: ignore[arg-type]
        )
        self.preparers.append(p)
        return p

    def calls(self, tool: str | None = None) -> list[dict[str, object]]:
        return [c for c in gputools.read_record(self.record) if tool is None or c["tool"] == tool]

    def mounts(self) -> list[str]:
        """Mount points under this node's root or state dir (MPS shm tmpfs), as this
        process sees them."""
        found = []
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].encode().decode("unicode_escape")
            if point.startswith((f"{self.root}/", f"{self.state_dir}/")):
                found.append(point)
        return found

    def live_daemons(self) -> list[int]:
        """Live emulated MPS processes started for this node (by record file)."""
        pids = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmd = (proc / "cmdline").read_bytes()
                state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            ours = b"nvidia-cuda-mps-control" in cmd and str(self.root).encode() in cmd
            if ours and state not in ("Z", "X"):
                pids.append(int(proc.name))
        return pids


STATE_PREFIX = f"st{os.getpid()}-"
"""Per test process: the cleanup fixture removes only its own run's dirs, never those of
another test run on the same machine."""


def state_dir_for(root: Path) -> Path:
    """``<root>/plugin``, resolved through a link to a short dir under /tmp.

    The MPS control daemon makes its sockets in ``<state>/mps/<id>/pipe`` and a unix
    socket path has 107 bytes; pytest's tmp paths are too long for that, as a real
    daemon would show (and :class:`MpsDaemons` refuses them up front).
    """
    link = root / "plugin"
    if not link.is_symlink():
        link.parent.mkdir(parents=True, exist_ok=True)
        # "s" itself is left to the tests, some of which expect no state dir yet.
        link.symlink_to(Path(tempfile.mkdtemp(prefix=STATE_PREFIX, dir="/tmp")) / "s")
    return link.resolve()


def make_node(root: Path, *, gpus: int = 8) -> Node:
    host = build_host(root, gpus=gpus)
    record = root / "gputools.jsonl"
    paths = gputools.install(host.driver("usr", "bin"), record)
    tools = GpuTools(
        nvidia_smi=paths[gputools.NVIDIA_SMI],
        mps_control=paths[gputools.MPS_CONTROL],
        timeout_s=10,
    )
    return Node(
        root=root,
        host=host,
        inventory=hand_inventory(gpus),
        record=record,
        tools=tools,
        cdi_dir=root / "run" / "cdi",
        state_dir=state_dir_for(root),
    )


def claim(
    uid: str = "0a1b2c3d-0000-4000-8000-000000000001",
    devices: list[tuple[str, str]] | None = None,
    configs: list[OpaqueConfig] | None = None,
    admin: bool = False,
    name: str = "c1",
) -> Claim:
    devs = devices if devices is not None else [("gpu", "gpu-0")]
    return Claim(
        ref=ClaimRef(namespace="ns", name=name, uid=uid),
        devices=tuple(
            AllocatedDevice(request=r, pool="node-a", device=d, admin_access=admin) for r, d in devs
        ),
        configs=tuple(configs or ()),
    )


def gpu_config(
    sharing: dict[str, object] | None,
    *,
    source: str = "FromClaim",
    requests: tuple[str, ...] = (),
    kind: str = "GpuConfig",
) -> OpaqueConfig:
    params: dict[str, object] = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": kind}
    if sharing is not None:
        params["sharing"] = sharing
    return OpaqueConfig(source=source, requests=requests, parameters=params)  # type: ignore[arg-type]


def open_node(root: Path, *, gpus: int = 8) -> Node:
    """The node :func:`make_node` built at ``root``, as a restarted process sees it."""
    host = HostPaths(root=root, driver_root=root / "driver")
    bin_dir = host.driver("usr", "bin")
    return Node(
        root=root,
        host=host,
        inventory=hand_inventory(gpus),
        record=root / "gputools.jsonl",
        tools=GpuTools(
            nvidia_smi=bin_dir / gputools.NVIDIA_SMI,
            mps_control=bin_dir / gputools.MPS_CONTROL,
            timeout_s=10,
        ),
        cdi_dir=root / "run" / "cdi",
        state_dir=state_dir_for(root),
    )


def share_claim(
    uid: str,
    *,
    namespace: str = "ns",
    name: str = "share",
    device: str = "gpu-2",
    memory: str = "20Gi",
    compute: str = "0",
    share_id: str | None = None,
    configs: list[OpaqueConfig] | None = None,
) -> Claim:
    """A claim holding one share of a consumable GPU, as the scheduler allocates it."""
    return Claim(
        ref=ClaimRef(namespace=namespace, name=name, uid=uid),
        devices=(
            AllocatedDevice(
                request="gpu",
                pool="node-a",
                device=device,
                share_id=share_id or f"5e5e{uid[4:]}",
                consumed_capacity={"memory": memory, "computeShare": compute},
            ),
        ),
        configs=tuple(configs or ()),
    )


SLOT_GPU = "GPU-00000002-1111-2222-3333-444444444444"
SLOTS = MpsSlots.parse(f"{SLOT_GPU}=4")
"""gpu-2 (80 GiB) split into 4 MPS slots of 20 GiB and 25 % (``--mps-slots``)."""


def slot_claim(
    uid: str,
    *,
    namespace: str = "ns",
    name: str = "slot",
    device: str = "gpu-2",
    configs: list[OpaqueConfig] | None = None,
) -> Claim:
    """A claim holding one slot of a :data:`SLOTS` GPU, as the scheduler allocates it (the
    policy's default: the claim asks for no capacity)."""
    return share_claim(
        uid,
        namespace=namespace,
        name=name,
        device=device,
        memory="20Gi",
        compute="25",
        configs=configs,
    )
