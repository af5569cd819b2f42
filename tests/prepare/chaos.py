"""A plugin process for the chaos test (:mod:`tests.prepare.test_chaos`) that takes
prepare and unprepare calls on stdin and can be told to SIGKILL itself (itself alone: its
tools die with it by their parent-death signal) at a chosen point of a call.

Usage: ``python -m tests.prepare.chaos <node root> [<kill>]``, started in its own
session (process group), with ``DRA_CHAOS_VARIANT`` ``shares`` (the default: an r615
driver, enforced shares of gpu-2) or ``slots`` (driver 580, gpu-2 split into four MPS
slots; :func:`claims_for`). It opens the node, runs :meth:`ClaimPreparer.recover` (what
the plugin does at start; ``<kill>`` is a kill point inside it), answers
``{"ready": true}`` and then one JSON line per request line::

    {"op": "prepare" | "unprepare", "claim": "<name in CLAIMS>", "kill": <kill> | null}
    -> {"ok": true, "devices": [...]} | {"ok": false, "error": "..."}

A kill point is ``{"at": "step" | "tool-before" | "tool-after" | "write", "n": N}``,
counted from the start of that call (or of recovery):

* ``step``: after the N-th step reported through ``on_step`` (it acted, and was told);
* ``tool-before``: while the N-th GPU tool (or mount) runs, before it acted (the
  emulated tools sleep their ``.delay`` first; a real process group kill takes them too);
* ``tool-after``: the N-th tool finished and acted; the plugin never saw its answer;
* ``write``: the N-th atomic file write (checkpoint or CDI spec) has its temp file
  complete but not yet in place.

A call with fewer such points than N finishes. The kill is of this process alone, as a
host process or a runtime that leaves a container's children would see it: a tool in
flight must die with it (``sharing._DIE_WITH_PARENT``), never act after it; MPS daemons,
which detach into their own session like the real one, stay.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dra_driver.gpu.host import files
from dra_driver.gpu.sharing import tools as sharing
from dra_driver.plugin.claims import Claim, PrepareError
from tests.prepare.hosttree import (
    ENFORCING_VERSION,
    SLOTS,
    claim,
    gpu_config,
    make_node,
    open_node,
    share_claim,
    slot_claim,
)
from tests.prepare.hosttree import Node as HostNode

GPUS = 12
TOOL_DELAY_S = 0.03
"""Every emulated tool call sleeps this long first (a real nvidia-smi takes 50-500 ms):
the window in which ``tool-before`` kills it."""


def _uid(n: int) -> str:
    return f"c4a05000-0000-4000-8000-{n:012x}"


def _ts(interval: str, *requests: str) -> Any:
    return gpu_config(
        {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}},
        requests=requests,
    )


def _mps(pct: int, *requests: str) -> Any:
    return gpu_config(
        {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": pct}},
        requests=requests,
    )


CLAIMS: dict[str, Claim] = {
    # Exclusive: nothing but the spec.
    "exclusive": claim(uid=_uid(1), name="exclusive", devices=[("a", "gpu-0"), ("b", "gpu-1")]),
    "exclusive-2": claim(uid=_uid(2), name="exclusive-2", devices=[("gpu", "gpu-11")]),
    # Time-slicing alone, MPS alone, and both in one claim (every kind of step).
    "timeslicing": claim(
        uid=_uid(3), name="timeslicing", devices=[("ts", "gpu-3")], configs=[_ts("Long", "ts")]
    ),
    "mps": claim(
        uid=_uid(4),
        name="mps",
        devices=[("mps", "gpu-4"), ("mps", "gpu-5")],
        configs=[_mps(50, "mps")],
    ),
    "mixed": claim(
        uid=_uid(5),
        name="mixed",
        devices=[("ts", "gpu-8"), ("mps", "gpu-9"), ("mps", "gpu-10")],
        configs=[_ts("Medium", "ts"), _mps(30, "mps")],
    ),
    # Enforced consumable shares of gpu-2, each with its own MPS daemon; the GPU is
    # EXCLUSIVE_PROCESS while any is prepared (a shared resource of all three).
    **{
        f"share-{i}": share_claim(
            _uid(0x10 + i), name=f"share-{i}", memory="20Gi", compute=str(10 * i)
        )
        for i in (1, 2, 3)
    },
    # Advisory (time-sliced) shares of gpu-6: the GPU stays DEFAULT.
    **{
        f"ts-share-{i}": share_claim(
            _uid(0x20 + i),
            name=f"ts-share-{i}",
            device="gpu-6",
            memory="30Gi",
            configs=[_ts("Default")],
        )
        for i in (1, 2)
    },
}


SLOT_CLAIMS: dict[str, Claim] = {
    # MPS slots of gpu-2 (four fit), from four namespaces: one daemon for all of them,
    # the GPU EXCLUSIVE_PROCESS while any is prepared.
    f"slot-{i}": slot_claim(_uid(0x30 + i), namespace=f"team-{i}", name=f"slot-{i}")
    for i in (1, 2, 3, 4)
}
VARIANTS = ("shares", "slots")


def claims_for(variant: str) -> dict[str, Claim]:
    """``shares``: :data:`CLAIMS`; ``slots``: the same with gpu-2's enforced shares (which
    need r615) replaced by :data:`SLOT_CLAIMS`."""
    if variant == "slots":
        return {**{k: v for k, v in CLAIMS.items() if not k.startswith("share-")}, **SLOT_CLAIMS}
    return CLAIMS


def open_chaos_node(root: Path, *, create: bool = False, variant: str = "shares") -> HostNode:
    """The 12-GPU hand-built node (gpu-7 in static MIG mode, unused here): on an r615
    driver, so that shares are enforced with MPS, or (``slots``) on the 580 driver."""
    node = make_node(root, gpus=GPUS) if create else open_node(root, gpus=GPUS)
    if variant == "shares":
        node.inventory = dataclasses.replace(node.inventory, driver_version=ENFORCING_VERSION)
    if create:
        Path(f"{node.record}.delay").write_text(str(TOOL_DELAY_S))
    return node


class _Killer:
    """Counts the kill points of the current call and kills the process at the armed one."""

    def __init__(self) -> None:
        self.armed: dict[str, Any] | None = None
        self.counts: dict[str, int] = {}

    def arm(self, kill: dict[str, Any] | None) -> None:
        self.armed, self.counts = kill, {}

    def due(self, kind: str) -> bool:
        """Count a point of ``kind``: whether it is the armed one."""
        if self.armed is None or self.armed["at"] != kind:
            return False
        self.counts[kind] = self.counts.get(kind, 0) + 1
        return bool(self.counts[kind] == self.armed["n"])

    def point(self, kind: str) -> None:
        if self.due(kind):
            kill_self()


def kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # never reached: SIGKILL cannot be caught


def _install_hooks(killer: _Killer) -> None:
    """Kill points inside tool runs and atomic writes (test-only patches of the modules'
    own references, so the production code runs unchanged)."""
    real_run = subprocess.run
    real_exchange = files._exchange

    def run(argv: Any, **kw: Any) -> Any:
        if killer.due("tool-before"):
            subprocess.Popen(
                argv,
                env=kw.get("env"),
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            kill_self()  # the tool started (exec done) and has not acted yet
        done = real_run(argv, **kw)
        killer.point("tool-after")
        return done

    def exchange(tmp: str, target: Path) -> bool:
        killer.point("write")
        return real_exchange(tmp, target)

    sharing.subprocess = _Subprocess(run)  # type: ignore[assignment]
    files._exchange = exchange  # type: ignore[assignment]


class _Subprocess:
    """``subprocess`` as :mod:`dra_driver.gpu.sharing.tools` sees it, with ``run`` hooked."""

    def __init__(self, run: Any) -> None:
        self.run = run

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)


def main() -> None:
    variant = os.environ.get("DRA_CHAOS_VARIANT", "shares")
    node = open_chaos_node(Path(sys.argv[1]), variant=variant)
    claims = claims_for(variant)
    killer = _Killer()
    _install_hooks(killer)
    preparer = node.preparer(
        on_step=lambda _name: killer.point("step"), mps_slots=SLOTS if variant == "slots" else None
    )
    out = sys.stdout
    killer.arm(json.loads(sys.argv[2]) if len(sys.argv) > 2 else None)
    preparer.recover()
    killer.arm(None)
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        target = claims[request["claim"]]
        killer.arm(request.get("kill"))
        reply: dict[str, Any] = {"ok": True}
        try:
            if request["op"] == "prepare":
                reply["devices"] = [d.device_name for d in preparer.prepare(target)]
            else:
                preparer.unprepare(target.ref)
        except PrepareError as exc:
            reply = {"ok": False, "error": str(exc)}
        killer.arm(None)
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
