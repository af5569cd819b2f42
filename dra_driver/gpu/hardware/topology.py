"""Where a GPU sits: NUMA affinity, NVLink peers, GPU fabric (multi-node NVLink) membership.

Discovery reads these facts per GPU (:func:`numa_affinity`, :func:`nvlink_info`,
:func:`fabric_membership`); :func:`nvlink_domains` then groups the node's GPUs
into NVLink domains, which devices publish so a multi-GPU claim can
``matchAttribute`` on one domain:

* a GPU registered in a fabric (NVML fabric state *completed*, status success)
  is in the domain ``<cluster UUID>.<clique ID>``, shared with every GPU of that
  clique, on this node or another (the fabric manager's partition);
* GPUs joined by NVLink bridges (PCIe boards) form one domain per connected
  group, named after the group's lowest PCI address (``nvlink-0000:21:00.0``),
  unique on the node;
* a GPU with no active NVLink has no domain: claims matching on it skip it.

Links to NVSwitches without fabric information (a single-node NVSwitch board
whose NVML predates fabric info) give no domain: which GPUs share the switches
is not known from NVML alone, and the attribute is never published on a guess.
"""

from __future__ import annotations

from collections.abc import Iterable

from dra_driver.gpu.hardware.inventory import FabricMembership, Gpu, NvLinkInfo
from dra_driver.gpu.hardware.nvml import Handle, Nvml
from dra_driver.gpu.hardware.nvmlmonitor import FABRIC_STATE_COMPLETED
from dra_driver.gpu.host.hostpaths import HostPaths

_NODE_LOCAL_PREFIX = "nvlink-"


def numa_affinity(host: HostPaths, node: int) -> tuple[int, ...]:
    """The NUMA nodes a device on ``node`` is equally close to, from the SLIT table.

    That is ``node`` plus every node at the smallest distance to it, when that
    distance is less than the largest (other nodes of the same socket on an
    NPS4/SNC system); on a plain two-socket system it is ``node`` alone.
    """
    text = host.sys("devices", "system", "node", f"node{node}", "distance").read_text()
    distances = [int(v) for v in text.split()]
    others = [d for i, d in enumerate(distances) if i != node]
    if not others or min(others) >= max(others):
        return (node,)
    nearest = min(others)
    return tuple(i for i, d in enumerate(distances) if i == node or d == nearest)


def nvlink_info(nvml: Nvml, handle: Handle) -> NvLinkInfo | None:
    """Active NVLinks, or None when the GPU has none (or no NVLink at all)."""
    links = nvml.nvlinks(handle)
    if not links:
        return None
    peers = sorted({_bus_id(link.remote_bus_id) for link in links if link.remote_is_gpu})
    return NvLinkInfo(
        active_links=len(links),
        gpu_peers=tuple(peers),
        switch_links=sum(not link.remote_is_gpu for link in links),
    )


def fabric_membership(nvml: Nvml, handle: Handle) -> FabricMembership | None:
    """The GPU's fabric clique once the fabric manager registered it; None otherwise."""
    info = nvml.fabric_info(handle)
    if info.state != FABRIC_STATE_COMPLETED or info.status != 0:
        return None
    if info.cluster_uuid == "00000000-0000-0000-0000-000000000000":
        return None
    return FabricMembership(cluster_uuid=info.cluster_uuid, clique_id=info.clique_id)


def _bus_id(nvml_bus_id: str) -> str:
    domain, _, rest = nvml_bus_id.strip().lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}"


def nvlink_domains(gpus: Iterable[Gpu]) -> dict[str, str]:
    """GPU UUID -> NVLink domain, for the GPUs that are in one (see the module docstring)."""
    gpus = list(gpus)
    domains: dict[str, str] = {}
    by_bus = {g.pci.bus_id: g for g in gpus if g.pci.bus_id}
    parent = {bus: bus for bus in by_bus}

    def root(bus: str) -> str:
        while parent[bus] != bus:
            parent[bus] = parent[parent[bus]]
            bus = parent[bus]
        return bus

    for g in gpus:
        if g.fabric is not None:
            domains[g.uuid] = f"{g.fabric.cluster_uuid}.{g.fabric.clique_id}"
        elif g.nvlink is not None and g.pci.bus_id in parent:
            for peer in g.nvlink.gpu_peers:
                if peer in parent:
                    a, b = root(g.pci.bus_id), root(peer)
                    parent[max(a, b)] = min(a, b)
    for g in gpus:
        if g.uuid in domains or g.nvlink is None or not g.nvlink.gpu_peers:
            continue
        if g.pci.bus_id in parent:
            domains[g.uuid] = _NODE_LOCAL_PREFIX + root(g.pci.bus_id)
    return domains
