"""Locating the control-plane binaries built from the pinned Go modules.

The binaries are never committed; ``scripts/build-k8s.sh`` builds them once
into a cache keyed by version and go.sum and prints that directory (instantly
when cached). A missing binary is an error, never a reason to skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

BIN_DIR_ENV = "DRA_K8S_BIN_DIR"
_NAMES = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager")


class BinariesError(RuntimeError):
    """The control-plane binaries are missing or could not be built."""


@dataclass(frozen=True)
class Binaries:
    etcd: Path
    kube_apiserver: Path
    kube_scheduler: Path
    kube_controller_manager: Path

    @classmethod
    def from_dir(cls, bin_dir: Path) -> Binaries:
        """Use ``bin_dir``; every binary must exist and be executable."""
        missing = [n for n in _NAMES if not os.access(bin_dir / n, os.X_OK)]
        if missing:
            raise BinariesError(
                f"{bin_dir} lacks executable {', '.join(missing)}; "
                "run scripts/build-k8s.sh (or point DRA_K8S_BIN_DIR at its output)"
            )
        return cls(*(bin_dir / n for n in _NAMES))


def repo_root() -> Path | None:
    """The source checkout this package runs from (editable install), if any."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "scripts" / "build-k8s.sh").is_file() else None


def find_binaries(env: Mapping[str, str] | None = None, build: bool = True) -> Binaries:
    """Binaries from ``$DRA_K8S_BIN_DIR``, else from ``scripts/build-k8s.sh``.

    With ``build`` the script may compile (cold: ~20 min); it prints the cached
    directory immediately when the binaries exist.
    """
    env = os.environ if env is None else env
    if env.get(BIN_DIR_ENV):
        return Binaries.from_dir(Path(env[BIN_DIR_ENV]))
    root = repo_root()
    if root is None:
        raise BinariesError(
            f"set {BIN_DIR_ENV} to a directory with {', '.join(_NAMES)} "
            "(no source checkout with scripts/build-k8s.sh found)"
        )
    if not build:
        raise BinariesError(f"{BIN_DIR_ENV} is not set and building was not allowed")
    script = root / "scripts" / "build-k8s.sh"
    result = subprocess.run(
        [str(script)], cwd=root, stdout=subprocess.PIPE, stderr=None, text=True, check=False
    )
    if result.returncode != 0:
        raise BinariesError(f"{script} failed with exit code {result.returncode}")
    lines = result.stdout.strip().splitlines()
    if not lines:
        raise BinariesError(f"{script} printed no bin directory")
    return Binaries.from_dir(Path(lines[-1]))


NODE_DIR_ENV = "DRA_NODE_DIR"
_NODE_FILES = (
    "bin/kubelet",
    "bin/containerd",
    "bin/containerd-shim-runc-v2",
    "bin/ctr",
    "bin/cri-reset",
    "cni/bridge",
    "cni/host-local",
    "images/pause.tar",
    "images/busybox.tar",
)


@dataclass(frozen=True)
class NodeBinaries:
    """The real node's components (``scripts/build-node.sh``) plus the host's runc."""

    root: Path
    runc: Path

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"

    @property
    def cni_dir(self) -> Path:
        return self.root / "cni"

    def bin(self, name: str) -> Path:
        return self.root / "bin" / name

    def image(self, name: str) -> Path:
        return self.root / "images" / f"{name}.tar"

    @classmethod
    def from_dir(cls, root: Path) -> NodeBinaries:
        missing = [f for f in _NODE_FILES if not (root / f).is_file()]
        if missing:
            raise BinariesError(
                f"{root} lacks {', '.join(missing)}; run scripts/build-node.sh "
                f"(or point {NODE_DIR_ENV} at its output)"
            )
        runc = shutil.which("runc") or shutil.which("runc", path="/usr/sbin:/sbin")
        if runc is None:
            raise BinariesError(
                "runc is not installed: run scripts/setup-host.sh (Debian package runc)"
            )
        return cls(root=root, runc=Path(runc))


def find_node_binaries(env: Mapping[str, str] | None = None) -> NodeBinaries:
    """Node components from ``$DRA_NODE_DIR``, else built or reused by scripts/build-node.sh."""
    env = os.environ if env is None else env
    if env.get(NODE_DIR_ENV):
        return NodeBinaries.from_dir(Path(env[NODE_DIR_ENV]))
    root = repo_root()
    if root is None:
        raise BinariesError(f"set {NODE_DIR_ENV} (no source checkout with scripts/ found)")
    script = root / "scripts" / "build-node.sh"
    result = subprocess.run(
        [str(script)], cwd=root, stdout=subprocess.PIPE, stderr=None, text=True, check=False
    )
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise BinariesError(f"{script} failed with exit code {result.returncode}")
    return NodeBinaries.from_dir(Path(lines[-1]))
