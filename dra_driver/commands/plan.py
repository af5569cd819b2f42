"""``dra-driver plan``: what each sharing mode needs for a workload in the trace's format
(Alibaba's v2023 node and pod lists): the GPUs needed to place it and the allocation rate
at 100 % and 130 % of the GPU capacity requested, from the project's allocator with the
stock scheduler's scoring, on the slices the driver publishes (docs/trace-replay.md).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dra_driver.commands.report import add_sources

if TYPE_CHECKING:
    from dra_driver.workload.modes import Mode
    from dra_driver.workload.plans import PlanSettings
    from dra_driver.workload.trace import TraceNode, TracePod

DEVICECLASSES = Path(__file__).resolve().parents[2] / "deploy" / "deviceclasses"
COST = {"mig": 28, "slots": 18, "consumable": 15, "time-slicing": 11, "whole": 10}
"""Seconds a mode took on the full trace: worker processes start the longest first, so
the last to finish is never a long one started late."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trace-dir",
        type=Path,
        help="directory of the trace's CSV files (default "
        "../shared/traces/alibaba-gpu-v2023 beside the repository)",
    )
    parser.add_argument("--pods", type=Path, help="pod list (default: the trace's default list)")
    parser.add_argument("--nodes", type=Path, help="node list (default: the trace's node list)")
    parser.add_argument(
        "--modes",
        default="whole,consumable,slots,time-slicing,mig",
        help="comma-separated modes (default all: whole, consumable, slots, time-slicing, mig)",
    )
    live = parser.add_argument_group(
        "--from-cluster", "plan for what a live cluster runs (docs/trace-replay.md)"
    )
    live.add_argument(
        "--from-cluster",
        action="store_true",
        help="nodes, pods and claims of a live cluster (kubeconfig) instead of trace files",
    )
    live.add_argument("--kubeconfig", help="kubeconfig file (default: as kubectl finds it)")
    live.add_argument("--context", help="kubeconfig context")
    add_sources(live, required=False)  # the usage metrics, as `dra-driver report` reads them
    live.add_argument("--duration", type=float, default=60, help="seconds to sample (--scrape)")
    live.add_argument(
        "--headroom", type=float, default=1.2, help="usage peak x this is what a pod needs"
    )
    parser.add_argument("--seed", type=int, default=42, help="seed of the pod draw (default 42)")
    parser.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="share of the nodes, stratified, as the replay's --scale (default 1)",
    )
    parser.add_argument(
        "--precision",
        type=float,
        default=0.02,
        help="GPUs needed to within this share of the cluster (default 0.02)",
    )
    parser.add_argument(
        "--scoring",
        choices=("default", "fragmentation"),
        default="default",
        help="node scoring: the stock profile's (default), or with the scoring extender's "
        "fragmentation score added (chart value scoringExtender.enabled)",
    )
    parser.add_argument(
        "--scoring-weight",
        type=int,
        default=3,
        help="the extender's weight in the scheduler configuration (default 3)",
    )
    parser.add_argument(
        "--all-nodes",
        action="store_true",
        help="score every feasible node (percentageOfNodesToScore: 100), not the "
        "scheduler's default sample",
    )
    parser.add_argument(
        "--deviceclasses",
        type=Path,
        default=DEVICECLASSES,
        help="directory of the chart's DeviceClass files (default deploy/deviceclasses)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        help="modes planned at once, one process each (default: one per CPU, at most one per mode)",
    )
    parser.add_argument(
        "-o",
        "--output",
        choices=("table", "json"),
        default="table",
        help="a table, or a JSON list with one object per mode (default table)",
    )


def _classes(directory: Path) -> dict[str, Any]:
    import yaml

    from dra_driver.allocation.model import parse_device_class

    files = sorted(directory.glob("*.yaml")) if directory.is_dir() else []
    if not files:
        raise ValueError(f"--deviceclasses {directory}: no DeviceClass files")
    classes = [parse_device_class(yaml.safe_load(p.read_text())) for p in files]
    return {c.name: c for c in classes}


def _table(rows: list[dict[str, Any]]) -> str:
    head = ("mode", "gpus_needed", "allocation_rate_100", "allocation_rate_130", "settings")
    lines = [head]
    for r in rows:
        settings = " ".join(r["settings"].get("flags") or []) or "-"
        if "claim_config" in r["settings"]:
            settings += " (claim config sharing.strategy: TimeSlicing)"
        needed = "more than " + str(3 * r["gpus"]) if r["gpus_needed"] is None else r["gpus_needed"]
        lines.append((r["mode"], str(needed), f"{r['allocation_rate_100']:.2f}",
                      f"{r['allocation_rate_130']:.2f}", settings))  # fmt: skip
    widths = [max(len(line[i]) for line in lines) for i in range(len(head) - 1)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line[:-1], widths, strict=True)) + "  " + line[-1]
        for line in lines
    )


def _plan_one(
    mode: Mode,
    nodes: Sequence[TraceNode],
    pods: Sequence[TracePod],
    deviceclasses: Path,
    settings: PlanSettings,
    work: Path,
    listed: Sequence[TracePod] | None,
) -> dict[str, Any] | str:
    """One mode's row, or why it cannot be planned (also run in a worker process, which
    reads the DeviceClasses itself: parsed ones carry compiled CEL)."""
    from dra_driver.workload.plans import plan_mode

    logging.getLogger("dra_driver.workload").setLevel(logging.WARNING)
    try:
        return plan_mode(mode, nodes, pods, _classes(deviceclasses), settings, work,
                         listed=listed)  # fmt: skip
    except ValueError as exc:
        return str(exc)


def _in_processes(
    jobs: int, modes: Sequence[Mode], plan: Callable[[Mode], dict[str, Any] | str]
) -> list[dict[str, Any] | str]:
    """``plan`` of each mode in ``jobs`` worker processes: each mode is independent and
    pure Python, so processes, not threads, are what runs them at once (spawned: the
    parent may hold a kubernetes client's threads; ``plan`` is a partial of
    :func:`_plan_one`, which pickles)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures = {m: pool.submit(plan, m) for m in sorted(modes, key=lambda m: -COST.get(m, 0))}
        return [futures[m].result() for m in modes]


def run(args: argparse.Namespace) -> int:
    from dra_driver.allocation.model import ModelError
    from dra_driver.commands.planlive import LiveError, from_cluster
    from dra_driver.workload.drawing import scale_nodes
    from dra_driver.workload.modes import mode_of
    from dra_driver.workload.plans import PlanSettings
    from dra_driver.workload.trace import TRACE_DIR_ENV, read_nodes, read_pods, trace_files

    began = time.monotonic()
    quiet = logging.getLogger("dra_driver.workload")  # one discovery line per node shape
    quiet.setLevel(max(logging.WARNING, logging.getLogger().getEffectiveLevel()))
    try:
        modes = [mode_of(m.strip()) for m in args.modes.split(",") if m.strip()]
        if not modes:
            raise ValueError("--modes: name at least one mode")
        if args.scoring_weight < 1:
            raise ValueError(f"--scoring-weight {args.scoring_weight}: want at least 1")
        if not 0 < args.precision < 1:
            raise ValueError(f"--precision {args.precision}: want 0 < precision < 1")
        listed = None
        source: dict[str, Any] = {}
        if args.from_cluster:
            workload = from_cluster(args)
            nodes, pods, listed = workload.nodes, workload.pods, workload.pods
            source = {"nodes": len(nodes), "gpus": sum(n.gpus for n in nodes),
                      "pods": len(pods), "claims": workload.claims,
                      "rightsized": workload.rightsized, "notes": workload.notes}  # fmt: skip
        else:
            nodes_file, pods_file = trace_files(
                args.trace_dir, args.nodes, args.pods, os.environ.get(TRACE_DIR_ENV)
            )
            nodes = scale_nodes(read_nodes(nodes_file), args.scale)
            pods = read_pods(pods_file)
        _classes(args.deviceclasses)  # refused here, not in a worker
        if args.jobs is not None and args.jobs < 1:
            raise ValueError(f"--jobs {args.jobs}: want at least 1")
    except (ValueError, OSError, ModelError, LiveError) as exc:  # TraceError: ValueError
        print(f"dra-driver plan: {exc}", file=sys.stderr)
        return 2
    settings = PlanSettings(
        seed=args.seed,
        scale=args.scale,
        step=args.precision,
        scoring=args.scoring,
        scoring_weight=args.scoring_weight,
        all_nodes=args.all_nodes,
    )
    jobs = min(len(modes), args.jobs or os.cpu_count() or 1)
    rows = []
    with tempfile.TemporaryDirectory(prefix="dra-plan-") as work:
        plan = functools.partial(_plan_one, nodes=nodes, pods=pods,
                                 deviceclasses=args.deviceclasses, settings=settings,
                                 work=Path(work), listed=listed)  # fmt: skip
        results = [plan(m) for m in modes] if jobs == 1 else _in_processes(jobs, modes, plan)
        for mode, row in zip(modes, results, strict=True):
            if isinstance(row, str):
                print(f"dra-driver plan: mode {mode}: {row}", file=sys.stderr)
                return 2
            rows.append({**row, "source": source} if source else row)
    if args.output == "json":
        print(json.dumps(rows, indent=2))
    else:
        print(_table(rows))
        took = time.monotonic() - began
        print(f"\n{len(nodes)} nodes, {rows[0]['gpus']} GPUs, seed {args.seed}; {took:.0f} s",
              file=sys.stderr)  # fmt: skip
    return 0
