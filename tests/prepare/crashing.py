"""Run one prepare in a child process and SIGKILL it after step N (``DRA_TEST_KILL_AT``).

Usage: ``python -m tests.prepare.crashing <node root>``. With ``DRA_TEST_KILL_AT``
unset the prepare completes and the step names are printed, one per line.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from tests.prepare.hosttree import claim, gpu_config, open_node

CRASH_UID = "0a1b2c3d-0000-4000-8000-00000000dead"


def crash_claim():  # type: ignore[no-untyped-def]
    """Touches every step: time-slicing on one GPU, MPS over two others, the CDI spec."""
    ts = gpu_config(
        {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Medium"}}, requests=("ts",)
    )
    mps = gpu_config(
        {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}}, requests=("mps",)
    )
    return claim(
        uid=CRASH_UID,
        devices=[("ts", "gpu-0"), ("mps", "gpu-1"), ("mps", "gpu-2")],
        configs=[ts, mps],
    )


def main() -> None:
    node = open_node(Path(sys.argv[1]))
    kill_at = int(os.environ.get("DRA_TEST_KILL_AT", "0"))
    steps: list[str] = []

    def on_step(name: str) -> None:
        steps.append(name)
        if len(steps) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    node.preparer(on_step=on_step).prepare(crash_claim())
    print("\n".join(steps))


if __name__ == "__main__":
    main()
