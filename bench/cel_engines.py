"""Benchmark: CEL selector evaluations per second on each engine (not a test).

2,000 seeded synthetic GPU devices (12-13 attributes incl. 3 versions, 5
capacities) and the selectors of ``shared/reference/cel.md`` (equality,
startsWith, quantity, semver, a compound one, lowerAscii). Measured through
:class:`SelectorEvaluator`, as ``simulate`` uses it: devices converted once
(cached), then every selector on every device. Also: compile time per
selector and conversion time per device. Each figure is the median of
``--rounds``; every engine's answers are checked against the others.

Run: ``.venv/bin/python -m bench.cel_engines [--devices N] [--rounds N]``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any

from dra_driver.cel import SelectorEvaluator, cel_device, load_engine

D = "gpu.nvidia.com"
A = f'device.attributes["{D}"]'
C = f'device.capacity["{D}"]'
SELECTORS = {
    "S1 equality": f'{A}.productName == "NVIDIA H100 80GB HBM3"',
    "S2 startsWith": f'{A}.productName.startsWith("NVIDIA A100")',
    "S3 quantity": f'{C}.memory.compareTo(quantity("40Gi")) >= 0',
    "S4 semver": f'{A}.cudaComputeCapability.isGreaterThan(semver("8.0.0"))',
    "S5 compound": (
        f'device.driver == "{D}" && "{D}" in device.attributes && !has({A}.migProfile) && '
        f'{A}.architecture in ["Hopper", "Ampere"] && {A}.productName.startsWith("NVIDIA") && '
        f'{C}.memory.isGreaterThan(quantity("64Gi")) && '
        f'{A}.cudaComputeCapability.compareTo(semver("9.0.0")) >= 0'
    ),
    "S6 lowerAscii": f'{A}.productName.lowerAscii().contains("h100")',
}
PRODUCTS = [
    ("NVIDIA H100 80GB HBM3", "Hopper", "9.0.0", "80Gi"),
    ("NVIDIA A100-SXM4-80GB", "Ampere", "8.0.0", "80Gi"),
    ("NVIDIA A100-SXM4-40GB", "Ampere", "8.0.0", "40Gi"),
    ("NVIDIA L4", "Ada Lovelace", "8.9.0", "24Gi"),
]


def devices(n: int, seed: int = 15) -> list[dict[str, Any]]:
    rng = random.Random(seed)  # noqa: S311 (seeded test data)
    out = []
    for i in range(n):
        name, arch, cc, mem = rng.choice(PRODUCTS)
        attrs: dict[str, Any] = {
            "type": {"string": "gpu"},
            "productName": {"string": name},
            "architecture": {"string": arch},
            "brand": {"string": "Nvidia"},
            "uuid": {"string": f"GPU-{i:08x}"},
            "index": {"int": i % 8},
            "minor": {"int": i % 8},
            "cudaComputeCapability": {"version": cc},
            "driverVersion": {"version": "580.95.5"},
            "cudaDriverVersion": {"version": "13.0.0"},
            "resource.kubernetes.io/pcieRoot": {"string": f"pci{i % 4}"},
            "numaNode": {"int": i % 2},
        }
        if rng.random() < 0.2:
            attrs["migProfile"] = {"string": "1g.10gb"}
        out.append(
            {
                "name": f"gpu-{i}",
                "attributes": attrs,
                "capacity": {
                    "memory": {"value": mem},
                    "multiprocessors": {"value": "132"},
                    "copyEngines": {"value": "8"},
                    "decoders": {"value": "7"},
                    "encoders": {"value": "0"},
                },
            }
        )
    return out


def measure(engine: str, devs: list[dict[str, Any]]) -> dict[str, Any]:
    ev = SelectorEvaluator(load_engine(engine))
    converted = [cel_device(D, d) for d in devs]
    t0 = time.perf_counter()
    for i, d in enumerate(converted):
        ev.prepared(i, lambda d=d: d)
    convert_us = (time.perf_counter() - t0) / len(devs) * 1e6
    result: dict[str, Any] = {"convert_us_per_device": round(convert_us, 1)}
    answers = {}
    for label, expr in SELECTORS.items():
        t0 = time.perf_counter()
        ev.engine.compile(expr)
        compile_us = (time.perf_counter() - t0) * 1e6
        ev.compile(expr)
        t0 = time.perf_counter()
        got = [ev.matches(expr, i, lambda: converted[0]) for i in range(len(devs))]
        per_eval = (time.perf_counter() - t0) / len(devs)
        answers[label] = got
        result[label] = {"evals_per_s": round(1 / per_eval), "compile_us": round(compile_us)}
    result["_answers"] = answers
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--devices", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    devs = devices(args.devices)
    report: dict[str, Any] = {}
    answers: dict[str, Any] = {}
    for engine in ("cel-expr-python", "cel-python"):
        rounds = [measure(engine, devs) for _ in range(args.rounds)]
        answers[engine] = rounds[0].pop("_answers")
        for r in rounds[1:]:
            r.pop("_answers")
        summary: dict[str, Any] = {
            "convert_us_per_device": statistics.median(r["convert_us_per_device"] for r in rounds)
        }
        for label in SELECTORS:
            summary[label] = {
                k: statistics.median(r[label][k] for r in rounds)
                for k in ("evals_per_s", "compile_us")
            }
        report[engine] = summary
        print(engine, json.dumps(summary), flush=True)
    same = answers["cel-expr-python"] == answers["cel-python"]
    matches = {k: sum(v) for k, v in answers["cel-expr-python"].items()}
    print("engines agree on every device:", same, "matching devices:", json.dumps(matches))
    ratio = {
        label: round(
            report["cel-expr-python"][label]["evals_per_s"]
            / report["cel-python"][label]["evals_per_s"],
            1,
        )
        for label in SELECTORS
    }
    print("speed ratio cel-expr-python / cel-python:", json.dumps(ratio))


if __name__ == "__main__":
    main()
