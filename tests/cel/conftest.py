"""The CEL conformance corpus and the scheduler's own CEL code (the Go oracle) as fixtures."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CORPUS = Path(__file__).with_name("corpus.yaml")


@dataclass(frozen=True)
class Case:
    expr: str
    device: str
    k8s: str
    divergences: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.device}:{self.expr}"


def outcome(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def load_corpus() -> tuple[dict[str, dict[str, Any]], list[Case]]:
    data = yaml.safe_load(CORPUS.read_text())
    cases = []
    for raw in data["cases"]:
        divergences = {k: v for k, v in raw.items() if k in ("cel-expr-python", "cel-python")}
        cases.append(Case(raw["expr"], raw.get("device", "gpu"), outcome(raw["k8s"]), divergences))
    return data["devices"], cases


DEVICES, CASES = load_corpus()


def api_device(name: str) -> dict[str, Any]:
    spec = DEVICES[name]
    return {k: v for k, v in spec.items() if k != "driver"} | {"name": name}


def oracle_binary() -> Path:
    script = REPO / "scripts" / "build-celoracle.sh"
    result = subprocess.run([str(script)], stdout=subprocess.PIPE, text=True, check=False)
    if result.returncode != 0 or not result.stdout.strip():
        pytest.fail(f"{script} failed ({result.returncode}): the Go CEL oracle is required")
    return Path(result.stdout.strip().splitlines()[-1])


def run_oracle(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Evaluate with k8s.io/dynamic-resource-allocation/cel, one answer per request."""
    body = "".join(json.dumps(r) + "\n" for r in requests)
    result = subprocess.run(
        [str(oracle_binary())], input=body, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        pytest.fail(f"celoracle failed: {result.stderr}")
    return [json.loads(line) for line in result.stdout.splitlines()]


def oracle_outcome(answer: dict[str, Any]) -> str:
    if "compileError" in answer:
        return "compile"
    if "runtimeError" in answer:
        return "runtime"
    return outcome(answer["result"])


@pytest.fixture(scope="session")
def oracle_answers() -> dict[str, dict[str, Any]]:
    requests = [
        {
            "expression": c.expr,
            "driver": DEVICES[c.device]["driver"],
            "device": api_device(c.device),
        }
        for c in CASES
    ]
    return dict(zip((c.id for c in CASES), run_oracle(requests), strict=True))
