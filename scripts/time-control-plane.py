"""Measure the warm start of the test control plane (cached binaries, fresh certs/etcd).

Usage: .venv/bin/python scripts/time-control-plane.py [RUNS]
Prints each run's seconds to healthy per component and the medians.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

from dra_driver.devcluster import Cluster, find_binaries


def main(runs: int) -> None:
    binaries = find_binaries()
    readyz: list[float] = []
    total: list[float] = []
    with tempfile.TemporaryDirectory(prefix="dra-time-cp-") as tmp:
        for run in range(runs):
            cluster = Cluster(binaries, Path(tmp) / f"run{run}")
            with cluster:
                times = cluster.startup_times
                assert times is not None
            # Apiserver /readyz is reached after etcd is healthy: count both.
            readyz.append(times.etcd + times.apiserver)
            total.append(times.total)
            print(
                f"run {run + 1}: etcd {times.etcd:.2f}s, apiserver /readyz {times.apiserver:.2f}s, "
                f"scheduler {times.scheduler:.2f}s, controller-manager "
                f"{times.controller_manager:.2f}s, all ready {times.total:.2f}s"
            )
    print(
        f"median of {runs}: launch to apiserver /readyz {statistics.median(readyz):.2f}s, "
        f"to all components healthy {statistics.median(total):.2f}s"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
