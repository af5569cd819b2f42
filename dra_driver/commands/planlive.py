"""``dra-driver plan --from-cluster``: read the live cluster and, if given, the plugins'
usage metrics, and hand :mod:`dra_driver.workload.live` plain objects.

Usage comes from the sources ``dra-driver report`` reads (``--prometheus``,
``--scrape``, ``--recorded``), analysed the same way (:func:`dra_driver.rightsizing.
analyse`): a claim needs the larger of its p95 utilization and its peak memory over
the memory it was given, times ``--headroom``.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dra_driver.workload.live import LiveWorkload


class LiveError(RuntimeError):
    """The cluster or a usage source could not be read; the message says which."""


def usage_needs(args: argparse.Namespace) -> dict[tuple[str, str], float]:
    """(namespace, claim) -> share of its GPU it needs; empty without a usage source."""
    from dra_driver.commands import report
    from dra_driver.rightsizing import analyse

    try:
        records = report.read_sources(args, step=60, interval=15)
    except report.ReportError as exc:
        raise LiveError(str(exc)) from exc
    if records is None:
        return {}
    needs: dict[tuple[str, str], float] = {}
    for f in analyse(report.windows(records), headroom=args.headroom):
        memory = f.memory_peak_bytes / f.memory_allocated_bytes if f.memory_allocated_bytes else 1
        peak = max(f.utilization_p95 if f.utilization_p95 is not None else 1.0, memory)
        key = (f.namespace, f.claim)
        needs[key] = max(needs.get(key, 0.0), peak * args.headroom)
    return needs


def from_cluster(args: argparse.Namespace) -> LiveWorkload:
    from dra_driver.allocation.live import ClusterError, LiveCluster
    from dra_driver.workload.live import live_workload

    if args.headroom < 1:
        raise ValueError(f"--headroom {args.headroom}: want at least 1")
    try:
        cluster = LiveCluster(args.kubeconfig, args.context)
        objects = {k: cluster.items(k) for k in ("Node", "ResourceSlice", "ResourceClaim", "Pod")}
    except ClusterError as exc:
        raise LiveError(str(exc)) from exc
    return live_workload(objects["Node"], objects["ResourceSlice"], objects["ResourceClaim"],
                         objects["Pod"], usage_needs(args))  # fmt: skip
