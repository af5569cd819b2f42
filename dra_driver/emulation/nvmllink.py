"""Emulated NVML: NVLink state and peers, GPU fabric (multi-node NVLink) membership.

A board's NVLink ports are numbered ``0 .. nvlinks-1``; a link bridged to a
peer GPU is active and its remote PCI info is the peer's, a GPU in a fabric
has every link active to an NVSwitch, and any other link is inactive. Boards
without NVLink answer ``NOT_SUPPORTED``; links past the last port
``INVALID_ARGUMENT``, which is how callers find the port count.
"""

from __future__ import annotations

import uuid
from typing import Any

from dra_driver.emulation.hardware import EmulatedGpu
from dra_driver.emulation.nvmlcore import (
    ERROR_ARGUMENT_VERSION_MISMATCH,
    ERROR_INVALID_ARGUMENT,
    ERROR_NOT_SUPPORTED,
    LibraryCore,
    Return,
    as_int,
    deref,
)

NVLINK_DEVICE_TYPE_GPU = 0
NVLINK_DEVICE_TYPE_SWITCH = 2
FABRIC_INFO_V2 = 0x02000024
FABRIC_INFO_V3 = 0x03000028
_SWITCH_BUS_ID = "0000:ff:00.0"  # what a link to an NVSwitch reports as its remote PCI address


class LinkCalls(LibraryCore):
    """C functions for NVLink and the GPU fabric."""

    def _link(self, handle: Any, link: Any) -> tuple[EmulatedGpu, int, int | None]:
        """``(gpu, link, peer slot or None)``; raises for boards or ports that do not exist."""
        gpu = self._gpu(handle)
        if not gpu.model.nvlinks:
            raise Return(ERROR_NOT_SUPPORTED)
        number = as_int(link)
        if number >= gpu.model.nvlinks:
            raise Return(ERROR_INVALID_ARGUMENT)
        return gpu, number, dict(gpu.nvlink_peers).get(number)

    def _c_nvmlDeviceGetNvLinkState(self, handle: Any, link: Any, active: Any) -> None:
        gpu, _, peer = self._link(handle, link)
        deref(active).value = int(peer is not None or gpu.fabric is not None)

    def _c_nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: Any, kind: Any) -> None:
        gpu, _, peer = self._link(handle, link)
        if peer is None and gpu.fabric is None:
            raise Return(ERROR_NOT_SUPPORTED)  # an inactive link has no remote end
        deref(kind).value = (
            NVLINK_DEVICE_TYPE_GPU if peer is not None else NVLINK_DEVICE_TYPE_SWITCH
        )

    def _c_nvmlDeviceGetNvLinkRemotePciInfo_v2(self, handle: Any, link: Any, pci: Any) -> None:
        gpu, _, peer = self._link(handle, link)
        if peer is None and gpu.fabric is None:
            raise Return(ERROR_NOT_SUPPORTED)
        bus_id = self.profile.gpus[peer].bus_id if peer is not None else _SWITCH_BUS_ID
        dom, bus, rest = bus_id.split(":")
        info = deref(pci)
        info.busIdLegacy = bus_id.upper().encode()
        info.busId = f"0000{bus_id}".upper().encode()
        info.domain, info.bus, info.device = int(dom, 16), int(bus, 16), int(rest.split(".")[0], 16)

    def _fill_fabric(self, handle: Any, out: Any) -> None:
        gpu = self._gpu(handle)
        if gpu.fabric is None:
            raise Return(ERROR_NOT_SUPPORTED)
        for i, byte in enumerate(uuid.UUID(gpu.fabric.cluster_uuid).bytes):
            out.clusterUuid[i] = byte
        out.status, out.cliqueId, out.state = 0, gpu.fabric.clique_id, gpu.fabric.state

    def _c_nvmlDeviceGetGpuFabricInfo(self, handle: Any, info: Any) -> None:
        self._fill_fabric(handle, deref(info))

    def _c_nvmlDeviceGetGpuFabricInfoV(self, handle: Any, info: Any) -> None:
        out = deref(info)
        if out.version not in (FABRIC_INFO_V2, FABRIC_INFO_V3):
            raise Return(ERROR_ARGUMENT_VERSION_MISMATCH)
        self._fill_fabric(handle, out)
        out.healthMask = 0
        if out.version == FABRIC_INFO_V3:
            out.healthSummary = 1  # NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY
