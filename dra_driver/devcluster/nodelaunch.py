"""Start a program with some files bind-mounted over, in its own mount namespace.

The real node's kubelet writes machine-wide sysctls at start
(``vm.overcommit_memory=1``, ``kernel.panic=10``, ``kernel.panic_on_oops=1``,
...) and refuses to start with ``protectKernelDefaults`` when they differ. On a
shared machine neither is acceptable, so the kubelet runs under ``unshare
--mount`` with those ``/proc/sys`` files covered by regular files holding the
host's values::

    unshare --mount --propagation unchanged -- \\
        python -m dra_driver.devcluster.nodelaunch --bind FILE=/proc/sys/kernel/panic ... \\
        -- kubelet ...

The mounts vanish with the namespace. Everything else (the kubelet's root dir,
made a shared mount beforehand) still propagates to the host, where containerd
needs the volumes the kubelet mounts. The program is exec'd: it keeps this PID.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence

KUBELET_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
"""The ``/proc/sys`` files the kubelet sets (container manager's kernel defaults)."""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--" not in args:
        print("usage: nodelaunch [--bind SRC=DST]... -- PROGRAM [ARGS...]", file=sys.stderr)
        return 2
    split = args.index("--")
    options, program = args[:split], args[split + 1 :]
    if not program or len(options) % 2:
        print("nodelaunch: expected --bind SRC=DST pairs, then -- PROGRAM", file=sys.stderr)
        return 2
    for flag, pair in zip(options[::2], options[1::2], strict=True):
        source, sep, target = pair.partition("=")
        if flag != "--bind" or not sep:
            print(f"nodelaunch: bad option {flag} {pair}", file=sys.stderr)
            return 2
        done = subprocess.run(["mount", "--bind", source, target], check=False)
        if done.returncode != 0:
            return done.returncode
    os.execvp(program[0], program)  # noqa: S606 (replaces this process, argv list)


if __name__ == "__main__":
    sys.exit(main())
