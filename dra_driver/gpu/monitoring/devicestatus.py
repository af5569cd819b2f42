"""What the claim status says about a prepared GPU or MIG device (KEP-4817 ``data``).

A workload finds its device by UUID (``CUDA_VISIBLE_DEVICES`` accepts GPU and
MIG UUIDs), PCI address or device node; an operator sees the board and the
health the health stream reports, so ``kubectl get resourceclaim -o yaml``
answers "which GPU did I get, and is it well".
"""

from __future__ import annotations

from typing import Any

from dra_driver.gpu.hardware.inventory import Gpu, Inventory, MigInstance
from dra_driver.gpu.hardware.naming import gpu_device_name, mig_device_name
from dra_driver.gpu.monitoring.health import Fault
from dra_driver.plugin.claimstatus import Condition, DeviceStatus
from dra_driver.plugin.resources import Device


def _find(inventory: Inventory, name: str) -> tuple[Gpu, MigInstance | None] | None:
    for gpu in inventory.gpus:
        if gpu.uuid and not gpu.mig_enabled and gpu_device_name(gpu) == name:
            return gpu, None
        for mig in gpu.mig_instances:
            if mig_device_name(mig) == name:
                return gpu, mig
    return None


def device_status(
    name: str, inventory: Inventory, published: Device | None, faults: list[Fault]
) -> DeviceStatus:
    found = _find(inventory, name)
    data: dict[str, Any] = {}
    if found is not None:
        gpu, mig = found
        uuid = mig.uuid if mig else gpu.uuid
        data = {
            "uuid": uuid,
            "cudaVisibleDevices": uuid,
            "productName": gpu.product_name,
            "pciBusID": gpu.pci.bus_id,
            "deviceNode": f"/dev/nvidia{gpu.minor}",
        }
        if mig is not None:
            data |= {"parentUUID": gpu.uuid, "migProfile": mig.profile.name,
                     "gpuInstanceID": mig.gi_id, "computeInstanceID": mig.ci_id}  # fmt: skip
    if published is None:
        healthy = Condition("Healthy", "Unknown", "NotPublished",
                            "the device is no longer published on this node")  # fmt: skip
    elif any(t.effect != "None" for t in published.taints):
        taints = ", ".join(f"{t.key}={t.value}:{t.effect}" for t in published.taints)
        details = "; ".join(f.message for f in faults)
        healthy = Condition("Healthy", "False", "DeviceTainted",
                            f"{taints}" + (f" ({details})" if details else ""))  # fmt: skip
    else:
        note = "; ".join(f.message for f in faults)
        healthy = Condition("Healthy", "True", "NoFaults" if not note else "Informational", note)
    return DeviceStatus(device=name, data=data, conditions=(healthy,))
