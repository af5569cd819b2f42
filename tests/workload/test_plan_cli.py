"""``dra-driver plan`` on the CI subset of the trace (1/20 of the nodes), and its refusals."""

from __future__ import annotations

import json

import pytest

from dra_driver.cli import main
from tests.trace_replay.test_trace_files import trace_dir

REPLAY_CONSUMABLE_1_20 = (92.84, 94.30)
"""The real-scheduler replay of the same input (docs/trace-replay.md)."""
REPLAY_EXTENDER_1_20 = (94.89, 95.28)
"""The same with the scoring extender (docs/trace-replay.md, "Scoring extender")."""


def test_plan_gives_each_mode_its_gpus_and_rates_near_the_replay(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["plan", "--trace-dir", str(trace_dir()), "--scale", "0.05",
            "--modes", "whole,consumable", "-o", "json"]  # fmt: skip
    assert main(argv) == 0
    whole, consumable = json.loads(capsys.readouterr().out)
    assert [whole["mode"], consumable["mode"]] == ["whole", "consumable"]
    assert whole["gpus"] == consumable["gpus"] == 309
    assert consumable["settings"]["flags"] == ["--consumable-gpus=all"]
    for pct, replayed in zip((100, 130), REPLAY_CONSUMABLE_1_20, strict=True):
        assert abs(consumable[f"allocation_rate_{pct}"] - replayed) <= 2
    assert whole["allocation_rate_100"] < consumable["allocation_rate_100"] - 5
    # rounding every share up to a whole GPU needs more GPUs than sharing them
    assert whole["gpus_needed"] > consumable["gpus_needed"]
    assert sum(whole["unschedulable_100"].values()) > 0


def test_fragmentation_scoring_packs_more_and_names_the_extender(
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = ["plan", "--trace-dir", str(trace_dir()), "--scale", "0.05", "--modes",
            "consumable", "-o", "json"]  # fmt: skip
    assert main(base) == 0
    (stock,) = json.loads(capsys.readouterr().out)
    assert main([*base, "--scoring", "fragmentation"]) == 0
    (scored,) = json.loads(capsys.readouterr().out)
    assert (stock["scoring"], scored["scoring"]) == ("default", "fragmentation")
    assert scored["allocation_rate_100"] > stock["allocation_rate_100"] + 1
    for pct, replayed in zip((100, 130), REPLAY_EXTENDER_1_20, strict=True):
        assert abs(scored[f"allocation_rate_{pct}"] - replayed) <= 2
    assert scored["settings"]["chart"]["scoringExtender"] == {"enabled": True}
    assert "weight 3" in scored["settings"]["scheduler"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--modes", "halves"], "mode 'halves' is unknown; known: whole, consumable"),
        (["--precision", "0"], "--precision 0.0: want 0 < precision < 1"),
        (["--scale", "2"], "scale 2.0: want 0 < scale <= 1"),
        (["--jobs", "0"], "--jobs 0: want at least 1"),
        (["--scoring-weight", "0"], "--scoring-weight 0: want at least 1"),
    ],
)
def test_plan_refuses_bad_arguments_naming_them(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["plan", "--trace-dir", str(trace_dir()), *args]) == 2
    assert message in capsys.readouterr().err


def test_modes_planned_in_worker_processes_give_the_rows_of_one_process(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--jobs``: each mode in its own spawned process, same rows as in this one."""
    rows = []
    for jobs in ("1", "2"):
        argv = ["plan", "--trace-dir", str(trace_dir()), "--scale", "0.03",
                "--modes", "whole,consumable", "--jobs", jobs, "-o", "json"]  # fmt: skip
        assert main(argv) == 0
        rows.append([{k: v for k, v in r.items() if k != "seconds"}
                     for r in json.loads(capsys.readouterr().out)])  # fmt: skip
    assert rows[0] == rows[1]
    assert [r["mode"] for r in rows[1]] == ["whole", "consumable"]
