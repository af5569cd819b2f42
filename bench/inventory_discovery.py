"""Benchmark: GPU discovery, CLI start-up, and plugin start to complete pool (not a test).

1. Discovery alone: ``discover()`` on an emulated ``dgx-a100-mig`` (8 A100s, 3 in
   MIG mode with 12 static MIG devices) with the emulated NVML installed; p50/p99
   over many rounds. Emulated NVML answers in microseconds, so this measures our
   code plus pynvml's ctypes layer, not a driver.
2. CLI import time: wall time of ``dra-driver --version`` in a fresh interpreter
   (median of runs) and the module import cost from ``python -X importtime``.
3. Process start -> complete pool visible in the API server: a real control
   plane (dra_driver.devcluster); ``dra-driver kubelet-plugin --emulate
   dgx-a100-mig`` under the shipped RBAC with a node-bound token; the clock
   starts before ``Popen`` and stops when a LIST of the node's slices shows the
   whole pool (all 16 devices, one consistent generation, every slice present).

Run: ``.venv/bin/python -m bench.inventory_discovery [--rounds N] [--skip-cluster]``.

Measured 2026-11-22 on the shared 2-core dev VM under load (load average 5-6, other
builds running), two runs: discovery p50 5.5-10.2 ms, p99 8.2-42 ms (441 NVML calls);
``dra-driver --version`` 68-108 ms wall (bare Python 18-27 ms; importing
``dra_driver.cli`` 35-55 ms); ``dra-driver discover --emulate dgx-a100-mig -o json``
355-465 ms wall; process start -> complete 16-device pool in the API server p50
1.1-1.8 s (10 rounds, 1.0-2.9 s). Of that, about 0.1 s is publishing after discovery;
the rest is interpreter start, imports (~0.33 s then: grpc, urllib3, pynvml) and CPU
contention with the control plane on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DRIVER = "gpu.nvidia.com"
PROFILE = "dgx-a100-mig"
EXPECTED_DEVICES = 16  # 12 static MIG devices + 4 full GPUs not in MIG mode


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def bench_discovery(rounds: int) -> dict[str, Any]:
    from dra_driver.emulation import EmulatedNode
    from dra_driver.gpu.hardware.discovery import discover

    log = logging.getLogger("bench")
    log.setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as root:
        node = EmulatedNode.create(PROFILE, Path(root))
        with node.nvml():
            discover(node.host, log)  # warm caches (function pointers, imports)
            times = []
            for _ in range(rounds):
                start = time.perf_counter()
                inventory = discover(node.host, log)
                times.append((time.perf_counter() - start) * 1000)
            calls = sum(node.library.calls.values()) // (rounds + 1)
    assert len(inventory.gpus) == 8
    return {
        "profile": PROFILE,
        "rounds": rounds,
        "p50_ms": round(statistics.median(times), 2),
        "p99_ms": round(_pct(times, 0.99), 2),
        "nvml_calls_per_discovery": calls,
    }


def bench_cli_import(rounds: int) -> dict[str, Any]:
    exe = [sys.executable, "-m", "dra_driver"]
    walls = []
    for _ in range(rounds):
        start = time.perf_counter()
        subprocess.run([*exe, "--version"], check=True, capture_output=True)
        walls.append((time.perf_counter() - start) * 1000)
    baseline = []
    for _ in range(rounds):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True, capture_output=True)
        baseline.append((time.perf_counter() - start) * 1000)
    trace = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import dra_driver.cli"],
        check=True,
        capture_output=True,
        text=True,
    ).stderr
    cumulative = [
        int(m.group(1)) for m in re.finditer(r"\|\s+(\d+) \| dra_driver\.cli$", trace, re.MULTILINE)
    ]
    discover = []
    for _ in range(max(3, rounds // 3)):
        start = time.perf_counter()
        subprocess.run(
            [*exe, "discover", "--emulate", PROFILE, "-o", "json"], check=True, capture_output=True
        )
        discover.append((time.perf_counter() - start) * 1000)
    return {
        "dra_driver_version_wall_ms_p50": round(statistics.median(walls), 1),
        "python_startup_wall_ms_p50": round(statistics.median(baseline), 1),
        "import_dra_driver_cli_ms": round(cumulative[0] / 1000, 1) if cumulative else None,
        "discover_emulated_cli_wall_ms_p50": round(statistics.median(discover), 1),
    }


def _complete_pool(cluster: Any, node: str, expected: int = EXPECTED_DEVICES) -> bool:
    listed = cluster.rest.get(
        "/apis/resource.k8s.io/v1/resourceslices",
        {"fieldSelector": f"spec.nodeName={node},spec.driver={DRIVER}"},
    )
    items = listed.get("items") or []
    pools = {
        (s["spec"]["pool"]["generation"], s["spec"]["pool"]["resourceSliceCount"]) for s in items
    }
    if len(pools) != 1 or next(iter(pools))[1] != len(items):
        return False
    return sum(len(s["spec"].get("devices", [])) for s in items) == expected


def bench_start_to_pool(
    rounds: int,
    profile: str = PROFILE,
    expected: int = EXPECTED_DEVICES,
    extra_args: tuple[str, ...] = (),
) -> dict[str, Any]:
    from dra_driver.devcluster import Cluster, find_binaries
    from tests.plugin.clusterkit import apply_rbac, node_bound_kubeconfig, unique

    times: list[float] = []
    with tempfile.TemporaryDirectory(prefix="dra-", dir="/tmp") as tmp:
        work = Path(tmp)
        with Cluster(find_binaries(), work / "cluster") as cluster:
            apply_rbac(cluster)
            for r in range(rounds):
                node = cluster.create_node(unique("bench-gpu"))
                name = node["metadata"]["name"]
                kubeconfig = node_bound_kubeconfig(cluster, node)
                run_dir = work / f"r{r}"
                argv = [sys.executable, "-m", "dra_driver", "--log-level", "warning"]
                argv += ["kubelet-plugin", "--node-name", name, "--emulate", profile, *extra_args]
                argv += ["--host-root", str(run_dir / "host"), "--cdi-dir", str(run_dir / "cdi")]
                argv += ["--kubelet-registry-dir", str(run_dir / "reg")]
                argv += ["--kubelet-plugins-dir", str(run_dir / "plugins")]
                argv += ["--kubeconfig", str(kubeconfig), "--rediscover-interval", "0"]
                start = time.perf_counter()
                proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                try:
                    while not _complete_pool(cluster, name, expected):
                        if proc.poll() is not None:
                            raise RuntimeError(f"plugin exited with {proc.returncode}")
                        if time.perf_counter() - start > 60:
                            raise TimeoutError("pool not complete after 60 s")
                        time.sleep(0.005)
                    times.append((time.perf_counter() - start) * 1000)
                finally:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(timeout=20)
    return {
        "profile": profile,
        "devices": expected,
        "rounds": rounds,
        "p50_ms": round(statistics.median(times), 1),
        "max_ms": round(max(times), 1),
        "all_ms": [round(t, 1) for t in times],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200, help="discovery rounds (default 200)")
    parser.add_argument("--skip-cluster", action="store_true", help="skip the control-plane part")
    args = parser.parse_args()
    os.environ.setdefault("DRA_LOG_LEVEL", "warning")
    results: dict[str, Any] = {
        "discovery": bench_discovery(args.rounds),
        "cli": bench_cli_import(9),
    }
    if not args.skip_cluster:
        results["start_to_complete_pool"] = bench_start_to_pool(5)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
