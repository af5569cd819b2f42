"""Polling with a deadline, for tests that wait on controllers."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    check: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    interval: float = 0.2,
    describe: Callable[[], str] | None = None,
) -> T:
    """Call ``check`` until it returns something truthy, and return that.

    On timeout the error names ``what`` was awaited and, if given,
    ``describe()`` (e.g. the object's current state) so a failure explains itself.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() >= deadline:
            detail = f"; {describe()}" if describe else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{detail}")
        time.sleep(interval)
