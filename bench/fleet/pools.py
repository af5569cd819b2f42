"""One node's pool, built once per run and published for every node (the pool itself
is built by :mod:`dra_driver.workload.pools`, shared with the trace replay and plan).

The driver's own code end to end: emulated discovery of the profile
(:class:`~dra_driver.emulation.EmulatedNode`, once, not per node), the
daemon's pool building (``build_pool`` + ``fractional_pool`` for
``--mig-mode``, ``--consumable-gpus`` and ``--mps-slots``), and the plugin's
publisher (:class:`~dra_driver.plugin.publishing.SlicePublisher`) per node.

Publishing: one ``SlicePublisher`` per node, but only its
:meth:`~dra_driver.plugin.publishing.SlicePublisher.sync_once` is called (the
reconcile the daemon's ``slice-sync`` thread runs: Node UID lookup, list,
:func:`~dra_driver.plugin.slicediff.plan_sync`, create, read back), from a
small thread pool. Its two threads and watch per node are not started: nobody
else writes these slices during a run, and 2 threads and a watch per node
would measure the bench, not the control plane.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dra_driver.plugin.kubeclient import KubeClient
from dra_driver.plugin.publishing import PublishStatus, SlicePublisher
from dra_driver.plugin.resources import Pool
from dra_driver.plugin.slicediff import content_to_api_view, fingerprint
from dra_driver.plugin.slices import content_to_api, split_pool
from dra_driver.workload.pools import DRIVER, DriverFlags, api_devices, node_pool

__all__ = ["DRIVER", "DriverFlags", "api_devices", "node_pool", "publish", "slice_problems"]

logger = logging.getLogger(__name__)


def publish(
    client: KubeClient, nodes: Sequence[str], pool: Pool, *, workers: int = 8
) -> list[PublishStatus]:
    """Publish ``pool`` for every node through the plugin's publisher; one status each."""

    def one(node: str) -> PublishStatus:
        publisher = SlicePublisher(
            client=client,
            driver_name=DRIVER,
            node_name=node,
            pool_source=lambda: pool,
            logger=logger,
        )
        publisher.sync_once()
        return publisher.status

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="publish") as pool_exec:
        return list(pool_exec.map(one, nodes))


def slice_problems(items: Sequence[dict[str, Any]], node: str, pool: Pool) -> list[str]:
    """Why ``node``'s stored slices (``items``) are not one complete, current pool of
    exactly what the driver builds; empty when they are."""
    problems: list[str] = []
    gens = {s["spec"]["pool"]["generation"] for s in items}
    counts = {s["spec"]["pool"]["resourceSliceCount"] for s in items}
    want = split_pool(pool)
    if len(gens) != 1:
        problems.append(f"{node}: generations {sorted(gens)}")
    if counts != {len(items)} or len(items) != len(want):
        problems.append(f"{node}: {len(items)} slices, resourceSliceCount {sorted(counts)}")
    stored = sorted(fingerprint(content_to_api_view(s["spec"])) for s in items)
    wanted = sorted(fingerprint(content_to_api_view(content_to_api(c))) for c in want)
    if stored != wanted:
        problems.append(f"{node}: stored devices differ from the driver's pool")
    if any(s["spec"].get("nodeName") != node or s["spec"]["pool"]["name"] != node for s in items):
        problems.append(f"{node}: a slice names another node or pool")
    return problems
