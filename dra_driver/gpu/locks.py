"""Named exclusive locks held by one thread of one process at a time, node-wide.

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

import fcntl
import os
import re
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from dra_driver.errors import DriverError

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
