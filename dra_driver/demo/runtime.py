"""The container-runtime step the kubelet harness leaves out, done for real.

What containerd does with the CDI IDs the kubelet passes over CRI: the CDI
harness (tests/go/cdi, the real tags.cncf.io/container-device-interface
library) resolves them against the node's CDI spec directory and edits an OCI
spec; ``runc`` then runs that spec on a busybox root filesystem. Needs root,
``runc`` and ``busybox`` (Debian: runc, busybox-static). Test/demo tooling.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

CDI_HARNESS_ENV = "DRA_CDI_HARNESS"
APPLETS = ("sh", "ls", "cat", "env", "grep", "sort", "stat", "test", "echo", "sleep", "tr")


class ContainerRuntimeError(RuntimeError):
    """A piece of the runtime step is missing or failed (the message says which)."""


def find_cdi_harness(repo: Path, env: Mapping[str, str] | None = None) -> Path:
    """``$DRA_CDI_HARNESS`` or the binary built (and cached) by scripts/build-cdi-harness.sh."""
    env = os.environ if env is None else env
    if env.get(CDI_HARNESS_ENV):
        return Path(env[CDI_HARNESS_ENV])
    result = subprocess.run(
        [str(repo / "scripts" / "build-cdi-harness.sh")],
        cwd=repo,
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    )
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise ContainerRuntimeError(f"scripts/build-cdi-harness.sh failed ({result.returncode})")
    return Path(lines[-1])


def missing_tools() -> list[str]:
    """What this machine lacks to run containers (empty when all is there)."""
    missing = [t for t in ("runc", "busybox") if shutil.which(t) is None]
    if os.geteuid() != 0:
        missing.append("root (runc needs it here)")
    return missing


@dataclass(frozen=True)
class ContainerRun:
    """Outcome of one container: what it printed and how long each step took."""

    returncode: int
    stdout: str
    stderr: str
    oci_spec: dict[str, object]
    inject_s: float
    run_s: float


class ContainerRuntime:
    """Runs one container per call from CDI IDs, like containerd + runc would."""

    def __init__(self, *, cdi_harness: Path, workdir: Path) -> None:
        if missing := missing_tools():
            raise ContainerRuntimeError("cannot run containers: missing " + ", ".join(missing))
        self.cdi_harness = cdi_harness
        self.workdir = workdir
        self.state = workdir / "runc-state"
        self._rootfs = workdir / "rootfs"
        self._base: dict[str, object] | None = None

    def _base_spec(self) -> dict[str, object]:
        """A busybox root filesystem and runc's default spec, made once."""
        if self._base is None:
            bin_dir = self._rootfs / "bin"
            bin_dir.mkdir(parents=True, exist_ok=True)
            busybox = shutil.which("busybox")
            assert busybox is not None
            shutil.copy(busybox, bin_dir / "busybox")
            for applet in APPLETS:
                link = bin_dir / applet
                if not link.is_symlink():
                    link.symlink_to("busybox")
            for d in ("dev", "proc", "sys", "tmp", "etc"):
                (self._rootfs / d).mkdir(exist_ok=True)
            spec_dir = self.workdir / "runc-default"
            spec_dir.mkdir(parents=True, exist_ok=True)
            (spec_dir / "config.json").unlink(missing_ok=True)
            subprocess.run(["runc", "spec", "--bundle", str(spec_dir)], check=True)
            self._base = json.loads((spec_dir / "config.json").read_text())
        return self._base

    def run(
        self,
        *,
        cdi_dirs: Sequence[Path],
        cdi_ids: Sequence[str],
        argv: Sequence[str],
        name: str = "",
        timeout: float = 60.0,
        rootfs: Path | None = None,
    ) -> ContainerRun:
        """Inject ``cdi_ids`` with the real CDI library, then ``runc run`` ``argv`` on
        ``rootfs`` (default: a busybox root filesystem shared by every call). The spec's
        hooks run as containerd would have them run, and may change ``rootfs``."""
        base = json.loads(json.dumps(self._base_spec()))
        process = base["process"]
        assert isinstance(process, dict)
        process["terminal"] = False
        process["args"] = list(argv)
        root = base["root"]
        assert isinstance(root, dict)
        root["path"] = str(rootfs or self._rootfs)
        root["readonly"] = False
        container = name or f"c-{uuid.uuid4().hex[:10]}"
        bundle = self.workdir / "bundles" / container
        bundle.mkdir(parents=True, exist_ok=True)
        (bundle / "base.json").write_text(json.dumps(base))
        t0 = time.monotonic()
        dirs = [arg for d in cdi_dirs for arg in ("-spec-dir", str(d))]
        inject = subprocess.run(
            [str(self.cdi_harness), *dirs, "-base", str(bundle / "base.json"),
             "-out", str(bundle / "config.json"), *cdi_ids],
            capture_output=True, text=True, check=False, timeout=timeout,
        )  # fmt: skip
        t1 = time.monotonic()
        if inject.returncode != 0:
            return ContainerRun(inject.returncode, "", inject.stderr, {}, t1 - t0, 0.0)
        oci: dict[str, object] = json.loads((bundle / "config.json").read_text())
        try:
            done = subprocess.run(
                ["runc", "--root", str(self.state), "run", "--no-pivot",
                 "--bundle", str(bundle), container],
                capture_output=True, text=True, check=False, timeout=timeout,
            )  # fmt: skip
        finally:
            with contextlib.suppress(OSError):
                subprocess.run(
                    ["runc", "--root", str(self.state), "delete", "-f", container],
                    capture_output=True, check=False, timeout=30,
                )  # fmt: skip
        return ContainerRun(
            done.returncode, done.stdout, done.stderr, oci, t1 - t0, time.monotonic() - t1
        )
