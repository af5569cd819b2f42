"""How an MPS control daemon is run: the seam between :class:`~dra_driver.gpu.sharing.mpsdaemons.
MpsDaemons` (directories, tmpfs, finding and stopping daemons) and what starts them.

:class:`DaemonRunner` is the small protocol; two implement it:

* :class:`ProcessRunner` (here): ``nvidia-cuda-mps-control -d`` started by the plugin
  itself (through :mod:`dra_driver.gpu.sharing.mpslaunch` for the claim's ``/dev/shm``), the
  daemon detached (``setsid``) but in the plugin's container: it outlives a plugin run
  as a host process, not a plugin container that is killed or replaced (its cgroup is
  killed whole). For host processes, the prepare tier's tests and ``--mps-daemons
  process``.
* the pod runner (:mod:`dra_driver.mpspods`, built by the daemon's composition root):
  one pod per daemon, pinned to this node, run by the kubelet, so that a plugin
  crash, restart or rolling update leaves the daemons and their clients alone. The
  GPU layer never imports it (nor Kubernetes).

A runner is told *what* to run as a :class:`DaemonSpec`; it never decides where the
daemon's files are. Every method is idempotent.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from dra_driver.gpu.sharing.tools import GpuCommands, GpuTools

Running = Callable[[str], list[int]]
"""PIDs of a daemon's live processes by daemon id (:meth:`MpsDaemons.running`)."""


@dataclass(frozen=True)
class DaemonSpec:
    """One MPS control daemon, as a runner needs it."""

    daemon_id: str
    """12 hex (:func:`~dra_driver.gpu.sharing.mpsdaemons.is_mps_id`)."""
    base: Path
    """``<state_dir>/mps/<id>``: everything of this daemon lies below."""
    pipe_dir: Path
    log_dir: Path
    shm_dir: Path | None
    """The tmpfs the daemon must see as ``/dev/shm``; None: the node's own ``/dev/shm``."""
    env: Mapping[str, str] = field(default_factory=dict)
    """``CUDA_MPS_PIPE_DIRECTORY``, ``CUDA_MPS_LOG_DIRECTORY``, ``CUDA_VISIBLE_DEVICES``."""
    setup: tuple[str, ...] = ()
    """Control commands run once the daemon serves: its default limits."""


@runtime_checkable
class DaemonRunner(Protocol):
    """Starts and stops MPS control daemons; finding their processes is not its job."""

    name: str
    """``process`` or ``pod`` (logs)."""

    def start(self, spec: DaemonSpec) -> None:
        """Start the daemon, replacing an instance of it that runs already; returns once it
        serves (its control pipe answers). Raises ToolError naming what it waited for."""
        ...

    def set_limits(self, spec: DaemonSpec) -> None:
        """Make ``spec.setup`` the daemon's defaults (a runner whose daemons apply it
        themselves when they start does nothing)."""
        ...

    def stop(self, spec: DaemonSpec) -> None:
        """Stop what the runner holds of the daemon (its pod) and wait until its processes
        are gone; the caller stops leftovers itself (quit, then SIGKILL)."""
        ...

    def present(self) -> set[str]:
        """Ids of the daemons the runner holds apart from their processes (pods, which the
        kubelet restarts): adoption decides about each. Empty for plain processes."""
        ...

    def stop_all(self) -> None:
        """After a node reboot: remove everything the runner held (no daemon process
        survived a reboot; their pods did, as API objects)."""
        ...


class ProcessRunner:
    """Daemons as children of this process (``-d``: they detach and outlive it when it
    runs on the host, not when its container is killed)."""

    name = "process"

    def __init__(self, *, commands: GpuCommands, tools: GpuTools, quit: Callable[[str], None]):
        self._cmd = commands
        self._tools = tools
        self._quit = quit

    def start(self, spec: DaemonSpec) -> None:
        self._quit(spec.daemon_id)  # an earlier instance (a retried prepare)
        argv = [str(self._tools.mps_control), "-d"]
        if spec.shm_dir is not None:
            argv = [
                sys.executable,
                "-m",
                "dra_driver.gpu.sharing.mpslaunch",
                str(spec.shm_dir),
                *argv,
            ]
        self._cmd.run(argv, env=dict(spec.env))

    def set_limits(self, spec: DaemonSpec) -> None:
        if spec.setup:
            self._cmd.run(
                [str(self._tools.mps_control)],
                env=dict(spec.env),
                stdin="".join(f"{line}\n" for line in spec.setup),
            )

    def stop(self, spec: DaemonSpec) -> None:
        self._quit(spec.daemon_id)

    def present(self) -> set[str]:
        return set()

    def stop_all(self) -> None:
        pass


def daemon_pids(proc: Path, pipe_dir: Path) -> list[int]:
    """PIDs of live MPS processes (control daemon, servers) whose environment names
    ``pipe_dir``, found in ``proc`` (this machine's procfs: the host's, for a plugin with
    the host's PID namespace)."""
    marker = f"CUDA_MPS_PIPE_DIRECTORY={pipe_dir}".encode()
    pids = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if b"nvidia-cuda-mps" not in (entry / "cmdline").read_bytes():
                continue
            if marker not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            pids.append(int(entry.name))
    return pids
