"""``python -m bench.fleet.series``: driver and minimal runs alternately, medians and
the driver/minimal ratio of each figure."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bench.fleet.series import main, summarize, table


def _run(shape: str, pods_per_s: float, p50: float, load: float) -> dict[str, Any]:
    return {"shape": shape, "pods_per_s": pods_per_s, "p50_s": p50, "p99_s": 2 * p50,
            "bound": 10, "slice_bytes_per_node": 6668 if shape == "driver" else 776,
            "load_average": [load, 1.0, 1.0], "problems": []}  # fmt: skip


def test_medians_per_shape_and_their_ratio() -> None:
    runs = [_run("driver", 80, 0.6, 1.5), _run("minimal", 100, 0.5, 1.6),
            _run("driver", 90, 0.7, 2.0), _run("minimal", 90, 0.4, 2.1),
            _run("driver", 10, 0.9, 3.0), _run("minimal", 95, 0.5, 2.9)]  # fmt: skip
    summary = summarize("python -m bench.fleet --nodes 20", runs)
    assert summary["repeat"] == 3
    assert (summary["driver"]["pods_per_s"], summary["minimal"]["pods_per_s"]) == (80, 95)
    assert summary["ratio"] == {"pods_per_s": round(80 / 95, 3), "p50_s": 1.4, "p99_s": 1.4,
                                "slice_bytes_per_node": round(6668 / 776, 3)}  # fmt: skip
    assert summary["load_average_1m"] == [1.5, 1.6, 2.0, 2.1, 3.0, 2.9]
    rows = table(summary).splitlines()
    assert rows[-3] == "| driver | 80 | 0.7 | 1.4 | 6,668 | 1.5, 2.0, 3.0 |"
    assert rows[-1] == "| **driver / minimal** | 0.842 | 1.4 | 1.4 | 8.593 | |"


def test_flags_the_series_sets_are_refused() -> None:
    assert main(["--", "--nodes", "2", "--shape", "minimal"]) == 2


@pytest.mark.cluster
def test_one_series_runs_both_shapes(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["-R", "1", "-o", "json", "--", "--nodes", "3", "--pods", "6", "--check"])
    summary = json.loads(capsys.readouterr().out)
    assert (rc, summary["problems"]) == (0, [])
    assert [r["bound"] for s in ("driver", "minimal") for r in summary[s]["runs"]] == [6, 6]
    # stored slices, metadata included: ~6.7 kB against ~1.6 kB for 8 GPUs
    assert summary["ratio"]["slice_bytes_per_node"] > 3
