"""NVIDIA's ``nvidia-cdi-hook``: the hooks every claim's CDI spec names, and the binary on the host.

A container gets the driver's libraries as bind mounts at their host path relative
to the driver root (NVIDIA's convention), so the image's own loader would find
them only by luck. NVIDIA's specs therefore carry four ``createContainer`` hooks,
run by the runtime (runc, crun) on the host before the container starts, and so
do ours, in NVIDIA's order:

``create-symlinks --link <target>::<path>``
    the SONAME links (``libcuda.so.1 -> libcuda.so.<version>``) and ``.so`` links a
    driver install has, and always ``libcuda.so -> libcuda.so.1``: builds that link
    ``-lcuda`` and programs that ``dlopen("libcuda.so")`` need it.
``enable-cuda-compat --host-driver-version=<version>``
    an image that ships CUDA forward compatibility (``/usr/local/cuda/compat``) newer
    than the host driver gets that ``libcuda`` first in its ld cache.
``update-ldcache --folder <dir>...``
    runs the host's ``ldconfig`` inside the container's root with our library dirs
    added: ``ldconfig -p`` lists ``libcuda``, which Triton (``torch.compile``) needs,
    and RHEL/UBI, Debian and distroless images all find the libraries.
``disable-device-node-modification``
    hides ``ModifyDeviceFiles: 1`` in ``/proc/driver/nvidia/params`` from the
    container, so NVML in it cannot create device nodes for GPUs it was not given.

The binary is NVIDIA's own, built from the toolkit's Go module (``cdi/hook``) and
shipped in the plugin image. The runtime runs it on the host, so at start the plugin
copies it to a host path (default ``<kubelet plugins dir>/<driver name>/``, a dir
the chart mounts at the same path) and runs it once to prove the node can run it
(:func:`install`); a node where that fails is not ready and prepares nothing.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dra_driver.errors import DriverError
from dra_driver.gpu.cdi.spec import Hook

HOOK_BINARY = "nvidia-cdi-hook"
TOOLKIT_HOOK = Path("/usr/bin/nvidia-cdi-hook")
"""Where NVIDIA's container toolkit packages install it (specs built without a plugin
configuration, e.g. in tests that never run a container, name this one)."""
HOOK_ENV = ("NVIDIA_CTK_DEBUG=false",)
"""As NVIDIA's specs set it: the hook logs only failures."""
VERSION_PREFIX = "NVIDIA CDI Hook version"
"""What ``nvidia-cdi-hook --version`` prints first."""


class HookError(DriverError):
    """The node cannot run the CDI hook, so no claim is prepared here."""


@dataclass(frozen=True)
class HookPlacement:
    """``--cdi-hook-path`` and ``--cdi-hook-source``."""

    path: Path
    """Where the container runtime runs the hook, on the host: what the specs name."""
    local: Path
    """Where this process sees that file, to install and check it (the same path for the
    default under the kubelet's plugins dir, which the chart mounts at its host path)."""
    source: Path | None
    """The binary to install at :attr:`path` (a bare name: found on ``PATH``, as the
    image's ``/usr/local/bin/nvidia-cdi-hook``); None: an administrator put one there
    (e.g. the toolkit's), which is only checked."""


def driver_hooks(
    hook: str,
    *,
    driver_version: str,
    links: Sequence[tuple[str, str]],
    lib_dirs: Sequence[str],
) -> tuple[Hook, ...]:
    """The spec-level hooks for the driver's libraries: ``links`` are ``(target, link
    path in the container)``, ``lib_dirs`` the container dirs holding libraries."""

    def make(*args: str) -> Hook:
        return Hook(hook_name="createContainer", path=hook, args=(HOOK_BINARY, *args), env=HOOK_ENV)

    hooks = []
    if links:
        pairs = (a for target, path in links for a in ("--link", f"{target}::{path}"))
        hooks.append(make("create-symlinks", *pairs))
    hooks.append(make("enable-cuda-compat", f"--host-driver-version={driver_version}"))
    if lib_dirs:
        hooks.append(make("update-ldcache", *(a for d in lib_dirs for a in ("--folder", d))))
    hooks.append(make("disable-device-node-modification"))
    return tuple(hooks)


def install(source: Path | None, target: Path, *, timeout_s: float = 10.0) -> str:
    """Put ``source`` at ``target`` (unless it is already there) and run it once; "" when
    the runtime can use ``target``, else why not, in one line. ``source`` None: use
    whatever an administrator installed at ``target``."""
    if not target.is_absolute():
        return f"CDI hook path {target} is not absolute"
    if source is not None and not source.is_absolute():
        found = shutil.which(source)
        if found is None:
            return (
                f"no {source} on PATH to install at {target}: set --cdi-hook-source, or "
                "--cdi-hook-source=none with NVIDIA's own hook installed at --cdi-hook-path"
            )
        source = Path(found)
    try:
        if source is not None:
            _copy(source, target)
        problem = _unsafe(target)
    except OSError as exc:
        what = "install" if source is not None else "check"
        where = exc.filename or source
        return f"cannot {what} the CDI hook {target}: {exc.strerror or exc} ({where})"
    return problem or _runs(target, timeout_s)


def _copy(source: Path, target: Path) -> None:
    """Atomically: a runtime may run the old binary while we replace it."""
    data = source.read_bytes()
    try:
        if target.read_bytes() == data and os.access(target, os.X_OK):
            return
    except FileNotFoundError:
        pass
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            os.fchmod(out.fileno(), 0o755)
            out.flush()
            os.fsync(out.fileno())
        Path(tmp).replace(target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _unsafe(target: Path) -> str:
    """The hook runs as root on the host: nobody but its owner may replace it."""
    for path in (target, target.parent):
        mode = path.stat().st_mode
        if mode & (stat.S_IWGRP | stat.S_IWOTH):
            return f"CDI hook {target}: {path} is writable by others (mode {stat.S_IMODE(mode):o})"
    return ""


def _runs(target: Path, timeout_s: float) -> str:
    try:
        done = subprocess.run(
            [str(target), "--version"], capture_output=True, text=True, timeout=timeout_s,
            check=False, env={"PATH": "/usr/bin:/bin"},
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"CDI hook {target} cannot run: {exc}"
    if done.returncode != 0 or not done.stdout.startswith(VERSION_PREFIX):
        said = (done.stderr or done.stdout).strip().splitlines()
        return (
            f"CDI hook {target} --version exited {done.returncode}"
            + (f": {said[-1]}" if said else "")
            + f" (expected {VERSION_PREFIX!r})"
        )
    return ""
