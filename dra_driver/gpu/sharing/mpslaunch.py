"""Start a program in its own mount namespace with a given directory as ``/dev/shm``.

MPS clients and their server exchange shared memory through ``/dev/shm``, so
the control daemon (and the servers it spawns) must see the same ``/dev/shm``
as the claim's containers. The preparer mounts a tmpfs on
``<state_dir>/mps/<id>/shm``, bind-mounts it into the containers at
``/dev/shm`` (CDI edit), and starts the daemon through this launcher so that,
for the daemon only, ``/dev/shm`` is that same tmpfs. The plugin's own mounts
are untouched (private namespace, no propagation back).

Usage: ``python -m dra_driver.gpu.sharing.mpslaunch <shm dir> <program> [args...]``
(argv only, run by :class:`dra_driver.gpu.sharing.tools.MpsDaemons`; needs
CAP_SYS_ADMIN, which the plugin has as a privileged DaemonSet).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

CLONE_NEWNS = 0x00020000
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: mpslaunch <shm dir> <program> [args...]", file=sys.stderr)
        return 2
    shm, program = argv[0], argv[1:]
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    try:
        _check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        _check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
        _check(
            libc.mount(shm.encode(), b"/dev/shm", None, MS_BIND, None), f"bind {shm} on /dev/shm"
        )
    except OSError as exc:
        print(f"mpslaunch: {exc}", file=sys.stderr)
        return 1
    os.execv(program[0], program)  # noqa: S606 - argv list, no shell


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
