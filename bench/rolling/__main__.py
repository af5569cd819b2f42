"""``python -m bench.rolling``: a real control plane, ``--plugins`` nodes each running a
real ``dra-driver kubelet-plugin`` process on emulated GPUs, left idle, then restarted
one at a time as a DaemonSet rolling update would; prints the API requests per plugin
start and per idle hour, the slice writes of the roll and the API server's CPU.
See docs/scale.md ("Rolling update").

    python -m bench.rolling --plugins 50 --idle-s 300 -o json
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.fleet.run import CLIENT_BURST, CLIENT_QPS
from bench.rolling.plugins import PluginFlags
from bench.rolling.run import ROOT, RollSettings, run_rolling
from dra_driver.devcluster import Cluster, ClusterOptions, find_binaries


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.rolling", description=__doc__.split("\n")[0])
    p.add_argument("--plugins", type=int, default=50, help="nodes, one plugin process each "
                   "(default %(default)s)")  # fmt: skip
    p.add_argument(
        "--idle-s",
        type=float,
        default=300.0,
        help="seconds the started plugins are left idle before the roll; a multiple of "
        "300 s, each slice watch's timeout, which ends in a list and a new watch "
        "(default %(default)g)",
    )
    p.add_argument("--profile", default="dgx-h100", help="emulator profile name or YAML file "
                   "(default %(default)s)")  # fmt: skip
    p.add_argument("--mig-mode", choices=("static", "dynamic"), default="static")
    p.add_argument("--surge", action="store_true", help="maxSurge 1 (the chart's default: "
                   "UID-suffixed sockets, new process ready before the old one stops) instead "
                   "of maxUnavailable 1")  # fmt: skip
    p.add_argument("--cdi-hook", type=Path, default=None, help="nvidia-cdi-hook the plugins "
                   "install (default: on PATH, else scripts/build-cdi-hook.sh's)")  # fmt: skip
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for readiness")
    p.add_argument("-o", "--output", choices=("text", "json"), default="text")
    return p


def cdi_hook(given: Path | None) -> Path:
    """The plugins refuse to be ready without one (their CDI specs name it)."""
    if given is not None:
        return given
    found = shutil.which("nvidia-cdi-hook")
    if found:
        return Path(found)
    built = subprocess.run(
        [str(ROOT / "scripts" / "build-cdi-hook.sh")], capture_output=True, text=True, check=True
    )
    return Path(built.stdout.strip())


def table(summary: dict[str, Any]) -> str:
    """The figures a reader compares: requests per start and per idle hour, writes, CPU."""
    start, idle, roll = summary["start"], summary["idle"], summary["roll"]
    lines = [
        f"{summary['plugins']} plugins, {summary['profile']}, {summary['strategy']}, "
        f"{summary['slices']} slices; load average {summary['load_average']['after']}",
        f"{'phase':6} {'seconds':>8} {'plugin req':>10} {'slice writes':>12} "
        f"{'apiserver CPU s':>15}",
    ]
    for name, w in (("start", start), ("idle", idle), ("roll", roll)):
        lines.append(
            f"{name:6} {w['seconds']:>8} {w['plugin_requests_total']:>10} "
            f"{w['slice_writes_all_users']:>12} {w['cpu_s'].get('kube-apiserver', 0):>15}"
        )
    lines.append("per restart (roll / plugins): " + _pairs(roll["per_start"]))
    lines.append("per plugin per idle hour: " + _pairs(idle["per_plugin_per_hour"]))
    lines.append(
        f"all ready {start['all_ready_s']} s; roll {roll['wall_s']} s, per node turn "
        f"{roll['turn_s']} s, apiserver CPU per start {roll['apiserver_cpu_s_per_start']} s; "
        f"slices rewritten: {len(roll['slices_rewritten'])}"
    )
    return "\n".join(lines)


def _pairs(counts: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in counts.items())


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    settings = RollSettings(
        flags=PluginFlags(args.profile, cdi_hook(args.cdi_hook), mig_mode=args.mig_mode),
        plugins=args.plugins,
        idle_s=args.idle_s,
        surge=args.surge,
        timeout_s=args.timeout,
    )
    options = ClusterOptions(client_qps=CLIENT_QPS, client_burst=CLIENT_BURST)
    # Short: the nodes' socket paths live under it (unix sockets allow 107 bytes).
    with (
        tempfile.TemporaryDirectory(prefix="rl-", dir="/tmp") as work,
        Cluster(find_binaries(), Path(work) / "cp", options) as cluster,
    ):
        try:
            run = run_rolling(
                cluster, settings, Path(work) / "n", lambda m: print(m, file=sys.stderr)
            )
        except RuntimeError as exc:
            print(f"bench.rolling: {exc}", file=sys.stderr)
            return 2
    if args.output == "json":
        print(json.dumps(run.summary, indent=2))
    else:
        print(table(run.summary))
    return 1 if run.summary["roll"]["slices_rewritten"] else 0


if __name__ == "__main__":
    sys.exit(main())
