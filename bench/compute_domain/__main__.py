"""``python -m bench.compute_domain``: see the package's docstring."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from bench.compute_domain import __doc__ as DOC
from bench.compute_domain.run import run
from bench.fleet.run import CLIENT_BURST, CLIENT_QPS
from dra_driver.devcluster import Cluster, ClusterOptions, find_binaries


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.compute_domain", description=(DOC or "").split("\n")[0]
    )
    p.add_argument("--nodes", type=int, default=16, help="nodes in the domain (default 16)")
    p.add_argument(
        "--clique-size",
        type=int,
        default=18,
        help="nodes per NVLink clique (an NVL72 rack: 18) (default 18)",
    )
    p.add_argument("--workers", type=int, default=16, help="threads playing the nodes' writes")
    p.add_argument("--controller-workers", type=int, default=4)
    p.add_argument(
        "--daemon-priority-class", default="system-node-critical",
        help="priorityClassName of the daemon pods, as the chart sets it (default %(default)s)",
    )  # fmt: skip
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for Ready")
    p.add_argument("--prefix", default="", help="prefix of every node and namespace name")
    p.add_argument(
        "--controller-log", type=Path, default=None,
        help="copy the controller's JSON log here (default: dropped with the run's files)",
    )  # fmt: skip
    p.add_argument("-o", "--output", choices=("text", "json"), default="text")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    options = ClusterOptions(client_qps=CLIENT_QPS, client_burst=CLIENT_BURST)
    with (
        tempfile.TemporaryDirectory(prefix="dra-cd-bench-") as work,
        Cluster(find_binaries(), Path(work), options) as cluster,
    ):
        try:
            summary = run(cluster, args, Path(work))
        finally:
            if args.controller_log is not None and (Path(work) / "controller.log").exists():
                shutil.copyfile(Path(work) / "controller.log", args.controller_log)
    if args.output == "json":
        print(json.dumps(summary, indent=2))
    else:
        for key, value in summary.items():
            print(f"{key:28} {value}")
    return 0 if summary["ready"] else 1


if __name__ == "__main__":
    sys.exit(main())
