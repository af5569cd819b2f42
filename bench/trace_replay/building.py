"""The trace's cluster on a started control plane: hand-made Ready nodes with the
trace's CPU and memory, and each GPU node's slices as the driver builds them.

Per node shape (GPU model, GPU count) the driver's own discovery and pool building run
once on an emulated node (:func:`dra_driver.workload.modes.publish_shapes`, the mode's
flags); the pool is published for every node of that shape through the plugin's
publisher (:func:`bench.fleet.pools.publish`). CPU-only nodes publish nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bench.fleet.pools import publish
from dra_driver.devcluster import Cluster
from dra_driver.plugin.kubeclient import KubeClient
from dra_driver.workload.modes import GpuModel, Mode, Published, publish_shapes
from dra_driver.workload.trace import TraceNode, TracePod

POD_CAPACITY = "1000"
"""Pods per node: far above what a node's CPU admits, so only CPU, memory and GPUs
limit placement, as in the paper's simulator."""
MODEL_LABEL = "trace-replay.dra.example/gpu-model"
COUNT_LABEL = "nvidia.com/gpu.count"
"""GPUs on the node, under the name GPU feature discovery labels nodes with, so that a
scheduler profile's node affinity can tell small GPU nodes from large ones."""

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Fleet:
    """The built cluster: its nodes and the GPU models published."""

    nodes: tuple[TraceNode, ...]
    models: dict[str, GpuModel]
    """Trace model code -> what its devices publish."""
    gpus: int
    published: Published


def _node_object_capacity(node: TraceNode) -> dict[str, str]:
    return {"cpu": f"{node.cpu_milli}m", "memory": f"{node.memory_mib}Mi", "pods": POD_CAPACITY}


def build(
    cluster: Cluster,
    nodes: Sequence[TraceNode],
    mode: Mode,
    pods: Sequence[TracePod],
    workdir: Path,
    *,
    workers: int = 8,
) -> Fleet:
    """Create ``nodes`` on ``cluster`` and publish their GPUs' slices for ``mode``
    (``pods``, the drawn ones, choose the slot counts of ``slots``)."""
    published = publish_shapes(nodes, mode, pods, workdir)

    def make(node: TraceNode) -> None:
        labels = {MODEL_LABEL: node.model, COUNT_LABEL: str(node.gpus)} if node.model else {}
        cluster.create_node(node.name, labels=labels, capacity=_node_object_capacity(node))

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="trace-nodes") as ex:
        list(ex.map(make, nodes))
    client = KubeClient.from_kubeconfig(str(cluster.kubeconfig), pool_size=16)
    try:
        for (code, count), shape in published.shapes.items():
            names = [n.name for n in nodes if (n.model, n.gpus) == (code, count)]
            statuses = publish(client, names, shape.pool, workers=workers)
            unsynced = [n for n, s in zip(names, statuses, strict=True) if not s.in_sync]
            if unsynced:
                raise RuntimeError(f"slices not published for {unsynced[:5]}")
    finally:
        client.close()
    return Fleet(tuple(nodes), published.models, sum(n.gpus for n in nodes), published)
