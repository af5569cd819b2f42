"""What a real node leaves on the machine, and taking it away again.

Most of the node lives under its run directory (kubelet root, containerd root
and state, runc state, CNI IPAM, pod logs, CDI specs) and in its own network
namespace. A few paths are fixed in the components' code and cannot be moved:

* ``/var/log/containers/*.log``: the kubelet's symlinks to pod log files;
* ``/var/lib/cni/results``: libcni's result cache (``<network>-<id>-<if>``);
* ``/run/containerd/s``: the runc shim's sockets (a hash of containerd's address).

Teardown removes only this run's entries there, and removes those directories
only when they are empty and did not exist before this run (:class:`HostDirs`),
so concurrent runs and the host's own files are never touched. Mounts are
undone below the run directory only, and cgroups below the run's cgroup root.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

CGROUP_FS = Path("/sys/fs/cgroup")
FIXED_DIRS = (
    Path("/var/log/containers"),
    Path("/var/lib/cni/results"),
    Path("/var/lib/cni"),
    Path("/run/containerd/s"),
    Path("/run/containerd"),
)
"""Host directories the node's components create at fixed paths (deepest first)."""


@dataclass
class HostDirs:
    """Which of :data:`FIXED_DIRS` were absent when the run started."""

    absent: list[Path] = field(default_factory=list)

    @classmethod
    def snapshot(cls) -> HostDirs:
        return cls([d for d in FIXED_DIRS if not d.exists()])

    def remove_empty(self) -> list[Path]:
        """rmdir the ones this run saw absent, if now empty; returns those left."""
        left = []
        for d in self.absent:
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                left.append(d)
        return left


def mounts_under(prefix: Path) -> list[Path]:
    """Mount points at or below ``prefix``, deepest first (from /proc/self/mountinfo)."""
    found = []
    text = Path("/proc/self/mountinfo").read_text()
    for line in text.splitlines():
        mount_point = line.split()[4].encode().decode("unicode_escape")
        path = Path(mount_point)
        if path == prefix or prefix in path.parents:
            found.append(path)
    return sorted(set(found), key=lambda p: len(p.parts), reverse=True)


def unmount_all(prefix: Path) -> list[Path]:
    """Unmount everything at or below ``prefix``; lazily when busy. Returns what stayed."""
    for _ in range(3):
        mounts = mounts_under(prefix)
        if not mounts:
            return []
        for mount in mounts:
            done = subprocess.run(["umount", str(mount)], capture_output=True, check=False)
            if done.returncode != 0:
                subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)
    return mounts_under(prefix)


def cgroup_hierarchies() -> list[Path]:
    """Mount points of every cgroup hierarchy (v1 controllers and the unified one)."""
    roots = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        sep = fields.index("-")
        if fields[sep + 1] in ("cgroup", "cgroup2"):
            roots.append(Path(fields[4]))
    return sorted(set(roots))


def create_cgroup_root(name: str) -> list[Path]:
    """``/<name>`` in every hierarchy (the kubelet refuses a cgroupRoot that is missing).

    cpuset children start with no CPUs or memory nodes: copy the parent's.
    """
    made = []
    for hierarchy in cgroup_hierarchies():
        path = hierarchy / name
        path.mkdir(exist_ok=True)
        made.append(path)
        for knob in ("cpuset.cpus", "cpuset.mems"):
            if (path / knob).exists() and not (path / knob).read_text().strip():
                (path / knob).write_text((hierarchy / knob).read_text())
    return made


def kill_cgroup_processes(name: str, grace: float = 5.0) -> list[int]:
    """SIGKILL every process left in ``/<name>`` (any hierarchy); returns the PIDs."""
    pids: set[int] = set()
    for hierarchy in cgroup_hierarchies():
        root = hierarchy / name
        if not root.is_dir():
            continue
        for procs in root.rglob("cgroup.procs"):
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(p) for p in procs.read_text().split())
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.05)
    return sorted(pids)


def remove_cgroup_root(name: str) -> list[Path]:
    """rmdir ``/<name>`` and everything below it in every hierarchy; returns what stayed."""
    left = []
    for hierarchy in cgroup_hierarchies():
        root = hierarchy / name
        if not root.is_dir():
            continue
        dirs = sorted(
            (Path(d) for d, _, _ in os.walk(root)), key=lambda p: len(p.parts), reverse=True
        )
        for d in dirs:
            for _ in range(20):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)  # a just-killed task may still be leaving
            else:
                left.append(d)
    return left


def processes_in_netns(inode: int, exe: Path | None = None) -> list[int]:
    """PIDs whose network namespace is ``inode`` (optionally running ``exe``)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if (proc / "ns" / "net").stat().st_ino != inode:
                continue
            if exe is not None and (proc / "exe").readlink() != exe:
                continue
        except OSError:
            continue
        found.append(int(proc.name))
    return found


def remove_links_into(directory: Path, target_prefix: Path) -> int:
    """Remove symlinks in ``directory`` that point below ``target_prefix``."""
    removed = 0
    if not directory.is_dir():
        return 0
    for link in directory.iterdir():
        with contextlib.suppress(OSError):
            if link.is_symlink() and link.readlink().is_relative_to(target_prefix):
                link.unlink()
                removed += 1
    return removed


def remove_matching(directory: Path, prefixes: Iterable[str]) -> int:
    """Remove files in ``directory`` whose name starts with one of ``prefixes``."""
    removed = 0
    if not directory.is_dir():
        return 0
    wanted = tuple(prefixes)
    for entry in directory.iterdir():
        if entry.name.startswith(wanted):
            with contextlib.suppress(OSError):
                entry.unlink()
                removed += 1
    return removed
