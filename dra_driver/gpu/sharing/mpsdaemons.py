"""MPS control daemons on the host: directories, shared memory, start, limits, stop.

Each daemon has an id (:func:`mps_id`, 12 hex) and lives under
``<state_dir>/mps/<id>/`` with ``pipe/`` (``CUDA_MPS_PIPE_DIRECTORY``,
bind-mounted into containers at ``/tmp/nvidia-mps``), ``log/``
(``CUDA_MPS_LOG_DIRECTORY``, daemon only) and ``shm/``: a tmpfs (half of RAM by
default, like NVIDIA's) that is the containers' ``/dev/shm`` and, through
:mod:`dra_driver.gpu.sharing.mpslaunch`, the daemon's too, because MPS clients and
server share memory there. The state dir must therefore be a mount point with
bidirectional propagation in the plugin pod (it is under the kubelet plugins
dir), so the runtime sees the tmpfs. Limits are daemon commands on stdin.

A daemon is found again by its environment (``/proc/<pid>/environ`` naming our
pipe dir), never by a stored PID, so a restarted plugin can stop a daemon it
started before it crashed and can never signal an unrelated process that
reused a PID. Every method is idempotent.

What starts and stops a daemon is a :class:`~dra_driver.gpu.sharing.mpsrunners.DaemonRunner`:
this process (:class:`~dra_driver.gpu.sharing.mpsrunners.ProcessRunner`, the default), or one
pod per daemon (:mod:`dra_driver.mpspods`) so daemons outlive the plugin's container.
:meth:`MpsDaemons.adopt` is the plugin's start: daemons a checkpoint record owns are
kept (adopted), the others stopped and removed.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import signal
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from dra_driver.gpu.cdi.spec import ContainerEdits, Mount
from dra_driver.gpu.sharing.mpsrunners import DaemonRunner, DaemonSpec, ProcessRunner, daemon_pids
from dra_driver.gpu.sharing.tools import GpuCommands, GpuTools, ToolError
from dra_driver.plugin.sockets import MAX_SOCKET_PATH

MIB = 1024 * 1024
MPS_CONTAINER_PIPE = "/tmp/nvidia-mps"
MPS_LONGEST_SOCKET = "control_privileged"
"""The longest socket name the control daemon creates in its pipe dir (driver 580)."""
Done = Callable[[str], None]
"""Records that a step took effect (a strategy's ``steps.done``); crash recovery and
the chaos tests know the steps by these names."""


def _claim_prefix(claim_uid: str) -> str:
    return hashlib.sha256(claim_uid.encode()).hexdigest()[:8]


def is_mps_id(daemon_id: str) -> bool:
    """Whether ``daemon_id`` (e.g. read from the checkpoint) has the shape of ours, so it
    can name a directory under the MPS root and nothing outside it."""
    return re.fullmatch(r"[0-9a-f]{12}", daemon_id) is not None


def mps_id(claim_uid: str, uuids: Sequence[str]) -> str:
    """12 hex: 8 of the claim UID's hash (found again by :meth:`MpsDaemons.ids_for_claim`)
    and 4 of the GPUs'. Short because the daemon's sockets live in its pipe dir and a
    unix socket path has 107 bytes: ``<uid>-<hash>`` under the kubelet's plugins dir
    made ``.../pipe/control_privileged`` 110 bytes, and the real daemon exited 1."""
    digest = hashlib.sha256(",".join(uuids).encode()).hexdigest()[:4]
    return f"{_claim_prefix(claim_uid)}{digest}"


def recorded_id(record: Mapping[str, Any]) -> str:
    """The daemon id a checkpoint unit records, checked: it names a directory we remove
    and a daemon we stop."""
    daemon_id = str(record.get("daemonId", ""))
    if not is_mps_id(daemon_id):
        raise ToolError(f"MPS daemon id {daemon_id!r} in the checkpoint is not one of ours")
    return daemon_id


def _no_record(_step: str) -> None:
    pass


class MpsDaemons:
    def __init__(
        self,
        *,
        root: Path,
        commands: GpuCommands,
        tools: GpuTools,
        runner: DaemonRunner | None = None,
    ) -> None:
        """``runner`` None: daemons are this process's children (:class:`ProcessRunner`)."""
        self._root = root
        self._cmd = commands
        self._tools = tools
        self._runner: DaemonRunner = runner or ProcessRunner(
            commands=commands, tools=tools, quit=self.quit
        )

    @property
    def runner(self) -> DaemonRunner:
        return self._runner

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

    def spec(
        self, daemon_id: str, uuids: Sequence[str] = (), setup: Sequence[str] = ()
    ) -> DaemonSpec:
        """What a runner needs to run (or stop) daemon ``daemon_id``."""
        shm = self.shm_dir(daemon_id) if self._tools.mps_shm_size is not None else None
        return DaemonSpec(
            daemon_id=daemon_id,
            base=self.base(daemon_id),
            pipe_dir=self.pipe_dir(daemon_id),
            log_dir=self.base(daemon_id) / "log",
            shm_dir=shm,
            env=self._env(daemon_id, uuids),
            setup=tuple(setup),
        )

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

    def start(self, daemon_id: str, uuids: Sequence[str], setup: Sequence[str] = ()) -> None:
        """Start the daemon through the runner (replacing one that runs already)."""
        self._runner.start(self.spec(daemon_id, uuids, setup))

    def set_limits(
        self,
        daemon_id: str,
        uuids: Sequence[str],
        *,
        active_thread_percentage: int | None,
        pinned_memory: Mapping[str, int],
    ) -> None:
        """Default limits of the daemon's servers; ``pinned_memory`` is bytes by UUID."""
        setup = limit_commands(active_thread_percentage, pinned_memory)
        self._runner.set_limits(self.spec(daemon_id, uuids, setup))

    def running(self, daemon_id: str) -> list[int]:
        """PIDs of live MPS processes (control daemon, servers) using this pipe dir."""
        return daemon_pids(self._tools.proc, self.pipe_dir(daemon_id))

    def quit(self, daemon_id: str, *, grace_s: float = 5.0) -> None:
        """Ask the daemon to quit, SIGKILL what is left after ``grace_s``."""
        if not self.running(daemon_id):
            return
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
        deadline = time.monotonic() + grace_s
        while self.running(daemon_id):
            if time.monotonic() > deadline:
                raise ToolError(f"MPS daemon {daemon_id} still running after SIGKILL")
            time.sleep(0.02)

    def unmount_shm(self, daemon_id: str) -> None:
        shm = self.shm_dir(daemon_id)
        if self._mounted(shm):
            try:
                self._cmd.run(["umount", str(shm)])
            except ToolError:
                self._cmd.run(["umount", "--lazy", str(shm)])

    def remove_dirs(self, daemon_id: str) -> None:
        try:
            shutil.rmtree(self.base(daemon_id))
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise ToolError(f"remove {self.base(daemon_id)}: {exc.strerror}") from exc

    def bring_up(
        self,
        daemon_id: str,
        uuids: Sequence[str],
        *,
        active_thread_percentage: int | None,
        pinned_memory: Mapping[str, int],
        done: Done,
    ) -> None:
        """Dirs, tmpfs, daemon, limits: one daemon ready for clients, each step recorded
        as soon as it took effect (``pinned_memory``: bytes by UUID)."""
        self.make_dirs(daemon_id)
        done(f"mps-dirs:{daemon_id}")
        self.mount_shm(daemon_id)
        done(f"mps-shm:{daemon_id}")
        spec = self.spec(daemon_id, uuids, limit_commands(active_thread_percentage, pinned_memory))
        self._runner.start(spec)  # a pod runner's daemon applies its limits as it starts
        done(f"mps-daemon:{daemon_id}")
        self._runner.set_limits(spec)
        done(f"mps-limits:{daemon_id}")

    def tear_down(self, daemon_id: str, done: Done = _no_record) -> None:
        """Stop (the runner's way, then quit/SIGKILL what is left), unmount, remove:
        everything of one daemon, each step recorded."""
        self._runner.stop(self.spec(daemon_id))
        self.quit(daemon_id)
        done(f"mps-quit:{daemon_id}")
        self.unmount_shm(daemon_id)
        done(f"mps-unmount:{daemon_id}")
        self.remove_dirs(daemon_id)
        done(f"mps-remove:{daemon_id}")

    def stop_claim(self, claim_uid: str) -> None:
        """Every daemon of a claim the checkpoint no longer knows."""
        for daemon_id in self.ids_for_claim(claim_uid):
            self.tear_down(daemon_id)

    def ids_for_claim(self, claim_uid: str) -> list[str]:
        """Daemons of a claim (per-claim ids start with its prefix): by directory, and
        those the runner holds (a pod whose directory is gone)."""
        prefix = _claim_prefix(claim_uid)
        return sorted(d for d in self._known(strict=False) if d.startswith(prefix))

    def _known(self, *, strict: bool = True) -> set[str]:
        """Every daemon this node has a trace of: a directory or a runner's pod. Not
        ``strict``: when the runner cannot say (API server down), the directories only
        (a pod without its directory waits for the next start's adoption)."""
        dirs = set()
        if self._root.is_dir():
            dirs = {p.name for p in self._root.iterdir() if p.is_dir() and is_mps_id(p.name)}
        try:
            held = self._runner.present()
        except ToolError:
            if strict:
                raise
            held = set()
        return dirs | {d for d in held if is_mps_id(d)}

    def adopt(
        self, owners: Mapping[str, str], must_run: Collection[str], log: logging.Logger
    ) -> list[str]:
        """At start: keep the daemons a checkpoint record owns (``owners``: daemon id ->
        the claim UID or shared resource recording it), stop and remove every other one,
        and report a daemon of ``must_run`` (prepared claims, acquired shared resources)
        that no longer runs: its clients lost their server. Returns the adopted ids.
        Called under the checkpoint lock, so no record appears meanwhile."""
        adopted = []
        for daemon_id in sorted(self._known() | set(must_run)):
            owner = owners.get(daemon_id)
            pids = self.running(daemon_id)
            if owner is None:
                log.info(
                    "removing an MPS daemon no claim owns",
                    extra={"daemon": daemon_id, "runner": self._runner.name, "pids": pids},
                )
                self.tear_down(daemon_id)
            elif pids:
                adopted.append(daemon_id)
                log.info(
                    "adopted MPS daemon",
                    extra={
                        "daemon": daemon_id,
                        "owner": owner,
                        "runner": self._runner.name,
                        "pids": pids,
                    },
                )
            elif daemon_id in must_run:
                log.error(
                    "MPS daemon recorded for %s is not running: its clients have no MPS "
                    "server until the claim is prepared again",
                    owner,
                    extra={"daemon": daemon_id, "claim_uid": owner, "runner": self._runner.name},
                )
        return adopted

    def remove_all_dirs(self) -> None:
        """After a reboot: the daemons and their tmpfs are gone, only directories (and
        pods, as API objects) remain."""
        self._runner.stop_all()
        if self._root.is_dir():
            for entry in self._root.iterdir():
                shutil.rmtree(entry, ignore_errors=True)


def limit_commands(
    active_thread_percentage: int | None, pinned_memory: Mapping[str, int]
) -> list[str]:
    """The control commands that make these the defaults of a daemon's servers."""
    lines = []
    if active_thread_percentage is not None:
        lines.append(f"set_default_active_thread_percentage {active_thread_percentage}")
    for uuid, limit in pinned_memory.items():
        lines.append(f"set_default_device_pinned_mem_limit {uuid} {limit // MIB}M")
    return lines
