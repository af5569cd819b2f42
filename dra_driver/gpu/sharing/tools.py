"""The GPU tools that sharing strategies run, as argv lists (no shell) with a timeout.

``nvidia-smi`` sets compute modes and time-slices; ``nvidia-cuda-mps-control``
starts and commands MPS control daemons (:mod:`dra_driver.gpu.sharing.mpsdaemons`).
Both come from the driver root on a GPU node, or are the emulated stand-ins
(:mod:`dra_driver.emulation.gputools`) under emulation.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dra_driver.errors import DriverError
from dra_driver.gpu.host.hostpaths import HostPaths


class ToolError(DriverError):
    """A GPU tool failed or timed out; the message has the command and its stderr."""


@dataclass(frozen=True)
class GpuTools:
    """Where the GPU tools are and how to run them (CLI: ``--nvidia-smi`` etc.)."""

    nvidia_smi: Path = Path("/usr/bin/nvidia-smi")
    """Under the driver root on a GPU node; the emulated tool under emulation."""
    mps_control: Path = Path("/usr/bin/nvidia-cuda-mps-control")
    timeout_s: float = 30.0
    """Per command; nvidia-smi can take seconds on a busy 8-GPU node."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment, e.g. ``LD_LIBRARY_PATH`` to the driver root's libraries."""
    proc: Path = Path("/proc")
    """This machine's procfs, used to find MPS daemons (not the emulated host's)."""
    mps_shm_size: str | None = "50%"
    """tmpfs ``size=`` of each MPS claim's shared ``/dev/shm``; None: no tmpfs and no
    separate ``/dev/shm`` for the daemon (only where CAP_SYS_ADMIN is missing)."""

    @classmethod
    def for_host(cls, host: HostPaths) -> GpuTools:
        """The driver root's own tools, with its libraries first on the loader path
        (the plugin image has no driver libraries of its own)."""
        libs = host.driver_lib_dirs()
        return cls(
            nvidia_smi=host.driver_tool("nvidia-smi"),
            mps_control=host.driver_tool("nvidia-cuda-mps-control"),
            env={"LD_LIBRARY_PATH": ":".join(map(str, libs))} if libs else {},
        )


_DIE_WITH_PARENT = """\
import ctypes, os, signal, sys
ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    os._exit(137)  # the plugin died before the line above
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as exc:
    print(f"{sys.argv[2]}: {exc.strerror}", file=sys.stderr)
    os._exit(127)
"""
"""Run before each tool (``python -I -S -c``, ~19 ms): the tool is SIGKILLed when the
plugin dies. A tool left running by a SIGKILLed plugin would act later, on a GPU the
restarted plugin has taken up again (a slow ``nvidia-smi -c DEFAULT`` landing under a
new MPS daemon). A daemon the tool starts (``nvidia-cuda-mps-control -d``) forks, and a
fork does not inherit the signal: daemons outlive the plugin as before."""


class GpuCommands:
    """Runs the tools; every failure (exit code, timeout, missing binary) is a ToolError.
    Each tool dies with the plugin process (:data:`_DIE_WITH_PARENT`)."""

    def __init__(self, *, tools: GpuTools, logger: logging.Logger) -> None:
        self._tools = tools
        self._log = logger

    def run(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, stdin: str = ""
    ) -> str:
        full_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **self._tools.env}
        full_env.update(env or {})
        self._log.debug("running %s", argv)
        try:
            done = subprocess.run(
                [sys.executable, "-I", "-S", "-c", _DIE_WITH_PARENT, str(os.getpid()), *argv],
                input=stdin,
                capture_output=True,
                text=True,
                env=full_env,
                timeout=self._tools.timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ToolError(f"{' '.join(argv)}: {exc}") from exc
        if done.returncode != 0:
            detail = (done.stderr or done.stdout).strip()
            raise ToolError(f"{' '.join(argv)}: exit {done.returncode}: {detail}")
        return done.stdout

    def set_compute_mode(self, uuid: str, mode: str) -> None:
        self.run([str(self._tools.nvidia_smi), "-i", uuid, "-c", mode])

    def compute_mode(self, uuid: str) -> str:
        """The GPU's compute mode now, as ``nvidia-smi -c`` takes it (``DEFAULT``,
        ``EXCLUSIVE_PROCESS``, ``PROHIBITED``); ToolError for anything else."""
        argv = [str(self._tools.nvidia_smi), "-i", uuid, "--query-gpu=compute_mode"]
        out = self.run([*argv, "--format=csv,noheader"]).strip()
        mode = out.upper().replace(" ", "_")
        if mode not in ("DEFAULT", "EXCLUSIVE_PROCESS", "PROHIBITED"):
            raise ToolError(f"{' '.join(argv)}: unexpected compute mode {out!r}")
        return mode

    def set_timeslice(self, uuid: str, value: int) -> None:
        self.run(
            [
                str(self._tools.nvidia_smi),
                "compute-policy",
                "-i",
                uuid,
                "--set-timeslice",
                str(value),
            ]
        )
