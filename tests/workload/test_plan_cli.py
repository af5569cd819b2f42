"""``dra-driver plan`` on the CI subset of the trace (1/20 of the nodes), and its refusals."""

from __future__ import annotations

import json

import pytest

from dra_driver.cli import main
from tests.trace_replay.test_trace_files import trace_dir

REPLAY_CONSUMABLE_1_20 = (92.84, 94.30)
"""The real-scheduler replay of the same input (docs/trace-replay.md)."""


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


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--modes", "halves"], "mode 'halves' is unknown; known: whole, consumable"),
        (["--precision", "0"], "--precision 0.0: want 0 < precision < 1"),
        (["--scale", "2"], "scale 2.0: want 0 < scale <= 1"),
    ],
)
def test_plan_refuses_bad_arguments_naming_them(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["plan", "--trace-dir", str(trace_dir()), *args]) == 2
    assert message in capsys.readouterr().err
