"""The trace's cluster on a started control plane: hand-made Ready nodes with the
trace's CPU and memory, and each GPU node's slices as the driver builds them.

Per node shape (GPU model, GPU count) an emulator profile is written and the driver's
own discovery and pool building run once on it (:func:`bench.fleet.pools.node_pool`:
``build_pool``, then ``fractional_pool`` with ``--consumable-gpus all`` for the
``consumable`` mode); the pool is published for every node of that shape through the
plugin's publisher (:func:`bench.fleet.pools.publish`). CPU-only nodes publish nothing.

GPU models: the trace's codes map to emulator models in ``models.yaml`` (:data:`MODELS`).
``G1``/``G2``/``G3`` are undisclosed internal boards: they get a stand-in, the figures
of :data:`STAND_IN` (A100 80GB PCIe) without MIG, under their own product name
(``Alibaba G2 (stand-in)``), so ``gpu_spec`` can still tell them apart. The stand-in's
figures do not change an allocation rate: every share is a fraction of its GPU.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml

from bench.fleet.pools import DriverFlags, api_devices, node_pool, publish
from bench.trace_replay.trace import TraceNode
from dra_driver.devcluster import Cluster
from dra_driver.gpu.hardware.consumable import ConsumableGpus
from dra_driver.plugin.kubeclient import KubeClient
from dra_driver.quantity import parse

Mode = Literal["whole", "consumable"]
MODES: tuple[Mode, ...] = ("whole", "consumable")
LATER_MODES = ("slots", "time-slicing", "mig")
"""Named by the issue, refused for now with a clear error."""

MODELS = {
    "T4": "T4",
    "P100": "P100-PCIE-16GB",
    "V100M16": "V100-SXM2-16GB",
    "V100M32": "V100-SXM2-32GB",
    "A10": "A10",
}
STAND_INS = ("G1", "G2", "G3")
STAND_IN = "A100-PCIE-80GB"
POD_CAPACITY = "1000"
"""Pods per node: far above what a node's CPU admits, so only CPU, memory and GPUs
limit placement, as in the paper's simulator."""
MODEL_LABEL = "trace-replay.dra.example/gpu-model"

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuModel:
    """What a trace model code became in the slices."""

    code: str
    product_name: str
    memory_bytes: int


@dataclass(frozen=True)
class Fleet:
    """The built cluster: its nodes and the GPU models published."""

    nodes: tuple[TraceNode, ...]
    models: dict[str, GpuModel]
    """Trace model code -> what its devices publish."""
    gpus: int


def _stand_in_models() -> dict[str, Any]:
    text = resources.files("dra_driver.emulation").joinpath("profiles", "models.yaml")
    base = dict(yaml.safe_load(text.read_text())[STAND_IN])
    base.pop("migProfiles", None)
    return {code: {**base, "productName": f"Alibaba {code} (stand-in)"} for code in STAND_INS}


def profile_yaml(code: str, gpus: int) -> str:
    """An emulator profile of one node of ``gpus`` GPUs of trace model ``code``."""
    if code not in MODELS and code not in STAND_INS:
        known = sorted([*MODELS, *STAND_INS])
        raise ValueError(f"GPU model {code!r} of the node list is unknown; known: {known}")
    profile: dict[str, Any] = {
        "name": f"trace-{code.lower()}-x{gpus}",
        "driverVersion": "580.95.05",
        "cudaDriverVersion": 13000,
        "gpus": [
            {
                "model": MODELS.get(code, code),
                "busId": f"0000:{0x10 + i:02x}:00.0",
                "pcieRoot": f"pci0000:{i // 4:02x}",
                "numaNode": i * 2 // gpus,
            }
            for i in range(gpus)
        ],
    }
    if code in STAND_INS:
        profile["models"] = {code: _stand_in_models()[code]}
    return yaml.safe_dump(profile, sort_keys=False)


def flags(mode: Mode) -> DriverFlags:
    """The daemon flags of ``mode``: ``consumable`` publishes every GPU shareable."""
    return DriverFlags(consumable=ConsumableGpus(all=mode == "consumable"))


def _node_object_capacity(node: TraceNode) -> dict[str, str]:
    return {"cpu": f"{node.cpu_milli}m", "memory": f"{node.memory_mib}Mi", "pods": POD_CAPACITY}


def build(
    cluster: Cluster, nodes: Sequence[TraceNode], mode: Mode, workdir: Path, *, workers: int = 8
) -> Fleet:
    """Create ``nodes`` on ``cluster`` and publish their GPUs' slices for ``mode``."""
    shapes = sorted({(n.model, n.gpus) for n in nodes if n.gpus})
    workdir.mkdir(parents=True, exist_ok=True)
    pools = {}
    models: dict[str, GpuModel] = {}
    for code, count in shapes:
        path = workdir / f"{code}-x{count}.yaml"
        path.write_text(profile_yaml(code, count))
        pools[(code, count)] = node_pool(path, flags(mode))
        device = api_devices(pools[(code, count)])[0]
        models[code] = GpuModel(
            code=code,
            product_name=next(iter(device["attributes"]["productName"].values())),
            memory_bytes=int(parse(device["capacity"]["memory"]["value"])),
        )

    def make(node: TraceNode) -> None:
        labels = {MODEL_LABEL: node.model} if node.model else {}
        cluster.create_node(node.name, labels=labels, capacity=_node_object_capacity(node))

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="trace-nodes") as ex:
        list(ex.map(make, nodes))
    client = KubeClient.from_kubeconfig(str(cluster.kubeconfig), pool_size=16)
    try:
        for shape, pool in pools.items():
            names = [n.name for n in nodes if (n.model, n.gpus) == shape]
            statuses = publish(client, names, pool, workers=workers)
            unsynced = [n for n, s in zip(names, statuses, strict=True) if not s.in_sync]
            if unsynced:
                raise RuntimeError(f"slices not published for {unsynced[:5]}")
    finally:
        client.close()
    return Fleet(tuple(nodes), models, sum(n.gpus for n in nodes))
