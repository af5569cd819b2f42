"""``python -m bench.fleet.series``: the same fleet run with ``--shape driver`` and
``--shape minimal`` alternately, ``--repeat`` times each; medians and driver/minimal
ratios, as a Markdown table (docs/scale.md's ratio table) or JSON.

    python -m bench.fleet.series --repeat 3 -- --nodes 20 --pods 150 --claim whole

Each run is its own ``python -m bench.fleet`` process with its own control plane.
Alternating (driver, minimal, driver, ...) spreads a drifting machine load over
both shapes; every run's load average is kept beside the medians.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

SHAPES = ("driver", "minimal")
FIGURES = ("pods_per_s", "p50_s", "p99_s")
OWN_FLAGS = ("--shape", "-o", "--output")
"""Flags of ``bench.fleet`` the series sets itself."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.fleet.series", description=__doc__.split("\n")[0]
    )
    p.add_argument("-R", "--repeat", type=int, default=3, help="runs per shape (default 3)")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    p.add_argument("fleet_args", nargs=argparse.REMAINDER, help="-- then bench.fleet's flags")
    return p


def run_once(fleet_args: Sequence[str], shape: str) -> dict[str, Any]:
    """One ``bench.fleet`` run's JSON summary; raises RuntimeError if it printed none
    (a refused shape, a timeout); ``--check`` problems stay in the summary."""
    argv = [sys.executable, "-m", "bench.fleet", *fleet_args, "--shape", shape, "-o", "json"]
    done = subprocess.run(argv, stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"{shlex.join(argv[1:])} exited {done.returncode}")
    summary: dict[str, Any] = json.loads(done.stdout)
    return summary


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 3) if present else None


def summarize(command: str, runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Medians per shape of :data:`FIGURES`, the driver/minimal ratio of each, and every
    run's figures and load average."""
    shapes: dict[str, Any] = {}
    for shape in SHAPES:
        mine = [r for r in runs if r["shape"] == shape]
        shapes[shape] = {
            **{f: _median([r[f] for r in mine]) for f in FIGURES},
            "slice_bytes_per_node": _median([r["slice_bytes_per_node"] for r in mine]),
            "runs": [
                {f: r.get(f) for f in (*FIGURES, "bound", "fill_pods", "fill_s", "load_average")}
                for r in mine
            ],
        }
    ratio = {}
    for f in (*FIGURES, "slice_bytes_per_node"):
        d, m = shapes["driver"][f], shapes["minimal"][f]
        ratio[f] = round(d / m, 3) if d is not None and m else None
    return {
        "command": command,
        "repeat": len(runs) // len(SHAPES),
        **shapes,
        "ratio": ratio,
        "load_average_1m": [r["load_average"][0] for r in runs],
        "problems": [p for r in runs for p in r.get("problems", [])],
    }


def table(summary: dict[str, Any]) -> str:
    """Markdown rows: each shape's medians, then driver / minimal."""

    def cell(value: Any) -> str:
        return "-" if value is None else f"{value:,}"

    head = "| shape | pods/s | p50 s | p99 s | slice bytes/node | load 1 min (each run) |"
    rows = [head, "|---|---|---|---|---|---|"]
    for shape in SHAPES:
        s = summary[shape]
        loads = ", ".join(f"{r['load_average'][0]:.1f}" for r in s["runs"])
        figures = " | ".join(cell(s[f]) for f in (*FIGURES, "slice_bytes_per_node"))
        rows.append(f"| {shape} | {figures} | {loads} |")
    ratio = " | ".join(cell(summary["ratio"][f]) for f in (*FIGURES, "slice_bytes_per_node"))
    rows.append(f"| **driver / minimal** | {ratio} | |")
    return "\n".join([f"`{summary['command']}`, {summary['repeat']} runs per shape", "", *rows])


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    fleet_args = args.fleet_args[1:] if args.fleet_args[:1] == ["--"] else args.fleet_args
    if bad := [a for a in fleet_args if a.split("=")[0] in OWN_FLAGS]:
        print(f"bench.fleet.series: {bad[0]} is set by the series", file=sys.stderr)
        return 2
    if args.repeat < 1:
        print("bench.fleet.series: --repeat must be at least 1", file=sys.stderr)
        return 2
    runs = []
    try:
        for i in range(args.repeat):
            for shape in SHAPES:
                runs.append(run_once(fleet_args, shape))
                print(f"run {i + 1}/{args.repeat} {shape}: {runs[-1]['pods_per_s']} pods/s",
                      file=sys.stderr)  # fmt: skip
    except RuntimeError as err:
        print(f"bench.fleet.series: {err}", file=sys.stderr)
        return 2
    summary = summarize(f"python -m bench.fleet {shlex.join(fleet_args)}", runs)
    print(json.dumps(summary, indent=2) if args.output == "json" else table(summary))
    return 1 if summary["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
