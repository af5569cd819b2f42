"""Socket and lock-file layout of a kubelet plugin, and safe socket handling.

Layout (docs/dra-spec.md section 1), both roots configurable because the kubelet
root dir can move:

- registration: ``<registry_dir>/<driver>-reg.sock`` (rolling update:
  ``<driver>-<uid>-reg.sock``) -- the kubelet's plugin watcher finds it here;
- DRA service: ``<plugins_dir>/<driver>/dra.sock`` (rolling update:
  ``dra-<uid>.sock``);
- ``<plugins_dir>/<driver>/serialize.lock`` serialises prepare/unprepare
  across two overlapping plugin instances during a rolling update, for
  backends that run one claim at a time (a ``ParallelClaims`` backend orders
  claims itself).

Sockets are bound inside a private ``0700`` directory, get their final mode
there, and are then renamed into place, so no other user ever sees a socket
with looser permissions and the kubelet never sees a half-set-up one.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from dra_driver.errors import DriverError

MAX_SOCKET_PATH = 107
"""sun_path holds 108 bytes including the terminating NUL."""


class SocketError(DriverError):
    """A socket path is unusable (too long, or a foreign non-socket file in the way)."""


@dataclass(frozen=True)
class SocketPaths:
    registration: Path
    dra: Path
    lock: Path
    plugin_dir: Path


def socket_paths(
    *, driver: str, registry_dir: Path, plugins_dir: Path, rolling_update_uid: str | None
) -> SocketPaths:
    """Where this plugin instance listens; UID-suffixed in rolling-update mode.

    Paths are made absolute: the kubelet rejects a relative endpoint."""
    registry_dir = registry_dir.absolute()
    plugin_dir = plugins_dir.absolute() / driver
    if rolling_update_uid:
        reg = registry_dir / f"{driver}-{rolling_update_uid}-reg.sock"
        if len(os.fsencode(reg)) > MAX_SOCKET_PATH:
            digest = hashlib.sha256(f"{driver}/{rolling_update_uid}".encode()).hexdigest()[:16]
            reg = registry_dir / f"{digest}-reg.sock"
        dra = plugin_dir / f"dra-{rolling_update_uid}.sock"
        if len(os.fsencode(dra)) > MAX_SOCKET_PATH:  # a long driver name in a deep root
            digest = hashlib.sha256(f"{driver}/{rolling_update_uid}".encode()).hexdigest()[:16]
            dra = plugin_dir / f"dra-{digest}.sock"
    else:
        reg = registry_dir / f"{driver}-reg.sock"
        dra = plugin_dir / "dra.sock"
    for path in (reg, dra):
        if len(os.fsencode(path)) > MAX_SOCKET_PATH:
            raise SocketError(
                f"socket path {path} is {len(os.fsencode(path))} bytes; unix sockets allow at "
                f"most {MAX_SOCKET_PATH}: choose shorter --registry-dir/--plugins-dir"
            )
    return SocketPaths(
        registration=reg, dra=dra, lock=plugin_dir / "serialize.lock", plugin_dir=plugin_dir
    )


def remove_stale_socket(path: Path) -> bool:
    """Remove our own leftover socket; refuse to delete anything that is not a socket."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return False
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketError(f"{path} exists and is not a socket; refusing to remove it")
    path.unlink(missing_ok=True)
    return True


@contextmanager
def staging_dir(final_dir: Path) -> Iterator[Path]:
    """A private ``.``-prefixed dir next to the final socket (same filesystem, ignored by
    the kubelet's watcher), removed afterwards."""
    final_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".staging-", dir=final_dir))
    try:
        yield tmp
    finally:
        for leftover in tmp.iterdir():
            leftover.unlink(missing_ok=True)
        tmp.rmdir()


def secure_and_place(staged: Path, final: Path, *, group: int | None) -> None:
    """Give a freshly bound socket its mode (0600, or 0660 for ``group``), then move it."""
    if group is None:
        staged.chmod(0o600)
    else:
        os.chown(staged, -1, group)
        staged.chmod(0o660)
    remove_stale_socket(final)
    staged.rename(final)


class FileLock:
    """Cross-process exclusive lock (``flock``) on a file; one open per acquisition so
    threads of one process exclude each other too."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @contextmanager
    def held(self) -> Iterator[None]:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the flock
