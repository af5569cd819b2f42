"""Benchmark: dynamic MIG publishing and scheduling (not a test).

1. Pool size: the ResourceSlices ``dra-driver slices --mig-mode dynamic`` emits for
   the emulated ``dgx-a100-mig-on`` node (8 A100s in MIG mode: 208 devices, 8
   counter sets): slice count and bytes (compact JSON, as sent), and the time to
   build them from an inventory (``build_pool`` + validation + split + conversion).
2. Scheduler: 10 such nodes published into a real control plane (kube-apiserver,
   kube-scheduler, kube-controller-manager); 50 MIG claims with pods (20 x 1g.10gb,
   10 x 2g.20gb, 10 x 3g.40gb, 5 x 1g.20gb, 5 x 4g.40gb) created at once; the clock
   runs from the first create to the moment a LIST shows all 50 allocated. Side by
   side, the same 50 pods claiming whole GPUs on 10 plain ``dgx-a100`` nodes (8
   devices each, no counters), to show what counters cost the allocator.
   Every allocation is checked afterwards: no memory slice of any GPU is handed
   out twice.
3. Prepare/unprepare of one dynamic MIG claim through the claim pipeline, in-process,
   with the emulated NVML's MIG calls taking ``REALISTIC_CALL_DELAYS`` (estimates, see
   ``dra_driver/emulation/profile.py``) and with no delays (our own overhead).
4. Process start of ``dra-driver kubelet-plugin --mig-mode dynamic`` on
   ``dgx-a100-mig-on`` to the complete 208-device pool in the API server.

Run: ``.venv/bin/python -m bench.dynamic_mig [--rounds N]`` (needs DRA_K8S_BIN_DIR
or the cached binaries from scripts/build-k8s.sh).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

DRIVER = "gpu.nvidia.com"
RESOURCE = "/apis/resource.k8s.io/v1"
MIX = {"1g.10gb": 20, "2g.20gb": 10, "3g.40gb": 10, "1g.20gb": 5, "4g.40gb": 5}


def _inventory(profile: str) -> Any:
    from dra_driver.emulation import EmulatedNode
    from dra_driver.gpu.hardware.discovery import discover

    with tempfile.TemporaryDirectory() as root:
        node = EmulatedNode.create(profile, Path(root))
        with node.nvml():
            return discover(node.host, logging.getLogger("bench"))


def bench_pool(rounds: int) -> dict[str, Any]:
    from dra_driver.commands.slices import resource_slices

    inventory = _inventory("dgx-a100-mig-on")
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        slices = resource_slices(
            inventory, driver_name=DRIVER, node_name="node-a", node_uid="u", mig_mode="dynamic"
        )
        times.append((time.perf_counter() - start) * 1000)
    sizes = [len(json.dumps(s, separators=(",", ":"))) for s in slices]
    static = resource_slices(
        _inventory("dgx-a100"), driver_name=DRIVER, node_name="node-a", node_uid="u"
    )
    return {
        "profile": "dgx-a100-mig-on",
        "devices": sum(len(s["spec"].get("devices", [])) for s in slices),
        "counter_sets": sum(len(s["spec"].get("sharedCounters", [])) for s in slices),
        "slices": len(slices),
        "bytes_total": sum(sizes),
        "bytes_per_slice": sizes,
        "build_ms_p50": round(statistics.median(times), 1),
        "static_dgx_a100_bytes": sum(len(json.dumps(s, separators=(",", ":"))) for s in static),
    }


def bench_prepare(rounds: int, delays: str) -> dict[str, Any]:
    """Prepare then unprepare one dynamic MIG claim (a 1g.10gb, then a whole-GPU 7g),
    in-process through the claim pipeline, on an emulated dgx-a100-mig-on whose NVML
    MIG calls take ``delays`` (``realistic``: REALISTIC_CALL_DELAYS; ``none``)."""
    from dra_driver.emulation import EmulatedNode
    from dra_driver.emulation.profile import call_delays
    from dra_driver.gpu.hardware.discovery import discover
    from dra_driver.gpu.preparing import ClaimPreparer
    from dra_driver.gpu.sharing.miginstances import MigInstances
    from dra_driver.gpu.sharing.tools import GpuTools
    from dra_driver.plugin.claims import AllocatedDevice, Claim, ClaimRef

    log = logging.getLogger("bench")
    log.setLevel(logging.WARNING)
    prep: dict[str, list[float]] = {"1g.10gb": [], "whole GPU": []}
    unprep: dict[str, list[float]] = {"1g.10gb": [], "whole GPU": []}
    with tempfile.TemporaryDirectory(prefix="dra-bench-") as tmp:
        root = Path(tmp)
        node = EmulatedNode.create(
            "dgx-a100-mig-on", root / "host", call_delays=call_delays(delays)
        )
        with node.nvml():
            inventory = discover(node.host, log)
            mig = MigInstances(host=node.host, logger=log)
            preparer = ClaimPreparer(
                driver_name=DRIVER,
                inventory=lambda: inventory,
                host=node.host,
                cdi_dir=root / "cdi",
                state_dir=root / "state",
                logger=log,
                tools=GpuTools(nvidia_smi=Path("/nonexistent"), mps_control=Path("/nonexistent")),
                mig_instances=mig,
            )
            try:
                for r in range(rounds):
                    for what, device in (
                        ("1g.10gb", "gpu-3-mig-1g10gb-19-6"),
                        ("whole GPU", "gpu-4"),
                    ):
                        ref = ClaimRef("bench", "dyn", f"0a1b2c3d-0000-4000-8000-{r:012d}")
                        claim = Claim(ref=ref, devices=(AllocatedDevice("mig", "node", device),))
                        start = time.perf_counter()
                        preparer.prepare(claim)
                        prep[what].append((time.perf_counter() - start) * 1000)
                        start = time.perf_counter()
                        preparer.unprepare(ref)
                        unprep[what].append((time.perf_counter() - start) * 1000)
            finally:
                preparer.close()
                mig.close()
    return {
        "delays": delays,
        "rounds": rounds,
        **{
            f"{kind} {what}": {
                "p50_ms": round(statistics.median(v), 1),
                "p99_ms": round(_pct(v, 0.99), 1),
            }
            for kind, table in (("prepare", prep), ("unprepare", unprep))
            for what, v in table.items()
        },
    }


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _claims_and_pods(
    namespace: str, group: str, wanted: list[tuple[str, str, str]]
) -> list[dict[str, Any]]:
    """``(name, device class, CEL selector)`` -> ResourceClaim + Pod objects."""
    objs: list[dict[str, Any]] = []
    for name, cls, cel in wanted:
        objs.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "r",
                                "exactly": {
                                    "deviceClassName": cls,
                                    "selectors": [{"cel": {"expression": cel}}],
                                },
                            }
                        ]
                    }
                },
            }
        )
        objs.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {
                    "nodeSelector": {"bench/group": group},
                    "resourceClaims": [{"name": "c", "resourceClaimName": name}],
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.invalid/pause:1",
                            "resources": {"claims": [{"name": "c"}]},
                        }
                    ],
                    "terminationGracePeriodSeconds": 0,
                },
            }
        )
    return objs


def _allocate(
    cluster: Any, namespace: str, objs: list[dict[str, Any]], n: int
) -> tuple[float, list[Any]]:
    start = time.perf_counter()
    for obj in objs:
        cluster.rest.create(
            cluster.rest.path_for(obj["apiVersion"], obj["kind"], None, namespace), obj
        )
    while True:
        items = (
            cluster.rest.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims").get("items") or []
        )
        done = [c for c in items if c.get("status", {}).get("allocation")]
        if len(done) == n:
            return (time.perf_counter() - start) * 1000, done
        if time.perf_counter() - start > 300:
            raise TimeoutError(f"only {len(done)} of {n} claims allocated after 300 s")
        time.sleep(0.02)


def bench_scheduler(rounds: int) -> dict[str, Any]:
    from dra_driver.commands.slices import resource_slices
    from dra_driver.devcluster import Cluster, find_binaries
    from dra_driver.gpu.hardware.partitions import partitions_by_name
    from tests.cluster.test_allocation import apply_deviceclasses

    dynamic_inv, plain_inv = _inventory("dgx-a100-mig-on"), _inventory("dgx-a100")
    parts = partitions_by_name(dynamic_inv.gpus)
    dynamic_ms: list[float] = []
    plain_ms: list[float] = []
    with (
        tempfile.TemporaryDirectory(prefix="dra-", dir="/tmp") as tmp,
        Cluster(find_binaries(), Path(tmp) / "cluster") as cluster,
    ):
        apply_deviceclasses(cluster)
        for r in range(rounds):
            order = [("dyn", dynamic_inv), ("plain", plain_inv)]
            for kind, inventory in order if r % 2 == 0 else order[::-1]:  # no order bias
                group = f"{kind}-{r}"
                for i in range(10):
                    name = f"{group}-n{i}"
                    node = cluster.create_node(name, labels={"bench/group": group})
                    for s in resource_slices(
                        inventory,
                        driver_name=DRIVER,
                        node_name=name,
                        node_uid=node["metadata"]["uid"],
                        mig_mode="dynamic" if kind == "dyn" else "static",
                    ):
                        cluster.rest.create(f"{RESOURCE}/resourceslices", s)
                ns = cluster.create_namespace(group)["metadata"]["name"]
                if kind == "dyn":
                    wanted = [
                        (f"c{i}-{p.replace('.', '')}", "mig.nvidia.com",
                         f"device.attributes['{DRIVER}'].profile == '{p}'")
                        for p, count in MIX.items()
                        for i in range(count)
                    ]  # fmt: skip
                else:
                    wanted = [(f"c{i}", "gpu.nvidia.com", "true") for i in range(50)]
                ms, claims = _allocate(cluster, ns, _claims_and_pods(ns, group, wanted), 50)
                (dynamic_ms if kind == "dyn" else plain_ms).append(ms)
                if kind == "dyn":
                    _check_no_overlap(claims, parts)
    return {
        "nodes": 10,
        "claims": 50,
        "mix": MIX,
        "rounds": rounds,
        "dynamic_mig_all_allocated_ms": [round(t) for t in dynamic_ms],
        "dynamic_mig_p50_ms": round(statistics.median(dynamic_ms)),
        "whole_gpus_no_counters_ms": [round(t) for t in plain_ms],
        "whole_gpus_p50_ms": round(statistics.median(plain_ms)),
        "ratio_p50": round(statistics.median(dynamic_ms) / statistics.median(plain_ms), 2),
    }


def _check_no_overlap(claims: list[Any], parts: dict[str, Any]) -> None:
    used: Counter[tuple[str, str, int]] = Counter()
    for claim in claims:
        for result in claim["status"]["allocation"]["devices"]["results"]:
            part = parts[result["device"]]
            for s in range(part.placement.start, part.placement.start + part.placement.size):
                used[(result["pool"], part.parent.uuid, s)] += 1
    twice = [k for k, v in used.items() if v > 1]
    if twice:
        raise AssertionError(f"memory slices allocated twice: {twice[:5]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="scheduler rounds (default 3)")
    parser.add_argument("--skip-cluster", action="store_true", help="skip the control-plane part")
    parser.add_argument(
        "--prepare-rounds", type=int, default=20, help="prepare rounds with delays (default 20)"
    )
    args = parser.parse_args()
    os.environ.setdefault("DRA_LOG_LEVEL", "warning")
    results: dict[str, Any] = {
        "pool": bench_pool(20),
        "prepare_no_delays": bench_prepare(args.prepare_rounds * 4, "none"),
        "prepare_realistic_delays": bench_prepare(args.prepare_rounds, "realistic"),
    }
    if not args.skip_cluster:
        from bench.inventory_discovery import bench_start_to_pool

        results["start_to_complete_pool"] = bench_start_to_pool(
            5, "dgx-a100-mig-on", 208, ("--mig-mode", "dynamic")
        )
        # Side by side, in the same run: the static 16-device dgx-a100-mig node.
        results["start_to_complete_pool_static_16"] = bench_start_to_pool(5)
        results["scheduler"] = bench_scheduler(args.rounds)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
