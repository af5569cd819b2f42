"""The CDI specs of ComputeDomain claims: pure functions of the claim and the node.

A workload's channel claim gives its containers ``/dev/nvidia-caps-imex-channels/
channel0`` (``Single``) or every channel the driver creates (``All``: 0..2047) as
character devices with their major and minor, so the runtime creates them in the
container whether or not the host has the node (the driver creates channel 0 only
with ``NVreg_CreateImexChannel0=1``). A daemon claim gives the IMEX daemon its
domain's host directory at :data:`IMEX_DIR` (config, nodes file, state: it survives a
daemon container restart), ``DOMAIN_UID``/``CLIQUE_ID``, the driver's bin dir holding
``nvidia-imex`` at :data:`IMEX_BIN_MOUNT` (``IMEX_BIN_DIR``), and the fabric-imex-mgmt
capability device when the driver has one.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dra_driver.computedomain import names
from dra_driver.computedomain.names import CHANNEL_DIR, MAX_CHANNELS
from dra_driver.computedomain.node.config import ChannelConfig
from dra_driver.computedomain.node.hostinfo import ImexHost
from dra_driver.gpu.cdi.spec import CdiDevice, ContainerEdits, DeviceNode, Mount, Spec

IMEX_DIR = "/etc/nvidia-imex"
IMEX_BIN_MOUNT = "/imex-bin"
_BIND_RW = ("rw", "nosuid", "nodev", "rbind")
_BIND_RO = ("ro", "nosuid", "nodev", "rbind")


def channel_numbers(config: ChannelConfig) -> range:
    return range(MAX_CHANNELS) if config.allocation_mode == "All" else range(1)


def channel_spec(kind: str, device_name: str, config: ChannelConfig, major: int) -> Spec:
    nodes = tuple(
        DeviceNode(
            path=f"{CHANNEL_DIR}/channel{n}", type="c", major=major, minor=n, file_mode=0o666
        )
        for n in channel_numbers(config)
    )
    return Spec(kind=kind, devices=(CdiDevice(device_name, ContainerEdits(device_nodes=nodes)),))


def daemon_clique(host: ImexHost, node_name: str) -> str:
    """The daemon's clique: the node's, or :func:`~dra_driver.computedomain.names.no_clique_id`
    (a one-node clique) without one."""
    return host.clique_id or names.no_clique_id(node_name)


def daemon_spec(
    kind: str,
    device_name: str,
    *,
    domain_id: str,
    domain_dir: Path,
    host: ImexHost,
    node_name: str,
    runtime_driver_root: Path,
    extra_mounts: Sequence[str] = (),
) -> Spec:
    """``runtime_driver_root``: the driver root as the container runtime sees it.
    ``extra_mounts``: host paths mounted at the same place (an emulated node's root)."""
    env = [f"DOMAIN_UID={domain_id}", f"CLIQUE_ID={daemon_clique(host, node_name)}"]
    mounts = [Mount(str(domain_dir), IMEX_DIR, _BIND_RW)]
    if host.imex_bin_dir is not None:
        env.append(f"IMEX_BIN_DIR={IMEX_BIN_MOUNT}")
        mounts.append(Mount(str(runtime_driver_root / host.imex_bin_dir), IMEX_BIN_MOUNT, _BIND_RO))
    mounts += [Mount(p, p, _BIND_RW) for p in extra_mounts]
    nodes: tuple[DeviceNode, ...] = ()
    if host.caps_major is not None and host.imex_mgmt_minor is not None:
        nodes = (
            DeviceNode(path=f"/dev/nvidia-caps/nvidia-cap{host.imex_mgmt_minor}", type="c",
                       major=host.caps_major, minor=host.imex_mgmt_minor, file_mode=0o400),
        )  # fmt: skip
    edits = ContainerEdits(env=tuple(env), device_nodes=nodes, mounts=tuple(mounts))
    return Spec(kind=kind, devices=(CdiDevice(device_name, edits),))
