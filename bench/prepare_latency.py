"""Benchmark: claim prepare/unprepare latency of the GPU backend, and the checkpoint write.

Runs :class:`dra_driver.gpu.preparing.ClaimPreparer` exactly as the plugin
calls it, on an emulated 8-GPU node (``dgx-h100``) with the emulated GPU tools
(real subprocesses, real MPS daemon process), real files and fsyncs:

- ``1-gpu``: one full GPU, no sharing config (CDI spec + two checkpoint writes);
- ``8-gpu``: all eight GPUs of the node in one claim;
- ``mps``: one GPU with an MPS config (compute mode, daemon start, limits; unprepare
  asks the daemon to quit and resets the compute mode);
- ``repeat``: a second prepare of an already prepared claim (idempotent path);
- checkpoint ``save`` with 0 and 100 other claims recorded, and lock + load.

With ``--real`` it runs on this node's real GPUs and driver instead (root; the
real ``nvidia-smi`` and MPS daemon; ``all-gpu`` is every GPU of the node, and
``timeslice`` a claim with ``interval: Long``).

The kubelet's socket round trip and the claim GET are measured separately by
``bench/plugin_prepare.py``; a NodePrepareResources call costs about their sum.
Run: ``.venv/bin/python -m bench.prepare_latency [--rounds N] [--json] [--real]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dra_driver.emulation import gputools
from dra_driver.emulation.node import EmulatedNode
from dra_driver.gpu.checkpoint import PREPARED, Checkpoint, ClaimEntry, DeviceRecord
from dra_driver.gpu.hardware.discovery import discover
from dra_driver.gpu.host.hostpaths import HostPaths, find_driver_root
from dra_driver.gpu.preparing import ClaimPreparer
from dra_driver.gpu.sharing.tools import GpuTools
from dra_driver.gpu.statefile import CheckpointStore
from dra_driver.plugin.claims import AllocatedDevice, Claim, ClaimRef, OpaqueConfig


def gpu_config(sharing: dict[str, Any]) -> OpaqueConfig:
    return OpaqueConfig(
        source="FromClaim",
        requests=(),
        parameters={
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "GpuConfig",
            "sharing": sharing,
        },
    )


MPS = gpu_config({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}})
TIMESLICE = gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}})


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 2),
        "p99_ms": round(p99 * 1000, 2),
        "n": len(ordered),
    }


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def make_claim(devices: list[str], configs: tuple[OpaqueConfig, ...] = ()) -> Claim:
    return Claim(
        ref=ClaimRef("bench", "claim", str(uuid.uuid4())),
        devices=tuple(AllocatedDevice("gpu", "node", d) for d in devices),
        configs=configs,
    )


def run(rounds: int, real: bool = False) -> dict[str, Any]:
    logging.basicConfig(level=logging.WARNING)
    log = logging.getLogger("bench.prepare")
    with tempfile.TemporaryDirectory(prefix="prepare-bench-") as tmp:
        root = Path(tmp)
        if real:
            driver_root = find_driver_root(HostPaths())
            host = HostPaths(driver_root=driver_root or Path("/"))
            inventory = discover(host, log)
            tools = GpuTools.for_host(host)
            label = f"real {inventory.gpus[0].product_name}, driver {inventory.driver_version}"
        else:
            node = EmulatedNode.create("dgx-h100", root / "host")
            with node.nvml():
                inventory = discover(node.host, log)
            host = node.host
            paths = gputools.install(node.bin_dir, root / "tools.jsonl")
            tools = GpuTools(
                nvidia_smi=paths[gputools.NVIDIA_SMI], mps_control=paths[gputools.MPS_CONTROL]
            )
            label = "emulated dgx-h100"
        preparer = ClaimPreparer(
            driver_name="gpu.nvidia.com",
            inventory=lambda: inventory,
            host=host,
            cdi_dir=root / "cdi",
            state_dir=root / "plugin",
            logger=log,
            tools=tools,
        )
        gpus = [f"gpu-{g.minor}" for g in inventory.gpus]
        results: dict[str, Any] = {"node": label, "gpus": len(gpus)}
        scenarios: dict[str, tuple[list[str], tuple[OpaqueConfig, ...], int]] = {
            "1-gpu": (gpus[:1], (), rounds),
            "all-gpu" if real else "8-gpu": (gpus, (), rounds),
            "mps": (gpus[:1], (MPS,), max(5, rounds // 4)),
        }
        if real:
            scenarios["timeslice"] = (gpus[:1], (TIMESLICE,), max(5, rounds // 4))
        for name, (devices, configs, n) in scenarios.items():
            prep, unprep, repeat = [], [], []
            for _ in range(n):
                c = make_claim(devices, configs)
                prep.append(timed(lambda c=c: preparer.prepare(c)))  # type: ignore[misc]
                repeat.append(timed(lambda c=c: preparer.prepare(c)))  # type: ignore[misc]
                unprep.append(timed(lambda c=c: preparer.unprepare(c.ref)))  # type: ignore[misc]
            results[name] = {
                "prepare": percentiles(prep),
                "unprepare": percentiles(unprep),
                "repeat_prepare": percentiles(repeat),
            }
        store = CheckpointStore(state_dir=root / "ckpt", proc_dir=host.proc(), logger=log)
        for others in (0, 100):
            with store.transaction() as loaded:
                cp = loaded.checkpoint
                for i in range(others):
                    cp.claims[str(uuid.uuid4())] = ClaimEntry(
                        state=PREPARED,
                        namespace="ns",
                        name=f"c{i}",
                        devices=(DeviceRecord(request="gpu", pool="node", device="gpu-0"),),
                        units=(),
                    )

                def save(cp: Checkpoint = cp) -> None:
                    # As a transaction does: one new entry among the others.
                    cp.claims[str(uuid.uuid4())] = ClaimEntry(PREPARED, "ns", "new", (), ())
                    store.save(cp)
                    cp.claims.popitem()

                saves = [timed(save) for _ in range(rounds)]
            results[f"checkpoint_save_{others}_claims"] = percentiles(saves)

        def lock_load() -> None:
            with store.transaction():
                pass

        results["checkpoint_lock_load_100_claims"] = percentiles(
            [timed(lock_load) for _ in range(rounds)]
        )
        return results


def _fmt(stats: dict[str, float]) -> str:
    return f"p50 {stats['p50_ms']:8.2f} ms  p99 {stats['p99_ms']:8.2f} ms  n={stats['n']:g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--real", action="store_true", help="this node's real GPUs (root)")
    args = parser.parse_args()
    results = run(args.rounds, real=args.real)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{results['node']} ({results['gpus']} GPUs)")
    for key, value in results.items():
        if isinstance(value, dict) and "prepare" in value:
            for op, stats in value.items():
                print(f"  {key:9} {op:15} {_fmt(stats)}")
        elif isinstance(value, dict):
            print(f"  {key:40} {_fmt(value)}")


if __name__ == "__main__":
    main()
