"""Run one prepare or unprepare in a child process and SIGKILL it after step N.

Usage: ``python -m tests.prepare.crashing <node root> prepare|unprepare [share|slot]``
with ``DRA_TEST_CLAIM=sharing|exclusive`` (:func:`crash_claim`) and
``DRA_TEST_KILL_AT=N`` (counted from the first step of that call; 0 or unset: no
kill). ``unprepare`` prepares the claim first (not counted), then unprepares it.
Without a kill the step names of the call are printed, one per line. ``share``:
the claim is :data:`SHARE_CLAIM`, an enforced share of gpu-2 on an r615 driver,
instead of :func:`crash_claim`; ``slot``: :data:`SLOT_CLAIM`, one MPS slot of gpu-2
(split by :data:`~tests.prepare.hosttree.SLOTS`) on the 580 driver.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
from pathlib import Path

from dra_driver.plugin.claims import ClaimRef
from tests.prepare.hosttree import (
    ENFORCING_VERSION,
    SLOTS,
    claim,
    gpu_config,
    open_node,
    share_claim,
    slot_claim,
)

CRASH_UID = "0a1b2c3d-0000-4000-8000-00000000dead"
CRASH_REF = ClaimRef("ns", "c1", CRASH_UID)
SHARE_CLAIM = share_claim(CRASH_UID, namespace="team-a", name="c1", memory="30Gi", compute="25")
SLOT_CLAIM = slot_claim(CRASH_UID, namespace="team-a", name="c1")


def crash_claim(kind: str = "sharing"):  # type: ignore[no-untyped-def]
    """``sharing`` touches every step: time-slicing on one GPU, MPS over two others, the
    CDI spec; ``exclusive`` is two GPUs as they are (nothing but the spec)."""
    if kind == "exclusive":
        return claim(uid=CRASH_UID, devices=[("a", "gpu-3"), ("b", "gpu-4")])
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
    call = sys.argv[2]
    mode = sys.argv[3] if len(sys.argv) > 3 else ""
    if mode == "share":
        node.inventory = dataclasses.replace(node.inventory, driver_version=ENFORCING_VERSION)
    prepared = {"share": SHARE_CLAIM, "slot": SLOT_CLAIM}.get(mode) or crash_claim(
        os.environ.get("DRA_TEST_CLAIM", "sharing")
    )
    kill_at = int(os.environ.get("DRA_TEST_KILL_AT", "0"))
    steps: list[str] = []
    counting = False

    def on_step(name: str) -> None:
        if not counting:
            return
        steps.append(name)
        if len(steps) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    preparer = node.preparer(on_step=on_step, mps_slots=SLOTS if mode == "slot" else None)
    if call == "unprepare":
        preparer.prepare(prepared)
        counting = True
        preparer.unprepare(prepared.ref)
    else:
        counting = True
        preparer.prepare(prepared)
    print("\n".join(steps))


if __name__ == "__main__":
    main()
