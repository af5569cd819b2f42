"""``python -m bench.fleet``: a real control plane, ``--nodes`` kubelet-less Ready nodes
publishing the driver's slices, and ``--pods`` pods with claims; prints how fast
they bind and what the control plane costs. See docs/scale.md.

    python -m bench.fleet --nodes 20 --pods 100 --profile dgx-h100 --claim whole -o json
    python -m bench.fleet.series --repeat 3 -- --nodes 20 --pods 150 --claim whole
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path

from bench.fleet.checks import allocation_problems, published_problems
from bench.fleet.pools import DriverFlags
from bench.fleet.run import CLIENT_BURST, CLIENT_QPS, FleetSettings, run_fleet
from dra_driver.commands.slices import consumable_gpus, mps_slots
from dra_driver.devcluster import Cluster, ClusterOptions, find_binaries


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=10, help="Ready nodes (default %(default)s)")
    p.add_argument("--pods", type=int, default=50, help="timed pods (default %(default)s)")
    p.add_argument(
        "--profile",
        default="dgx-h100",
        help="emulator profile name or YAML file (default %(default)s)",
    )
    p.add_argument(
        "--claim",
        default="whole",
        help="whole | mig:PROFILE | share:MEM,COMPUTE | eight-aligned | "
        "first-available (default %(default)s)",
    )
    p.add_argument(
        "--precreated",
        action="store_true",
        help="claims made before the pods, not from a ResourceClaimTemplate",
    )
    p.add_argument(
        "--fill",
        type=float,
        default=0.0,
        help="fraction of the fleet's capacity for this claim allocated before "
        "the timed pods (default 0)",
    )
    p.add_argument(
        "--fill-mode",
        choices=("allocated", "scheduled"),
        default="allocated",
        help="allocated: the bench writes each fill claim's allocation (first fit, "
        "node by node, no pods); scheduled: fill pods go through kube-scheduler one by "
        "one (default %(default)s)",
    )
    p.add_argument(
        "--shape",
        choices=("driver", "minimal"),
        default="driver",
        help="publish the driver's pool, or the same devices and counters with one "
        "attribute each and the claim rewritten onto it (default %(default)s)",
    )
    p.add_argument("--mig-mode", choices=("static", "dynamic"), default="static")
    p.add_argument("--dynamic-mig-attributes", choices=("full", "compact"), default="full")
    p.add_argument("--consumable-gpus", type=consumable_gpus, default="none")
    p.add_argument("--mps-slots", type=mps_slots, default="none")
    p.add_argument(
        "--client-qps",
        type=int,
        default=CLIENT_QPS,
        help="--kube-api-qps of kube-scheduler and kube-controller-manager; "
        "0 keeps their defaults (default %(default)s)",
    )
    p.add_argument(
        "--client-burst",
        type=int,
        default=CLIENT_BURST,
        help="--kube-api-burst of both; 0 keeps their defaults (default %(default)s)",
    )
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for binding")
    p.add_argument(
        "--check",
        action="store_true",
        help="also check allocations and slices; exit 1 on any problem",
    )
    p.add_argument(
        "--heap-profiles",
        type=Path,
        metavar="DIR",
        help="write kube-apiserver's, kube-scheduler's and kube-controller-manager's heap "
        "profiles (pprof, after a GC) into DIR at the end: `go tool pprof -top` shows "
        "what they hold per device",
    )
    p.add_argument(
        "--cpu-profile",
        type=Path,
        metavar="FILE",
        help="write kube-scheduler's CPU profile (pprof) of the timed pods' first "
        "--cpu-profile-seconds to FILE: `go tool pprof -top FILE` says where its time goes",
    )
    p.add_argument("--cpu-profile-seconds", type=int, default=10)
    p.add_argument("-o", "--output", choices=("text", "json"), default="text")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    settings = FleetSettings(
        profile=args.profile,
        nodes=args.nodes,
        pods=args.pods,
        claim=args.claim,
        precreated=args.precreated,
        fill=args.fill,
        fill_mode=args.fill_mode,
        flags=DriverFlags(
            args.mig_mode, args.consumable_gpus, args.mps_slots, args.dynamic_mig_attributes
        ),
        shape=args.shape,
        timeout_s=args.timeout,
        cpu_profile=args.cpu_profile,
        cpu_profile_s=args.cpu_profile_seconds,
    )
    options = ClusterOptions(
        client_qps=args.client_qps or None,
        client_burst=args.client_burst or None,
        profiling=args.heap_profiles is not None or args.cpu_profile is not None,
    )
    print(
        "control plane: kube-scheduler and kube-controller-manager with "
        + (" ".join(options.client_args()) or "their default client QPS/burst"),
        file=sys.stderr,
    )
    problems: list[str] = []
    with (
        tempfile.TemporaryDirectory(prefix="dra-fleet-") as work,
        Cluster(find_binaries(), Path(work), options) as cluster,
    ):
        try:
            run = run_fleet(cluster, settings)
        except (ValueError, RuntimeError) as exc:
            print(f"bench.fleet: {exc}", file=sys.stderr)
            return 2
        if args.check:
            problems = allocation_problems(cluster, run) + published_problems(cluster, run)
            run.summary["problems"] = problems
        if args.heap_profiles is not None:
            run.summary["heap_profiles"] = write_heap_profiles(cluster, args.heap_profiles)
    if args.output == "json":
        print(json.dumps(run.summary, indent=2))
    else:
        for key, value in run.summary.items():
            print(f"{key:22} {value}")
    return 1 if problems else 0


def write_heap_profiles(cluster: Cluster, out: Path) -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for component in ("kube-apiserver", "kube-scheduler", "kube-controller-manager"):
        path = out / f"{component}.heap.pb.gz"
        path.write_bytes(cluster.heap_profile(component))
        written.append(str(path))
    return written


if __name__ == "__main__":
    sys.exit(main())
