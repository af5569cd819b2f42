"""Where the host's files are, so emulation and tests can move them.

Discovery and CDI generation never open ``/sys``, ``/proc`` or ``/dev``
directly; they ask :class:`HostPaths`. On a GPU node the host root is ``/``
and the driver root is wherever the driver was installed: ``/`` for a distro
or runfile install, ``/run/nvidia/driver`` with the GPU Operator,
``/usr/local/nvidia`` (``bin/``, ``lib64/``) on GKE-style nodes. Under
emulation both point into a temporary tree that looks like a real node.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

LIB_DIRS = (
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib64",
    "usr/lib",
    "lib/x86_64-linux-gnu",
    "lib64",
)
"""Library dirs searched under a driver root, most specific first."""
BIN_DIRS = ("usr/bin", "usr/local/bin", "bin")
"""Binary dirs searched under a driver root (``bin`` for the GKE layout)."""
DRIVER_ROOT_CANDIDATES = (
    ".",  # the host root itself (a distro or runfile install)
    "run/nvidia/driver",
    "usr/local/nvidia",
    "home/kubernetes/bin/nvidia",
)
"""Where drivers are installed, in the order :func:`find_driver_root` tries them."""


@dataclass(frozen=True)
class HostPaths:
    root: Path = Path("/")
    """Root under which ``sys/``, ``proc/`` and ``dev/`` of the host are found."""
    driver_root: Path = Path("/")
    """Root of the NVIDIA driver installation (libraries, binaries, firmware)."""

    def sys(self, *parts: str) -> Path:
        return self.root.joinpath("sys", *parts)

    def proc(self, *parts: str) -> Path:
        return self.root.joinpath("proc", *parts)

    def dev(self, *parts: str) -> Path:
        return self.root.joinpath("dev", *parts)

    def driver(self, *parts: str) -> Path:
        return self.driver_root.joinpath(*parts)

    def driver_tool(self, name: str) -> Path:
        """``name`` in the first of :data:`BIN_DIRS` under the driver root that has it.

        Falls back to ``usr/bin/<name>``, so an error names the usual place.
        """
        for rel in BIN_DIRS:
            path = self.driver(rel, name)
            if path.is_file():
                return path
        return self.driver("usr", "bin", name)

    def driver_lib_dirs(self) -> list[Path]:
        """Library dirs under the driver root that hold NVML (``libnvidia-ml.so.1``)."""
        return [
            self.driver(rel)
            for rel in LIB_DIRS
            if self.driver(rel, "libnvidia-ml.so.1").exists() and not self.driver(rel).is_symlink()
        ]


def find_driver_root(host: HostPaths) -> Path | None:
    """The first of :data:`DRIVER_ROOT_CANDIDATES` (under the host root) that holds
    NVML itself: a regular ``libnvidia-ml.so.<version>``, not a symlink into another root.

    For nodes where no driver root was configured: a plugin that guessed ``/``
    on a GKE-style node (``/usr/lib/libcuda.so.1`` a link into ``/usr/local/nvidia``,
    ``/usr/bin/nvidia-smi`` a wrapper script) would hand containers no libraries.
    """
    for candidate in DRIVER_ROOT_CANDIDATES:
        root = host.root / candidate
        for rel in LIB_DIRS:
            libdir = root / rel
            if libdir.is_dir() and not libdir.is_symlink():
                for lib in libdir.glob("libnvidia-ml.so.*"):
                    if lib.is_file() and not lib.is_symlink() and lib.name != "libnvidia-ml.so.1":
                        return root
    return None
