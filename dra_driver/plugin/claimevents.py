"""What happens to claims on the prepare path, for the parts that watch it.

:class:`~dra_driver.plugin.preparing.ClaimService` reports every outcome to one
:class:`ClaimEvents`; :class:`ClaimActivity` fans it out to the operation
metrics, the claim status writer and the prepared-claim book. A watcher never
affects the kubelet's answer: its errors are logged and swallowed here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from dra_driver.plugin.backend import PreparedDevice
from dra_driver.plugin.claimbook import PreparedClaimBook
from dra_driver.plugin.claims import ClaimRef
from dra_driver.plugin.claimstatus import ClaimStatusWriter

if TYPE_CHECKING:
    from dra_driver.plugin.metrics import OperationMetrics

_REASONS = {
    "ClaimError": "claim",
    "KubeError": "api",
    "KubeConnectionError": "api",
    "KubeApiError": "api",
    "NotFoundError": "api",
    "ConfigError": "config",
    "ToolError": "tool",
    "CheckpointError": "checkpoint",
    "CheckpointCorruptError": "checkpoint",
    "CdiError": "cdi",
    "LockTimeout": "lock",
    "NvmlError": "nvml",
}
"""Exception class name -> ``reason`` label (a bounded set; anything else is ``other``)."""


def reason_of(error: BaseException) -> str:
    """The most specific known cause in the exception chain; ``internal`` for bugs."""
    seen: BaseException | None = error
    found = None
    while seen is not None:
        found = _REASONS.get(type(seen).__name__, found)
        seen = seen.__cause__
    if found is not None:
        return found
    if any(c.__name__ == "DriverError" for c in type(error).__mro__):
        return "backend"
    return "internal"


class ClaimEvents(Protocol):
    def prepared(
        self,
        ref: ClaimRef,
        obj: dict[str, Any] | None,
        devices: Sequence[PreparedDevice],
        seconds: float,
    ) -> None:
        """``obj``: the claim as fetched; None when answered from the backend's records."""
        ...

    def unprepared(self, ref: ClaimRef, seconds: float) -> None: ...

    def failed(
        self, operation: str, ref: ClaimRef, error: BaseException, seconds: float
    ) -> None: ...


class ClaimActivity:
    """The plugin's :class:`ClaimEvents`: metrics, claim status and the claim book."""

    def __init__(
        self,
        *,
        logger: logging.Logger,
        metrics: OperationMetrics | None = None,
        status: ClaimStatusWriter | None = None,
        book: PreparedClaimBook | None = None,
        changed: Callable[[], None] = lambda: None,
    ) -> None:
        """``changed`` is called after every prepare and unprepare (the plugin wakes the
        thread that writes claim status)."""
        self._log = logger
        self.metrics = metrics
        """None counts nothing; may be set once later, while claims are served."""
        self._status = status
        self._book = book
        self._changed = changed

    def prepared(
        self,
        ref: ClaimRef,
        obj: dict[str, Any] | None,
        devices: Sequence[PreparedDevice],
        seconds: float,
    ) -> None:
        try:
            if (m := self.metrics) is not None:
                m.observe("prepare", seconds)
            if self._book is not None and obj is not None:  # None: answered from the
                self._book.prepared(ref, obj)  # backend's records; the book has it
            if self._status is not None:
                self._status.prepared(ref, devices)
            self._changed()
        except Exception:
            self._log.exception("recording a prepared claim failed", extra={"claim_uid": ref.uid})

    def unprepared(self, ref: ClaimRef, seconds: float) -> None:
        try:
            if (m := self.metrics) is not None:
                m.observe("unprepare", seconds)
            if self._book is not None:
                self._book.unprepared(ref)
            if self._status is not None:
                self._status.unprepared(ref)
            self._changed()
        except Exception:
            self._log.exception(
                "recording an unprepared claim failed", extra={"claim_uid": ref.uid}
            )

    def failed(self, operation: str, ref: ClaimRef, error: BaseException, seconds: float) -> None:
        if (m := self.metrics) is not None:
            m.observe(operation, seconds, reason_of(error))
