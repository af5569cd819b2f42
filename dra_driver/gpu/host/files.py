"""The node's files: atomic writes and reads of small files, and node-wide named locks.

Writes (CDI specs, the checkpoint) put a complete temp file or spare in the
target's dir and swap it in with one ``renameat2``/``rename``
(:func:`write_atomic`, :func:`write_via_spare`): readers see the old or the new
file, never a mix. Their errors are :class:`CdiError` (named for the specs it was
first raised for), with a reason a person can act on.

Locks: named exclusive locks held by one thread of one process at a time, node-wide.
Each name is a file ``<dir>/<name>.lock`` locked with ``flock`` (so a second
plugin process during a rolling update is excluded too) behind a
``threading.Lock`` (so threads of this process queue on the in-process lock
and hand over without polling; ``flock`` polling happens only while another
process holds the file, which is rare). The file descriptors stay open for the
life of the process: one per name ever used, i.e. per GPU plus the checkpoint.

Names are taken in sorted order, so two callers that want overlapping sets
never deadlock. A wait longer than its timeout raises :class:`LockTimeout`.
:meth:`NodeLocks.hold_if_free` never waits: a caller that already holds a lock
taken after these (the checkpoint's, after a GPU's) may use it.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import functools
import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from dra_driver.errors import DriverError


class CdiError(DriverError):
    """A CDI spec we built is invalid, or a spec or the checkpoint cannot be written or
    removed (the name is older than the second use)."""


Opener = Callable[[Path], tuple[int, str]]
"""Creates a temp file next to the target, returns ``(fd, path)``; tests inject faults here."""


def default_opener(target: Path) -> tuple[int, str]:
    """``<target>.<pid>.<thread>.tmp``, created new (never truncated: ext4 flushes a file
    truncated over old data when it is closed)."""
    tmp = f"{target}.{os.getpid()}.{threading.get_ident()}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    try:
        return os.open(tmp, flags, 0o600), tmp
    except FileExistsError:  # left by a killed process that had the same PID
        Path(tmp).unlink()
        return os.open(tmp, flags, 0o600), tmp


def temp_files_for(target: Path) -> list[Path]:
    """Leftover temp files of an interrupted write (never ``.json``, so never loaded):
    ``<target name>.*.tmp``, by a directory scan (every unprepare asks; glob's pattern
    machinery cost more than the rest of removing a spec)."""
    prefix = f"{target.name}."
    try:
        with os.scandir(target.parent) as entries:
            names = [
                e.name
                for e in entries
                if e.name.startswith(prefix)
                and e.name.endswith(".tmp")
                and len(e.name) >= len(prefix) + 4
            ]
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [target.parent / name for name in sorted(names)]


@functools.cache
def _renameat2() -> Callable[..., int] | None:
    try:
        fn: Callable[..., int] = ctypes.CDLL(None, use_errno=True).renameat2
    except AttributeError:  # glibc < 2.28
        return None
    return fn


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _exchange(tmp: str, target: Path) -> bool:
    """Swap ``tmp`` and ``target`` atomically (``renameat2(RENAME_EXCHANGE)``); False when
    the target does not exist or the filesystem cannot exchange."""
    fn = _renameat2()
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(tmp), _AT_FDCWD, os.fsencode(target), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOENT, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(target))


def _write_all(fd: int, data: bytes) -> None:
    """Plain descriptor calls, no buffered file object: every prepare and unprepare
    writes a spec or the checkpoint."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_atomic(target: Path, data: bytes, *, mode: int, opener: Opener = default_opener) -> None:
    """A complete temp file in the same dir takes the place of ``target`` in one step.

    Readers (runtimes watching the dir with inotify) see either the old or the new
    file, never a mix, and a process killed mid-write leaves only a temp file (never
    ``.json``, so never loaded). An existing target is *exchanged* with the temp file
    (``renameat2(RENAME_EXCHANGE)``) and the old content unlinked: as atomic as a
    rename over it, but without ext4's flush of the new data on such a rename
    (``auto_da_alloc``: 1.4 ms here, most of a checkpoint write). That flush, like an
    fsync, would only protect against a power loss, and after the reboot that
    follows every spec and checkpoint entry we wrote is stale (the checkpoint
    discards the previous boot's claims and removes their specs; the kubelet
    prepares running pods' claims again). On any error the temp file is removed and
    nothing else changes.
    """
    try:
        fd, tmp = opener(target)
    except OSError as exc:
        raise CdiError(f"create temp file in {target.parent}: {os_reason(exc)}") from exc
    try:
        try:
            _write_all(fd, data)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        if not _exchange(tmp, target):
            # No target yet: a plain rename, nothing to flush. os, not pathlib: every
            # prepare and unprepare writes here, and Path objects cost more than the call.
            os.replace(tmp, target)  # noqa: PTH105
    except OSError as exc:
        _unlink_missing_ok(tmp)
        raise CdiError(f"write {target}: {os_reason(exc)}") from exc
    _unlink_missing_ok(tmp)  # the old content, after an exchange


def write_via_spare(target: Path, spare: Path, data: bytes, *, mode: int) -> None:
    """:func:`write_atomic` for a file only one writer at a time changes (the caller holds
    a lock that every writer takes), reusing one inode instead of creating a temp file.

    ``spare`` (never ``*.json``, so never loaded) is overwritten in place and exchanged
    with ``target``; the exchange leaves the old content in ``spare`` for the next
    write. Readers see the old or the new file, never a mix; a process killed
    mid-write leaves a torn spare, which is only ever overwritten. Creating an inode per
    write cost ext4 more than the rest of the write (it scans past recently deleted
    inodes: 3.6 % of the plugin's CPU in a prepare burst, docs/benchmarks.md). The
    spare is cut to the new length, never to zero first: ext4 flushes a file truncated
    to zero when it is closed (``auto_da_alloc``), as :func:`default_opener` notes. On
    an error the target is unchanged; the spare may hold anything.
    """
    try:
        fd = os.open(spare, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        raise CdiError(f"open {spare}: {os_reason(exc)}") from exc
    try:
        try:
            _write_all(fd, data)
            os.ftruncate(fd, len(data))
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        if not _exchange(str(spare), target):
            spare.replace(target)  # the first write: nothing to exchange with
    except OSError as exc:
        raise CdiError(f"write {target}: {os_reason(exc)}") from exc


def read_whole(path: Path | str) -> bytes:
    """A small file's bytes with plain descriptor calls (no buffered file object: the
    checkpoint and ``/proc/devices`` are read on every prepare). Raises OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def _unlink_missing_ok(path: str) -> None:
    try:
        os.unlink(path)  # noqa: PTH108 (see write_atomic)
    except FileNotFoundError:
        pass


def os_reason(exc: OSError) -> str:
    if exc.errno == errno.ENOSPC:
        return "no space left on device"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"not writable ({exc.strerror})"
    return exc.strerror or str(exc)


_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{0,100}$")


class LockTimeout(DriverError):
    """A lock stayed held by someone else for longer than the caller would wait."""

    def __init__(self, name: str, timeout_s: float, other_process: bool) -> None:
        holder = "another process (a second plugin instance?)" if other_process else "this process"
        super().__init__(f"lock {name!r} was held by {holder} for more than {timeout_s:g}s")
        self.name = name


class _Lock:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.thread_lock = threading.Lock()
        self._fd: int | None = None

    def _descriptor(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        return self._fd

    def acquire(self, name: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        if not self.thread_lock.acquire(timeout=timeout_s):
            raise LockTimeout(name, timeout_s, other_process=False)
        try:
            fd = self._descriptor()
            delay = 0.001
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise LockTimeout(name, timeout_s, other_process=True) from None
                    time.sleep(delay)
                    delay = min(delay * 2, 0.02)
        except BaseException:
            self.thread_lock.release()
            raise

    def try_acquire(self) -> bool:
        """Take the lock if nobody holds it now; never waits."""
        if not self.thread_lock.acquire(blocking=False):
            return False
        try:
            fcntl.flock(self._descriptor(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            self.thread_lock.release()
            return False
        except BaseException:
            self.thread_lock.release()
            raise

    def release(self) -> None:
        try:
            if self._fd is not None:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self.thread_lock.release()


class NodeLocks:
    def __init__(self, directory: Path) -> None:
        self._dir = directory
        self._guard = threading.Lock()
        self._locks: dict[str, _Lock] = {}

    def path(self, name: str) -> Path:
        return self._dir / f"{name}.lock"

    def _get(self, name: str) -> _Lock:
        if not _NAME.match(name):
            raise ValueError(f"lock name {name!r} is not a plain lower-case name")
        with self._guard:
            lock = self._locks.get(name)
            if lock is None:
                self._dir.mkdir(mode=0o700, parents=True, exist_ok=True)
                lock = self._locks[name] = _Lock(self.path(name))
            return lock

    def acquire(self, names: Iterable[str], *, timeout_s: float) -> list[_Lock]:
        """Take every lock in ``names`` (sorted, so overlapping sets never deadlock);
        give the result to :meth:`release`. Nothing stays held when this raises."""
        taken = self._take(names, timeout_s)
        assert taken is not None  # a waiting take gets every lock or raises
        return taken

    def _take(self, names: Iterable[str], timeout_s: float | None) -> list[_Lock] | None:
        """Without waiting when ``timeout_s`` is None."""
        taken: list[_Lock] = []
        try:
            for name in sorted(set(names)):
                lock = self._get(name)
                if timeout_s is not None:
                    lock.acquire(name, timeout_s)
                elif not lock.try_acquire():
                    self.release(taken)
                    return None
                taken.append(lock)
        except BaseException:
            self.release(taken)
            raise
        return taken

    @staticmethod
    def release(taken: list[_Lock]) -> None:
        """Empties ``taken``, in reverse order; every one, even when releasing one fails."""
        try:
            while taken:
                taken.pop().release()
        finally:
            for lock in reversed(taken):
                lock.release()

    def hold(self, names: Iterable[str], *, timeout_s: float) -> _Holding:
        """:meth:`acquire` for a ``with`` block (a class, not a generator: every
        checkpoint transaction and claim call takes this path)."""
        return _Holding(self, names, timeout_s)

    def hold_if_free(self, names: Iterable[str]) -> _Holding:
        """Hold every lock in ``names`` for a ``with`` block if none is held now, without
        waiting; the block gets whether it holds them (if not, nothing is held). Safe
        while holding a lock that holders of these take after them: nothing waits, so no
        deadlock."""
        return _Holding(self, names, None)

    def close(self) -> None:
        with self._guard:
            for lock in self._locks.values():
                if lock._fd is not None:
                    os.close(lock._fd)
                    lock._fd = None
            self._locks.clear()


class _Holding:
    """Takes the locks when the ``with`` block starts (without waiting when
    ``timeout_s`` is None), releases them when it ends."""

    __slots__ = ("_locks", "_names", "_taken", "_timeout_s")

    def __init__(self, locks: NodeLocks, names: Iterable[str], timeout_s: float | None) -> None:
        self._locks, self._names, self._timeout_s = locks, names, timeout_s
        self._taken: list[_Lock] | None = None

    def __enter__(self) -> bool:
        self._taken = self._locks._take(self._names, self._timeout_s)
        return self._taken is not None

    def __exit__(self, *exc_info: object) -> None:
        if self._taken is not None:
            self._locks.release(self._taken)
            self._taken = None
