"""What the node tells the compute-domain plugin: its clique, the IMEX channel driver's
major number, the fabric-imex-mgmt capability and where ``nvidia-imex`` is.

Read once at start (and on SIGHUP): a driver reload changes the dynamic majors, a fabric
manager registration changes the clique.
"""

from __future__ import annotations

from dataclasses import dataclass

from dra_driver.errors import DriverError
from dra_driver.gpu.hardware.nvml import Nvml, NvmlError
from dra_driver.gpu.hardware.topology import fabric_membership
from dra_driver.gpu.host.hostpaths import BIN_DIRS, HostPaths

CHANNELS_DRIVER = "nvidia-caps-imex-channels"
CAPS_DRIVER = "nvidia-caps"
IMEX_BINARY = "nvidia-imex"


class HostInfoError(DriverError):
    """The node's GPUs disagree about their clique."""


@dataclass(frozen=True)
class ImexHost:
    clique_id: str
    """``<cluster UUID>.<clique id>`` of every GPU; "" when they are in no clique."""
    channels_major: int | None
    """None: the driver has no IMEX channels (too old, or not loaded): nothing to publish."""
    caps_major: int | None = None
    imex_mgmt_minor: int | None = None
    """Minor of ``/dev/nvidia-caps/nvidia-cap<minor>``, the capability nvidia-imex opens."""
    imex_bin_dir: str | None = None
    """Dir under the driver root holding ``nvidia-imex`` (relative), None when not installed."""


def char_majors(host: HostPaths) -> dict[str, int]:
    """Character-device driver name -> major, from ``/proc/devices``."""
    out: dict[str, int] = {}
    try:
        text = host.proc("devices").read_text()
    except OSError:
        return out
    for line in text.split("\n\n", 1)[0].splitlines()[1:]:
        number, _, name = line.strip().partition(" ")
        if number.isdigit():
            out[name.strip()] = int(number)
    return out


def imex_mgmt_minor(host: HostPaths) -> int | None:
    try:
        text = host.proc("driver", "nvidia", "capabilities", "fabric-imex-mgmt").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "DeviceFileMinor" and value.strip().isdigit():
            return int(value.strip())
    return None


def clique_id(nvml: Nvml) -> str:
    """The clique every GPU of the node is registered in, "" when none is; mixed: an error.
    A GPU without fabric info (NVML answers NOT_SUPPORTED before Hopper) is in none."""
    cliques = set()
    for i in range(nvml.device_count()):
        try:
            member = fabric_membership(nvml, nvml.handle_by_index(i))
        except NvmlError as exc:
            if not exc.not_supported:
                raise HostInfoError(f"GPU {i}: reading its fabric info: {exc}") from exc
            member = None
        cliques.add("" if member is None else f"{member.cluster_uuid}.{member.clique_id}")
    if len(cliques) > 1:
        raise HostInfoError(f"the node's GPUs are in different cliques {sorted(cliques)}; a "
                            "ComputeDomain node is in one clique")  # fmt: skip
    return cliques.pop() if cliques else ""


def read_host(host: HostPaths, nvml: Nvml) -> ImexHost:
    """Everything at once; NVML must be initialised."""
    majors = char_majors(host)
    bin_dir = next((d for d in BIN_DIRS if host.driver(d, IMEX_BINARY).is_file()), None)
    return ImexHost(
        clique_id=clique_id(nvml),
        channels_major=majors.get(CHANNELS_DRIVER),
        caps_major=majors.get(CAPS_DRIVER),
        imex_mgmt_minor=imex_mgmt_minor(host),
        imex_bin_dir=bin_dir,
    )
