"""Benchmark: MPS slots prepared through the shipped plugin (not a test).

Starts the real control plane and the shipped ``dra-driver kubelet-plugin
--mps-slots="NVIDIA A100-SXM4-80GB=4"`` on an emulated DGX A100 (8 GPUs, driver
580: one MPS daemon per GPU serves its 4 slots; emulated ``nvidia-smi`` and
daemons as real processes), and acts as the kubelet over the plugin's socket,
each claim's allocation (share ID, one slot's consumedCapacity) written as the
scheduler would. Measures:

- the first slot of a GPU (its earlier compute mode read, the GPU to
  EXCLUSIVE_PROCESS, dirs, tmpfs, the GPU's daemon, its one-slot defaults) and
  the unprepare of its last slot (daemon quit, tmpfs, dirs, mode restored);
- a later slot's prepare/unprepare beside one prepared slot (nothing but
  records, a daemon check and the CDI spec);
- the plugin's RSS idle and with all 32 slots (8 GPUs x 4) prepared.

Run (root, for the tmpfs mounts): ``.venv/bin/python -m bench.slot_prepare [--rounds N]``.
"""

from __future__ import annotations

import argparse
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
    finish,
    rss_mb,
    running_plugin,
    summary,
)

NODE = "bench-slot-node"
SLOTS = "NVIDIA A100-SXM4-80GB=4"
SLOT = {"memory": "20Gi", "computeShare": "25"}


def _slot(cluster: Any, ns: str, name: str, device: str) -> str:
    """A claim with one slot of ``device``, allocated as the scheduler records it."""
    result = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device,
              "shareID": str(uuid.uuid4()), "consumedCapacity": SLOT}  # fmt: skip
    return allocated_claim(cluster, ns, name, {"deviceClassName": "gpu.nvidia.com"}, [result])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()

    from dra_driver.devcluster import Cluster, find_binaries

    work = Path(tempfile.mkdtemp(prefix="dra-slot-bench-", dir="/tmp"))
    with Cluster(find_binaries(), work / "cluster") as cluster:
        ns = "slot-bench"
        kubeconfig = bench_node(cluster, NODE, ns)
        gpus = [f"gpu-{m}" for m in range(8)]
        claims = {
            (g, i): (f"{g}-s{i}", _slot(cluster, ns, f"{g}-s{i}", g))
            for g in gpus
            for i in range(4)
        }
        flags = ["--emulate=dgx-a100", f"--mps-slots={SLOTS}"]
        with running_plugin(work, NODE, kubeconfig, flags, ns) as (child, kubelet):
            call = kubelet.call
            time.sleep(1)
            report: dict[str, Any] = {"node": "emulated DGX A100 (8 x 80GB), driver 580.95.05"}
            report["plugin_rss_idle_mb"] = rss_mb(child.pid)
            first, last = [], []
            for _ in range(args.rounds + 2):
                first.append(call("prepare", claims[("gpu-0", 0)]))
                last.append(call("unprepare", claims[("gpu-0", 0)]))
            report["first_slot"] = {
                "prepare": summary(first[2:]),
                "unprepare_last": summary(last[2:]),
            }
            call("prepare", claims[("gpu-0", 0)])
            later, later_un = [], []
            for _ in range(args.rounds + 2):
                later.append(call("prepare", claims[("gpu-0", 1)]))
                later_un.append(call("unprepare", claims[("gpu-0", 1)]))
            report["later_slot"] = {
                "prepare": summary(later[2:]),
                "unprepare": summary(later_un[2:]),
            }
            fill_first: list[float] = []
            fill_later: list[float] = []
            for (g, i), claim in sorted(claims.items()):
                if (g, i) == ("gpu-0", 0):
                    continue
                (fill_later if i else fill_first).append(call("prepare", claim))
            report["filling_32_slots"] = {
                "first_of_a_gpu": summary(fill_first),
                "later": summary(fill_later),
            }
            daemons = len(list((work / "state" / "mps").iterdir()))
            report["plugin_rss_32_slots_mb"] = rss_mb(child.pid)
            report["daemons_with_32_slots"] = daemons
            for claim in claims.values():
                call("unprepare", claim)
    return finish(report, work)


if __name__ == "__main__":
    sys.exit(main())
