"""The IMEX pieces of an emulated node's host tree (multi-node NVLink, ComputeDomains).

What a driver with IMEX support shows, and what the node side of ComputeDomains reads:

* ``proc/devices``: the ``nvidia-caps-imex-channels`` character-device major (dynamic on
  a real host; :data:`IMEX_CHANNELS_MAJOR` here), added by :func:`proc_devices_lines`;
* ``proc/driver/nvidia/params``: ``ImexChannelCount: 2048`` and ``CreateImexChannel0``
  (the module parameters; a lent H100 on driver 580 says ``0``; the emulation creates
  channel 0, as ``NVreg_CreateImexChannel0=1`` does);
* ``dev/nvidia-caps-imex-channels/channel0``: minor = channel number;
* the ``fabric-imex-mgmt`` capability the IMEX daemon opens:
  ``proc/driver/nvidia/capabilities/fabric-imex-mgmt`` (``DeviceFileMinor``) and its
  ``dev/nvidia-caps/nvidia-cap<minor>`` node (minor :data:`FABRIC_IMEX_MGMT_MINOR`,
  chosen above every MIG capability minor).

Workload containers get their channel from a CDI device node (type, major, minor), so
nothing here has to exist for a prepare; the files are what a real node has.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from dra_driver.gpu.host.hostpaths import HostPaths

IMEX_CHANNELS_MAJOR = 509
IMEX_CHANNEL_COUNT = 2048
FABRIC_IMEX_MGMT_MINOR = 4400
"""Above the last MIG capability minor (3 + 32 GPUs x 15 GIs x 9 = 4323)."""

Writer = Callable[[Path, str, int], None]
NodeMaker = Callable[[Path, int, int, bool, int], None]


def proc_devices_lines() -> str:
    """The ``/proc/devices`` line of the IMEX channel driver."""
    return f"{IMEX_CHANNELS_MAJOR} nvidia-caps-imex-channels\n"


def write_imex_files(host: HostPaths, char_nodes: bool, write: Writer, node: NodeMaker) -> None:
    """The module parameters, the fabric-imex-mgmt capability and channel 0."""
    write(
        host.proc("driver", "nvidia", "params"),
        "ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 1\n"
        f"ImexChannelCount: {IMEX_CHANNEL_COUNT}\nCreateImexChannel0: 1\n",
        0o444,
    )
    write(
        host.proc("driver", "nvidia", "capabilities", "fabric-imex-mgmt"),
        f"DeviceFileMinor: {FABRIC_IMEX_MGMT_MINOR}\nDeviceFileMode: 256\nDeviceFileModify: 1\n",
        0o444,
    )
    node(host.dev("nvidia-caps", f"nvidia-cap{FABRIC_IMEX_MGMT_MINOR}"),
         511, FABRIC_IMEX_MGMT_MINOR, char_nodes, 0o400)  # fmt: skip
    node(host.dev("nvidia-caps-imex-channels", "channel0"), IMEX_CHANNELS_MAJOR, 0, char_nodes,
         0o666)  # fmt: skip
