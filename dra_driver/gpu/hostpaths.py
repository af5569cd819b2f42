"""Where the host's files are, so emulation and tests can move them.

Discovery and CDI generation never open ``/sys``, ``/proc`` or ``/dev``
directly; they ask :class:`HostPaths`. On a GPU node both roots are ``/`` (or
the driver root is ``/run/nvidia/driver`` with the GPU operator); under
emulation they point into a temporary tree that looks like a real node.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


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
