"""``python -m bench.trace_replay``: replay a GPU-sharing trace (Alibaba's v2023 format)
through a real kube-scheduler with the driver's slices; prints the allocation rate at
100 % and 130 % of the GPU capacity requested. See docs/trace-replay.md.

    python -m bench.trace_replay --mode consumable --seed 42 --subset 10 -o json
    python -m bench.trace_replay --mode consumable --subset 10 \
        --scheduler-config deploy/scheduler/gpu-packing.yaml --scheduler-name gpu-packing
    python -m bench.trace_replay --mode consumable --subset 10 --extender
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from pathlib import Path

from bench.fleet.run import CLIENT_BURST, CLIENT_QPS
from bench.trace_replay.extending import ExtenderProcess, with_extender
from bench.trace_replay.replaying import ReplaySettings, replay
from dra_driver.devcluster import BinariesError, Cluster, ClusterOptions, find_binaries
from dra_driver.devcluster.processes import free_loopback_ports
from dra_driver.devcluster.schedconfig import DEFAULT_SCHEDULER, read_scheduler_config
from dra_driver.workload.drawing import scale_nodes
from dra_driver.workload.modes import MODES, mode_of
from dra_driver.workload.trace import (
    NODES_FILE,
    PODS_FILE,
    TRACE_DIR_ENV,
    read_nodes,
    read_pods,
    trace_files,
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.trace_replay", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--trace-dir",
        type=Path,
        default=None,
        help=f"directory of the trace's CSV files (env {TRACE_DIR_ENV}; default "
        "<repo>/../shared/traces/alibaba-gpu-v2023)",
    )
    p.add_argument("--pods", type=Path, help=f"pod list (default TRACE_DIR/{PODS_FILE})")
    p.add_argument("--nodes", type=Path, help=f"node list (default TRACE_DIR/{NODES_FILE})")
    p.add_argument(
        "--mode",
        required=True,
        help=f"how GPUs are published and claimed: {' | '.join(MODES)}",
    )
    p.add_argument("--seed", type=int, default=42, help="seed of the pod draw (default 42)")
    scale = p.add_mutually_exclusive_group()
    scale.add_argument(
        "--scale", type=float, default=1.0, help="share of the nodes, stratified (default 1)"
    )
    scale.add_argument("--subset", type=int, help="K: a stratified 1/K of the nodes (--scale 1/K)")
    p.add_argument(
        "--scheduler-config",
        type=Path,
        help="kube-scheduler --config file (KubeSchedulerConfiguration v1; e.g. "
        "deploy/scheduler/gpu-packing.yaml); default: kube-scheduler's defaults",
    )
    p.add_argument(
        "--scheduler-name",
        default=DEFAULT_SCHEDULER,
        help="the profile the pods select (spec.schedulerName); one of the config's "
        f"profiles (default {DEFAULT_SCHEDULER})",
    )
    p.add_argument(
        "--extender",
        action="store_true",
        help="run the scoring extender (dra-driver scoring-extender) as a host process and "
        "add deploy/scheduler/scoring-extender.yaml's extenders entry to the scheduler's "
        "configuration",
    )
    p.add_argument(
        "--extender-weight",
        type=int,
        default=None,
        help="the extender entry's weight (default: the shipped file's)",
    )
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per batch at most")
    p.add_argument("-o", "--output", choices=("text", "json"), default="text")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    nodes_file, pods_file = trace_files(
        args.trace_dir, args.nodes, args.pods, os.environ.get(TRACE_DIR_ENV)
    )
    scale = 1.0 / args.subset if args.subset else args.scale
    try:
        mode = mode_of(args.mode)
        if args.subset is not None and args.subset < 1:
            raise ValueError(f"--subset {args.subset}: want K >= 1")
        nodes = scale_nodes(read_nodes(nodes_file), scale)
        pods = read_pods(pods_file)
        sched = read_scheduler_config(args.scheduler_config) if args.scheduler_config else None
        profiles = sched.profile_names if sched else (DEFAULT_SCHEDULER,)
        if args.scheduler_name not in profiles:
            raise ValueError(
                f"--scheduler-name {args.scheduler_name}: not a profile of the scheduler's "
                f"configuration (it has {', '.join(profiles)})"
            )
        if args.extender_weight is not None and args.extender_weight < 1:
            raise ValueError(f"--extender-weight {args.extender_weight}: want at least 1")
        port = free_loopback_ports(1)[0] if args.extender else 0
        if args.extender:
            sched = with_extender(sched, port, args.extender_weight)
        binaries = find_binaries()
    except (ValueError, OSError, BinariesError) as exc:  # TraceError is a ValueError
        print(f"bench.trace_replay: {exc}", file=sys.stderr)
        return 2
    settings = ReplaySettings(
        mode=mode,
        seed=args.seed,
        scale=scale,
        timeout_s=args.timeout,
        scheduler_name=args.scheduler_name,
    )
    options = ClusterOptions(
        client_qps=CLIENT_QPS, client_burst=CLIENT_BURST, scheduler_config=sched
    )
    with (
        tempfile.TemporaryDirectory(prefix="dra-trace-") as work,
        Cluster(binaries, Path(work), options) as cluster,
    ):
        extender = None
        try:
            if args.extender:
                extender = ExtenderProcess(port, cluster.kubeconfig, Path(work) / "extender.log")
                extender.start()
            run = replay(cluster, nodes, pods, settings, Path(work))
        except (ValueError, RuntimeError) as exc:
            print(f"bench.trace_replay: {exc}", file=sys.stderr)
            return 2
        finally:
            if extender is not None:
                extender.stop()
        if extender is not None and sched is not None:
            run.summary["scoring_extender"] = sched.document["extenders"][-1]
    if args.output == "json":
        print(json.dumps(run.summary, indent=2))
    else:
        for key, value in run.summary.items():
            print(f"{key:26} {value}")
    if run.summary["undecided"]:
        print(
            f"bench.trace_replay: {run.summary['undecided']} pods neither bound nor rejected "
            f"within --timeout {args.timeout:.0f} s: the rates undercount; raise --timeout",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
