"""How a background loop retries after a failure: never at once, and quietly.

A loop that retries a failure at once spins: with a corrupt checkpoint the claim
book's loop used a whole core and wrote 4 MB of tracebacks a second. Every
background loop (claim book, status writer, slice publisher and watch, stale-claim
cleanup, health monitor, usage sampler) takes a :class:`Retry`:

- the delay before the next try grows (``initial_s`` doubling up to ``max_s``, with
  jitter so a thousand nodes do not retry in step) and starts over after a success;
- the failure is logged in full the first time (with its traceback when it is not one
  of our own errors, which carry their explanation in the message), then as one line
  with a count at most every ``log_every_s``, and once more when the loop recovers.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

from dra_driver.errors import DriverError


class Retry:
    """The retry state of one loop; used from that loop's thread only."""

    def __init__(
        self,
        what: str,
        logger: logging.Logger,
        *,
        initial_s: float = 0.5,
        max_s: float = 60.0,
        log_every_s: float = 300.0,
        level: int = logging.WARNING,
        paced: bool = True,
        clock: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        """``what`` names the loop's work in the log ("claim book refresh"); ``paced``
        False: the caller keeps its own pace (an interval) and uses only the logging."""
        self._what = what
        self._log = logger
        self._initial_s, self._max_s = initial_s, max_s
        self._log_every_s = log_every_s
        self._level = level
        self._paced = paced
        self._clock = clock
        self._jitter = jitter
        self._delay = 0.0
        self.failures = 0
        """Failures in a row (0 after a success)."""
        self._logged_at = 0.0
        self._unlogged = 0

    def failed(self, exc: BaseException) -> float:
        """Record a failure and log it as the rules above say; returns how long to wait
        before the next try."""
        self.failures += 1
        self._delay = min(self._max_s, self._delay * 2 if self._delay else self._initial_s)
        delay = self._delay * (0.8 + 0.4 * self._jitter())
        now = self._clock()
        when = f", retrying in {delay:.1f}s" if self._paced else ""
        if self.failures == 1:
            self._log.log(
                self._level, "%s failed%s: %s", self._what, when, exc,
                exc_info=None if isinstance(exc, DriverError) else exc,
            )  # fmt: skip
            self._logged_at, self._unlogged = now, 0
        elif now - self._logged_at >= self._log_every_s:
            self._log.log(
                self._level, "%s still failing (%d times in a row, %d since last said%s): %s",
                self._what, self.failures, self._unlogged + 1, when, exc,
            )  # fmt: skip
            self._logged_at, self._unlogged = now, 0
        else:
            self._unlogged += 1
        return delay

    def succeeded(self) -> None:
        """Start over; say so when this ends a run of failures."""
        if self.failures:
            self._log.info("%s works again after %d failures", self._what, self.failures)
        self.failures = 0
        self._delay = 0.0
