"""Keys to reconcile, as client-go's work queue holds them.

A key added many times before a worker takes it is done once; a key being worked on
is never handed to a second worker, and one added meanwhile is done again after.
:meth:`WorkQueue.add_after` brings a key back later (a retry with backoff, or a wait
for pods to go); :meth:`WorkQueue.failures` counts a key's failures in a row for that
backoff.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class ShutDown(Exception):
    """The queue was shut down: the worker ends."""


class WorkQueue(Generic[K]):
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: deque[K] = deque()
        self._queued: set[K] = set()
        self._active: set[K] = set()
        self._dirty: set[K] = set()
        self._later: list[tuple[float, int, K]] = []
        self._seq = itertools.count()
        self._failures: dict[K, int] = {}
        self._closed = False

    def add(self, key: K) -> None:
        with self._cond:
            if self._closed:
                return
            if key in self._active:
                self._dirty.add(key)
            elif key not in self._queued:
                self._queued.add(key)
                self._queue.append(key)
                self._cond.notify()

    def add_after(self, key: K, delay_s: float) -> None:
        with self._cond:
            heapq.heappush(self._later, (time.monotonic() + delay_s, next(self._seq), key))
            self._cond.notify()

    def get(self) -> K:
        """The next key (blocks); the caller must call :meth:`done` with it."""
        with self._cond:
            while True:
                if self._closed:
                    raise ShutDown
                self._promote()
                if self._queue:
                    key = self._queue.popleft()
                    self._queued.discard(key)
                    self._active.add(key)
                    return key
                wait = self._later[0][0] - time.monotonic() if self._later else None
                self._cond.wait(wait)

    def done(self, key: K) -> None:
        with self._cond:
            self._active.discard(key)
            if key in self._dirty:
                self._dirty.discard(key)
                self._queued.add(key)
                self._queue.append(key)
                self._cond.notify()

    def failures(self, key: K, failed: bool) -> int:
        """Records the outcome of one attempt; returns the failures in a row so far."""
        with self._cond:
            count = self._failures.get(key, 0) + 1 if failed else 0
            if count:
                self._failures[key] = count
            else:
                self._failures.pop(key, None)
            return count

    def shut_down(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _promote(self) -> None:
        now = time.monotonic()
        while self._later and self._later[0][0] <= now:
            _, _, key = heapq.heappop(self._later)
            if key in self._active:
                self._dirty.add(key)
            elif key not in self._queued:
                self._queued.add(key)
                self._queue.append(key)
