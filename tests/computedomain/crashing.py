"""Run one channel prepare or unprepare in a child process and SIGKILL it after step N.

Usage: ``python -m tests.computedomain.crashing <root> <kubeconfig> <node> prepare|unprepare``
with ``DRA_TEST_KILL_AT=N`` (counted from the first step of that call; 0: no kill, then
the steps are printed one a line). ``unprepare`` prepares first (not counted).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from dra_driver.plugin.kubeclient import KubeClient
from tests.computedomain import kit

CRASH_UID = "0a1b2c3d-0000-4000-8000-00000000cd01"
DOMAIN = "7d6c5b4a-3210-4fed-8cba-9876543210ab"


def main() -> None:
    root, kubeconfig, node, call = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    kill_at = int(os.environ.get("DRA_TEST_KILL_AT", "0"))
    steps: list[str] = []
    counting = call == "prepare"

    def on_step(name: str) -> None:
        if not counting:
            return
        steps.append(name)
        if len(steps) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    client = KubeClient.from_kubeconfig(kubeconfig)
    claim = kit.channel_claim(CRASH_UID, DOMAIN, node)
    with kit.backend(root, client, node, on_step=on_step) as backend:
        backend.prepare(claim)
        if call == "unprepare":
            counting = True
            backend.unprepare(claim.ref)
    print("\n".join(steps))


if __name__ == "__main__":
    main()
