"""Inventory -> the devices a node publishes (plugin :class:`Pool`), NVIDIA-compatible.

Attribute and capacity names follow NVIDIA's ``gpu.nvidia.com`` driver so
claims and DeviceClasses written for it work unchanged: ``type``, ``uuid``,
``productName``, ``brand``, ``architecture``, semver ``cudaComputeCapability``,
``driverVersion`` and ``cudaDriverVersion``, ``resource.kubernetes.io/pciBusID``
and ``.../pcieRoot``; MIG devices add ``profile`` and ``parentUUID`` and the
capacities ``multiprocessors``, ``copyEngines``, ``decoders``, ``encoders``,
``jpegEngines``, ``ofaEngines``, ``memory`` and ``memorySlice<i>`` (static MIG).
Beyond NVIDIA, what users asked for: ``numaNode``, ``index``, ``minor``,
``migCapable``, ``pcieGeneration``, ``pcieLinkWidth`` and ``multiprocessors``
capacity on full GPUs (MIG devices carry ``numaNode`` too). Facts discovery
could not read are left out rather than published as a guess.

Kubernetes 1.37 standard attributes and topology:

* ``resource.kubernetes.io/numaNode`` (KEP-6072) beside our ``numaNode``, so one
  claim can line GPUs up with NICs and CPUs of other drivers: ``scalar`` form
  (int, the default) or ``list`` form (``ints``: the NUMA nodes the GPU is
  equally close to, for clusters with DRAListTypeAttributes; ``matchAttribute``
  then matches by intersection). Chosen by configuration, not by probing.
* ``nvlinkDomain`` (string) on full GPUs in an NVLink domain (bridged pairs or a
  fabric clique, see :mod:`dra_driver.gpu.hardware.topology`), with ``fabricClusterUUID``
  and ``fabricCliqueID`` for fabric members: ``matchAttribute: gpu.nvidia.com/
  nvlinkDomain`` keeps a multi-GPU claim on one domain. MIG devices get none
  (MIG instances cannot use NVLink peer-to-peer).

Decisions:

* Static MIG (the default): a GPU in MIG mode publishes its MIG devices, not
  itself. In MIG mode CUDA runs only inside MIG devices; the full GPU is not
  usable as one device, and offering both would let the scheduler hand out the
  same memory slices twice. A MIG-mode GPU without instances therefore
  publishes nothing.
* Dynamic MIG (``mig_mode="dynamic"``): a GPU in MIG mode publishes a counter
  set and every profile x placement that fits (:mod:`dra_driver.gpu.hardware.partitions`);
  dynamic devices have no ``uuid`` until prepared. The whole GPU (``gpu-<minor>``,
  type ``gpu``, its own ``uuid``) adds ``profile``: it is prepared as that
  full-GPU instance (``7g.80gb``), whose memory and SMs it publishes.
* Degraded GPUs (an essential NVML/sysfs query failed, or the GPU is lost) are
  left out of the pool by default: the scheduler can never pick them, even on
  clusters without the DRADeviceTaints gate (where a taint would be silently
  dropped). With ``taint_degraded=True`` they are published with a
  ``<driver>/degraded`` NoSchedule taint instead (when their identity is known),
  which makes the fault visible in the API at the cost of needing the gate.
* Versions are strict semver: each numeric part loses leading zeros
  (driver ``580.95.05`` -> ``580.95.5``), ``major.minor`` gets ``.0``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection, Mapping
from typing import Literal

from dra_driver.gpu.hardware.inventory import Gpu, Inventory, MigInstance, MigProfile
from dra_driver.gpu.hardware.naming import gpu_device_name, mig_device_name
from dra_driver.gpu.hardware.partitions import (
    MigMode,
    MigPartition,
    OwnedInstance,
    PlacementAttributes,
    available,
    binding_counters,
    counter_set_name,
    foreign_instances,
)
from dra_driver.gpu.hardware.topology import nvlink_domains
from dra_driver.plugin.resources import (
    AttributeValue,
    Capacity,
    CounterConsumption,
    CounterSet,
    Device,
    DeviceTaint,
    ListValue,
    Pool,
    Version,
)

Owned = Collection[OwnedInstance]

PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
STD_NUMA_NODE = "resource.kubernetes.io/numaNode"
NumaAttributeForm = Literal["scalar", "list"]
NUMA_ATTRIBUTE_FORMS: tuple[NumaAttributeForm, ...] = ("scalar", "list")
_DECIMAL_SUFFIXES = ("", "k", "M", "G", "T", "P", "E")
_BINARY_SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


def semver(*parts: int | str) -> Version:
    """A strict semver from numeric parts, padded to three: ``(8, 0)`` -> ``8.0.0``."""
    numbers = [int(p) for p in parts][:3]
    numbers += [0] * (3 - len(numbers))
    return Version(".".join(str(n) for n in numbers))


def driver_semver(version: str) -> Version:
    """``580.95.05`` -> ``580.95.5`` (semver forbids leading zeros); non-digits are ignored."""
    return semver(*re.findall(r"\d+", version)[:3])


def quantity(value: int, *, binary: bool = False) -> str:
    """The canonical Kubernetes quantity string, so the API server returns it unchanged.

    Bytes use binary suffixes when a power of 1024 divides them (``80Gi``,
    ``9728Mi``); counts use decimal suffixes (``108``, ``2k``).
    """
    if value == 0:
        return "0"
    if binary and value % 1024 == 0:
        exponent = 0
        while value % 1024 == 0 and exponent < len(_BINARY_SUFFIXES) - 1:
            value //= 1024
            exponent += 1
        return f"{value}{_BINARY_SUFFIXES[exponent]}"
    exponent = 0
    while value % 1000 == 0 and exponent < len(_DECIMAL_SUFFIXES) - 1:
        value //= 1000
        exponent += 1
    return f"{value}{_DECIMAL_SUFFIXES[exponent]}"


def _common(
    gpu: Gpu, inventory: Inventory, numa_form: NumaAttributeForm = "scalar"
) -> dict[str, AttributeValue]:
    """Attributes a full GPU and its MIG devices share (NVIDIA publishes these on both)."""
    attrs: dict[str, AttributeValue] = {
        "productName": gpu.product_name,
        "brand": gpu.brand,
        "architecture": gpu.architecture,
        "cudaComputeCapability": semver(*gpu.cuda_compute_capability),
        "driverVersion": driver_semver(inventory.driver_version),
        "cudaDriverVersion": semver(*inventory.cuda_driver_version),
        PCI_BUS_ID: gpu.pci.bus_id,
    }
    if gpu.pci.pcie_root is not None:
        attrs[PCIE_ROOT] = gpu.pci.pcie_root
    if gpu.pci.numa_node is not None:
        attrs["numaNode"] = gpu.pci.numa_node
        if numa_form == "list":
            attrs[STD_NUMA_NODE] = ListValue(gpu.pci.numa_affinity or (gpu.pci.numa_node,))
        else:
            attrs[STD_NUMA_NODE] = gpu.pci.numa_node
    return attrs


def gpu_device(
    gpu: Gpu,
    inventory: Inventory,
    numa_form: NumaAttributeForm = "scalar",
    nvlink_domain: str | None = None,
) -> Device:
    attrs: dict[str, AttributeValue] = {
        "type": "gpu",
        "uuid": gpu.uuid,
        **_common(gpu, inventory, numa_form),
        "index": gpu.index,
        "minor": gpu.minor,
        "migCapable": gpu.mig_capable,
    }
    if nvlink_domain is not None:
        attrs["nvlinkDomain"] = nvlink_domain
    if gpu.fabric is not None:
        attrs["fabricClusterUUID"] = gpu.fabric.cluster_uuid
        attrs["fabricCliqueID"] = gpu.fabric.clique_id
    if gpu.pci.pcie_generation is not None:
        attrs["pcieGeneration"] = gpu.pci.pcie_generation
    if gpu.pci.pcie_link_width is not None:
        attrs["pcieLinkWidth"] = gpu.pci.pcie_link_width
    capacity = {"memory": Capacity(quantity(gpu.memory_bytes, binary=True))}
    if gpu.multiprocessors:
        capacity["multiprocessors"] = Capacity(quantity(gpu.multiprocessors))
    return Device(name=gpu_device_name(gpu), attributes=attrs, capacity=capacity)


def mig_device(
    mig: MigInstance, gpu: Gpu, inventory: Inventory, numa_form: NumaAttributeForm = "scalar"
) -> Device:
    p = mig.profile
    attrs: dict[str, AttributeValue] = {
        "type": "mig",
        "uuid": mig.uuid,
        "parentUUID": mig.parent_uuid,
        "profile": p.name,
        **_common(gpu, inventory, numa_form),
    }
    capacity = _mig_figures(p)
    for memory_slice in range(mig.placement.start, mig.placement.start + mig.placement.size):
        capacity[f"memorySlice{memory_slice}"] = Capacity("1")
    return Device(name=mig_device_name(mig), attributes=attrs, capacity=capacity)


def _mig_figures(p: MigProfile) -> dict[str, Capacity]:
    return {
        "memory": Capacity(quantity(p.memory_bytes, binary=True)),
        "multiprocessors": Capacity(quantity(p.multiprocessors)),
        "copyEngines": Capacity(quantity(p.copy_engines)),
        "decoders": Capacity(quantity(p.decoders)),
        "encoders": Capacity(quantity(p.encoders)),
        "jpegEngines": Capacity(quantity(p.jpeg_engines)),
        "ofaEngines": Capacity(quantity(p.ofa_engines)),
    }


COMPACT_DROPS = ("brand", "architecture", "driverVersion", "cudaDriverVersion", "numaNode")
"""Left off dynamic MIG devices with ``compact`` placement attributes. Each placement
repeats its GPU's attributes; the control plane keeps every device's attributes in a Go
map, whose memory doubles past 8 entries (kube-apiserver keeps two copies): 13 -> 8
takes the slices' heap in kube-apiserver, scheduler and controller manager to 0.72x of
``full`` (0.67x of what stop 39 published; docs/scale.md). What goes is implied by
what stays: ``brand`` (always Nvidia) and ``architecture`` by ``productName`` and
``cudaComputeCapability``, both driver versions are the node's (the whole GPU device
still carries them), ``numaNode`` by ``resource.kubernetes.io/numaNode``. A claim that
reads one of them on such a device fails to schedule with a CEL "no such key" error, so
this is opt-in."""


def partition_device(
    part: MigPartition,
    inventory: Inventory,
    numa_form: NumaAttributeForm = "scalar",
    counters: Collection[str] | None = None,
    placement_attributes: PlacementAttributes = "full",
) -> Device:
    """A dynamic MIG device: the static device's attributes (no UUID yet) plus the
    ``counters`` it consumes (default all; :func:`binding_counters` says which matter).

    No ``memorySlice<i>`` capacities (NVIDIA's dynamic devices have none either): the
    memory-slice counters already say where it sits, and each entry costs every
    control-plane component memory on every node.
    """
    gpu = part.parent
    use = (
        CounterConsumption(
            counter_set_name(gpu),
            {
                c: _counter_quantity(c, v)
                for c, v in sorted(part.consumes().items())
                if counters is None or c in counters
            },
        ),
    )
    if part.whole_gpu:  # no nvlinkDomain: in MIG mode there is no NVLink peer-to-peer
        # Prepared as the full instance: its profile, memory and SMs are what a pod gets.
        device = gpu_device(gpu, inventory, numa_form)
        named = {**device.attributes, "profile": part.profile.name}
        capacity = dict(device.capacity)
        capacity["memory"] = Capacity(quantity(part.profile.memory_bytes, binary=True))
        capacity["multiprocessors"] = Capacity(quantity(part.profile.multiprocessors))
        return Device(name=part.name, attributes=named, capacity=capacity,
                      consumes_counters=use)  # fmt: skip
    attrs: dict[str, AttributeValue] = {
        "type": "mig",
        "parentUUID": gpu.uuid,
        "profile": part.profile.name,
        **_common(gpu, inventory, numa_form),
    }
    if placement_attributes == "compact":
        attrs = {k: v for k, v in attrs.items() if k not in COMPACT_DROPS}
    capacity = _mig_figures(part.profile)
    return Device(name=part.name, attributes=attrs, capacity=capacity, consumes_counters=use)


def _counter_quantity(counter: str, value: int) -> str:
    return quantity(value, binary=counter == "memory")


def gpu_devices(
    gpu: Gpu,
    inventory: Inventory,
    numa_form: NumaAttributeForm = "scalar",
    nvlink_domain: str | None = None,
    mig_mode: MigMode = "static",
    owned: Owned = (),
    placement_attributes: PlacementAttributes = "full",
) -> tuple[list[Device], list[CounterSet]]:
    """What one healthy GPU contributes: itself, or in MIG mode its MIG devices (static)
    or its counter set and every partition that fits, plus others' instances (dynamic)."""
    if not gpu.mig_enabled:
        return [gpu_device(gpu, inventory, numa_form, nvlink_domain)], []
    if mig_mode == "static":
        return [mig_device(m, gpu, inventory, numa_form) for m in gpu.mig_instances], []
    offer = available(gpu, owned)
    foreign = {(g.gi_id, g.placement.start) for g in foreign_instances(gpu, owned)}
    devices = [
        mig_device(m, gpu, inventory, numa_form)
        for m in gpu.mig_instances
        if (m.gi_id, m.placement.start) in foreign
    ]
    keep = binding_counters(offer)
    devices += [
        partition_device(part, inventory, numa_form, keep, placement_attributes)
        for part in offer.partitions
    ]
    if not offer.partitions:  # fully taken by others' instances: no counters to share
        return devices, []
    counters = {c: _counter_quantity(c, v) for c, v in sorted(offer.counters.items()) if c in keep}
    return devices, [CounterSet(counter_set_name(gpu), counters)]


def _identified(gpu: Gpu) -> bool:
    return bool(gpu.uuid and gpu.minor >= 0 and gpu.pci.bus_id)


def build_pool(
    inventory: Inventory,
    *,
    driver_name: str,
    taint_degraded: bool = False,
    numa_attribute_form: NumaAttributeForm = "scalar",
    taints: Mapping[str, tuple[DeviceTaint, ...]] | None = None,
    mig_mode: MigMode = "static",
    owned: Owned = (),
    placement_attributes: PlacementAttributes = "full",
) -> Pool:
    """The node's pool; device order (by minor) is the scheduler's first-fit preference.

    ``taints`` (device name -> taints) come from the health monitor's state.
    ``owned`` lists the GPU instances this driver created (dynamic MIG): they are
    the partitions' own, not foreign instances to work around.
    ``placement_attributes``: what dynamic MIG devices carry (:data:`COMPACT_DROPS`).
    """
    devices: list[Device] = []
    counter_sets: list[CounterSet] = []
    degraded = DeviceTaint(key=f"{driver_name}/degraded", value="nvml-error", effect="NoSchedule")
    domains = nvlink_domains(inventory.gpus)
    health = taints or {}
    for gpu in sorted(inventory.gpus, key=lambda g: (g.minor, g.index)):
        if gpu.degraded and not (taint_degraded and _identified(gpu)):
            continue
        found, sets = gpu_devices(
            gpu, inventory, numa_attribute_form, domains.get(gpu.uuid), mig_mode, owned,
            placement_attributes,
        )  # fmt: skip
        for d in found:
            extra = ((degraded,) if gpu.degraded else ()) + health.get(d.name, ())
            devices.append(dataclasses.replace(d, taints=extra))
        counter_sets += sets
    return Pool(devices=tuple(devices), counter_sets=tuple(counter_sets))
