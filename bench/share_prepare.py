"""Benchmark: fractional GPU shares prepared through the shipped plugin (not a test).

Starts the real control plane and the shipped ``dra-driver kubelet-plugin
--consumable-gpus=all`` on an emulated 2 x H100 node with an r615 driver
(``tests/e2e/data/h100-r615.yaml``; emulated ``nvidia-smi`` and MPS control
daemons as real processes), and acts as the kubelet over the plugin's socket,
each claim's allocation (share ID, consumedCapacity) written as the scheduler
would. Measures, on one GPU:

- the first share's prepare (the GPU to EXCLUSIVE_PROCESS, dirs, tmpfs, its
  MPS daemon, limits) and unprepare (the last share: the GPU back to DEFAULT);
- a later share's prepare/unprepare beside one prepared share;
- with k shares kept prepared (1, 2, 4, ... 80), the median prepare of one more
  share (``--probes`` tries on the way up and as many on the way down, each
  unprepared again), the first k at which it is twice the median with one
  share, and the plugin's own CPU time per probe (its tools' excluded);
- the plugin process's RSS idle and with 48 shares prepared.

Run (root, for the tmpfs mounts): ``.venv/bin/python -m bench.share_prepare [--rounds N]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.plugin_socket import (
    DRIVER,
    allocated_claim,
    bench_node,
    cpu_ms,
    finish,
    rss_mb,
    running_plugin,
    summary,
)

NODE = "bench-share-node"
PROFILE = Path(__file__).parents[1] / "tests" / "e2e" / "data" / "h100-r615.yaml"


def _share(cluster: Any, ns: str, name: str, memory: str) -> str:
    """A claim with one share of gpu-0, allocated as the scheduler records it."""
    exactly = {"deviceClassName": "gpu.nvidia.com", "capacity": {"requests": {"memory": memory}}}
    result = {
        "request": "gpu",
        "driver": DRIVER,
        "pool": NODE,
        "device": "gpu-0",
        "shareID": str(uuid.uuid4()),
        "consumedCapacity": {"memory": memory, "computeShare": "0"},
    }
    return allocated_claim(cluster, ns, name, exactly, [result])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--shares", type=int, default=80, help="most shares kept prepared")
    parser.add_argument("--probes", type=int, default=7, help="probe prepares per level")
    args = parser.parse_args()

    from dra_driver.devcluster import Cluster, find_binaries

    work = Path(tempfile.mkdtemp(prefix="dra-share-bench-", dir="/tmp"))
    with Cluster(find_binaries(), work / "cluster") as cluster:
        ns = "share-bench"
        kubeconfig = bench_node(cluster, NODE, ns)
        n = max(args.shares, 48)
        claims = [(f"s{i}", _share(cluster, ns, f"s{i}", "512Mi")) for i in range(n + 2)]
        flags = [f"--emulate={PROFILE}", "--consumable-gpus=all"]
        with running_plugin(work, NODE, kubeconfig, flags, ns) as (child, kubelet):
            call = kubelet.call

            time.sleep(1)
            report: dict[str, Any] = {"node": "emulated 2 x H100, driver 615.20.01"}
            report["plugin_rss_idle_mb"] = rss_mb(child.pid)
            first, last = [], []
            for _ in range(args.rounds + 2):
                first.append(call("prepare", claims[0]))
                last.append(call("unprepare", claims[0]))
            report["first_share"] = {
                "prepare": summary(first[2:]),
                "unprepare_last": summary(last[2:]),
            }
            call("prepare", claims[0])
            later, later_un = [], []
            for _ in range(args.rounds + 2):
                later.append(call("prepare", claims[1]))
                later_un.append(call("unprepare", claims[1]))
            report["later_share"] = {
                "prepare": summary(later[2:]),
                "unprepare": summary(later_un[2:]),
            }
            call("unprepare", claims[0])

            # Scaling: with k shares kept prepared, prepare+unprepare a probe share
            # --probes times, on the way up (k growing) and again on the way down, so
            # drift in the machine's load hits every level alike. Wall time (tool
            # processes included) and the plugin's own CPU time per probe.
            levels = [k for k in (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80) if k <= n]
            probe = claims[n]
            wall: dict[int, list[float]] = {k: [] for k in levels}
            cpu: dict[int, list[float]] = {k: [] for k in levels}

            def probes(k: int) -> None:
                for _ in range(args.probes):
                    before = cpu_ms(child.pid)
                    wall[k].append(call("prepare", probe))
                    call("unprepare", probe)
                    cpu[k].append(cpu_ms(child.pid) - before)

            kept = 0
            for k in levels:
                while kept < k:
                    call("prepare", claims[kept])
                    kept += 1
                if k == 48:
                    report["plugin_rss_48_shares_mb"] = rss_mb(child.pid)
                probes(k)
            report["plugin_rss_with_shares_mb"] = {"shares": kept, "rss": rss_mb(child.pid)}
            unprep = []
            for k in reversed(levels):
                while kept > k:
                    kept -= 1
                    unprep.append(call("unprepare", claims[kept]))
                probes(k)
            base = statistics.median(wall[1])
            report["scaling"] = {
                "probe_prepare_p50_ms_with_k_shares": {
                    str(k): round(statistics.median(v), 1) for k, v in wall.items()
                },
                "ratio_to_one_share": {
                    str(k): round(statistics.median(v) / base, 2) for k, v in wall.items()
                },
                "first_k_at_2x": next(
                    (k for k, v in wall.items() if statistics.median(v) >= 2 * base), None
                ),
                "plugin_cpu_ms_per_probe_p50": {
                    str(k): round(statistics.median(v), 1) for k, v in cpu.items()
                },
            }
            report["unprepare_with_k_shares"] = summary(unprep)
            call("unprepare", claims[0])
    return finish(report, work)


if __name__ == "__main__":
    sys.exit(main())
