"""GPU sharing applied on the host: time-slicing through ``nvidia-smi`` and MPS
control daemons, each with its exact undo.

Time-slicing (full GPUs): ``nvidia-smi -i <uuid> -c DEFAULT`` then
``nvidia-smi compute-policy -i <uuid> --set-timeslice <0..3>``; undone with
timeslice 0 (Default). MIG devices are always time-sliced and take no setting.

MPS: one control daemon per claim and config group, id :func:`mps_id` (12 hex
from the claim UID and the GPUs), under ``<state_dir>/mps/<id>/`` with
``pipe/`` (``CUDA_MPS_PIPE_DIRECTORY``, bind-mounted into the container at
``/tmp/nvidia-mps``), ``log/`` (``CUDA_MPS_LOG_DIRECTORY``, daemon only) and
``shm/``: a tmpfs (half of RAM by default, like NVIDIA's) that is the
container's ``/dev/shm`` and, through :mod:`dra_driver.gpu.mpslaunch`, the
daemon's too, because MPS clients and server share memory there. The state
dir must therefore be a mount point with bidirectional propagation in the
plugin pod (it is under the kubelet plugins dir), so the runtime sees the tmpfs.
Full GPUs are switched to ``EXCLUSIVE_PROCESS`` so only the MPS server can use
them. Limits are daemon commands on stdin. The daemon is found again by its
environment (``/proc/<pid>/environ`` naming our pipe dir), not by a stored
PID, so a restarted plugin can stop a daemon it started before it crashed and
can never signal an unrelated process that reused a PID.

All tools run as argv lists (no shell), with a timeout.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dra_driver.gpu.cdi import ContainerEdits, Mount
from dra_driver.gpu.config import MIB, ConfigError, Mps
from dra_driver.gpu.hostpaths import HostPaths
from dra_driver.plugin.sockets import MAX_SOCKET_PATH

MPS_CONTAINER_PIPE = "/tmp/nvidia-mps"
MPS_LONGEST_SOCKET = "control_privileged"
"""The longest socket name the control daemon creates in its pipe dir (driver 580)."""


class ToolError(Exception):
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


class GpuCommands:
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
                list(argv),
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


def _claim_prefix(claim_uid: str) -> str:
    return hashlib.sha256(claim_uid.encode()).hexdigest()[:8]


def is_mps_id_of(daemon_id: str, claim_uid: str) -> bool:
    """Whether ``daemon_id`` (e.g. read from the checkpoint) is one of this claim's: never
    stop, or remove the dir of, a daemon of another claim."""
    return re.fullmatch(r"[0-9a-f]{12}", daemon_id) is not None and daemon_id.startswith(
        _claim_prefix(claim_uid)
    )


def mps_id(claim_uid: str, uuids: Sequence[str]) -> str:
    """12 hex: 8 of the claim UID's hash (found again by :meth:`MpsDaemons.ids_for_claim`)
    and 4 of the GPUs'. Short because the daemon's sockets live in its pipe dir and a
    unix socket path has 107 bytes: ``<uid>-<hash>`` under the kubelet's plugins dir
    made ``.../pipe/control_privileged`` 110 bytes, and the real daemon exited 1."""
    digest = hashlib.sha256(",".join(uuids).encode()).hexdigest()[:4]
    return f"{_claim_prefix(claim_uid)}{digest}"


def pinned_limits(mps: Mps, uuids: Sequence[str], where: str) -> dict[str, int]:
    """Per-device pinned memory limit in bytes; per-device keys are a UUID or an index."""
    limits = {u: mps.pinned_memory_limit for u in uuids if mps.pinned_memory_limit is not None}
    for key, value in mps.per_device_pinned_memory_limit.items():
        if key in uuids:
            limits[key] = value
        elif key.isdigit() and int(key) < len(uuids):
            limits[uuids[int(key)]] = value
        else:
            allowed = ", ".join([*uuids, *map(str, range(len(uuids)))])
            raise ConfigError(
                f"{where}: sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[{key}]: not a "
                f"device of this claim; allowed keys: {allowed}"
            )
    return limits


class MpsDaemons:
    def __init__(self, *, root: Path, commands: GpuCommands, tools: GpuTools) -> None:
        self._root = root
        self._cmd = commands
        self._tools = tools

    def base(self, daemon_id: str) -> Path:
        return self._root / daemon_id

    def pipe_dir(self, daemon_id: str) -> Path:
        return self.base(daemon_id) / "pipe"

    def shm_dir(self, daemon_id: str) -> Path:
        return self.base(daemon_id) / "shm"

    def container_edits(self, daemon_id: str) -> ContainerEdits:
        rw = ("rw", "nosuid", "nodev", "bind")
        mounts = [Mount(str(self.pipe_dir(daemon_id)), MPS_CONTAINER_PIPE, rw)]
        if self._tools.mps_shm_size is not None:
            mounts.append(Mount(str(self.shm_dir(daemon_id)), "/dev/shm", rw))
        return ContainerEdits(
            env=(f"CUDA_MPS_PIPE_DIRECTORY={MPS_CONTAINER_PIPE}",), mounts=tuple(mounts)
        )

    def _env(self, daemon_id: str, uuids: Sequence[str]) -> dict[str, str]:
        return {
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir(daemon_id)),
            "CUDA_MPS_LOG_DIRECTORY": str(self.base(daemon_id) / "log"),
            "CUDA_VISIBLE_DEVICES": ",".join(uuids),
        }

    def depth_problem(self, daemon_id: str = "0" * 12) -> str | None:
        """Why the daemon could not make its sockets under this root, or None."""
        socket = self.pipe_dir(daemon_id) / MPS_LONGEST_SOCKET
        if len(os.fsencode(socket)) <= MAX_SOCKET_PATH:
            return None
        return (
            f"MPS pipe dir {self.pipe_dir(daemon_id)} is too deep: the daemon's socket "
            f"{socket} would be {len(os.fsencode(socket))} bytes, over the "
            f"{MAX_SOCKET_PATH} a unix socket allows; use a shorter --state-dir"
        )

    def make_dirs(self, daemon_id: str) -> None:
        problem = self.depth_problem(daemon_id)
        if problem is not None:
            raise ToolError(problem)
        base = self.base(daemon_id)
        for d in (base, base / "pipe", base / "log", base / "shm"):
            d.mkdir(mode=0o755, parents=True, exist_ok=True)

    def mount_shm(self, daemon_id: str) -> None:
        shm = self.shm_dir(daemon_id)
        if self._tools.mps_shm_size is None or self._mounted(shm):
            return
        options = f"size={self._tools.mps_shm_size},mode=1777,nosuid,nodev"
        self._cmd.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(shm)])

    def _mounted(self, path: Path) -> bool:
        return str(path) in self._mount_points()

    def _mount_points(self) -> set[str]:
        """Mount points of this process, from mountinfo (octal escapes decoded)."""
        points = set()
        for line in (self._tools.proc / "self" / "mountinfo").read_text().splitlines():
            fields = line.split()
            if len(fields) > 4:
                points.add(fields[4].encode().decode("unicode_escape"))
        return points

    def start(self, daemon_id: str, uuids: Sequence[str]) -> None:
        if self.running(daemon_id):
            self.stop(daemon_id)
            self.make_dirs(daemon_id)
            self.mount_shm(daemon_id)
        argv = [str(self._tools.mps_control), "-d"]
        if self._tools.mps_shm_size is not None:
            shm = str(self.shm_dir(daemon_id))
            argv = [sys.executable, "-m", "dra_driver.gpu.mpslaunch", shm, *argv]
        self._cmd.run(argv, env=self._env(daemon_id, uuids))

    def set_limits(
        self, daemon_id: str, uuids: Sequence[str], mps: Mps, limits: Mapping[str, int]
    ) -> None:
        lines = []
        if mps.active_thread_percentage is not None:
            lines.append(f"set_default_active_thread_percentage {mps.active_thread_percentage}")
        for uuid, limit in limits.items():
            lines.append(f"set_default_device_pinned_mem_limit {uuid} {limit // MIB}M")
        if lines:
            self._cmd.run(
                [str(self._tools.mps_control)],
                env=self._env(daemon_id, uuids),
                stdin="".join(f"{line}\n" for line in lines),
            )

    def running(self, daemon_id: str) -> list[int]:
        """PIDs of live MPS processes (control daemon, servers) using this pipe dir."""
        marker = f"CUDA_MPS_PIPE_DIRECTORY={self.pipe_dir(daemon_id)}".encode()
        pids = []
        for entry in self._tools.proc.iterdir():
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

    def stop(self, daemon_id: str, *, grace_s: float = 5.0) -> None:
        """Ask the daemon to quit, kill what is left, remove its directories."""
        if self.running(daemon_id):
            try:
                self._cmd.run(
                    [str(self._tools.mps_control)],
                    env={"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir(daemon_id))},
                    stdin="quit\n",
                )
            except ToolError:
                pass  # killed below
            deadline = time.monotonic() + grace_s
            while self.running(daemon_id) and time.monotonic() < deadline:
                time.sleep(0.02)
            for pid in self.running(daemon_id):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        shm = self.shm_dir(daemon_id)
        if self._mounted(shm):
            try:
                self._cmd.run(["umount", str(shm)])
            except ToolError:
                self._cmd.run(["umount", "--lazy", str(shm)])
        shutil.rmtree(self.base(daemon_id), ignore_errors=True)

    def ids_for_claim(self, claim_uid: str) -> list[str]:
        if not self._root.is_dir():
            return []
        prefix = _claim_prefix(claim_uid)
        return sorted(p.name for p in self._root.glob(f"{prefix}????") if p.is_dir())
