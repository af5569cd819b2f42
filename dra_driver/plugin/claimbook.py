"""The claims prepared on this node, with their devices and the pods using them.

Fed by the prepare path (a claim prepared or unprepared) and kept current from
the API server: at start it is rebuilt from the backend's prepared claims,
and every ``refresh`` re-reads each claim's ``status.reservedFor`` (pods come
and go on a shared claim without any prepare call: the kubelet prepares a
claim once per node). Per-claim usage metrics read it to label samples with
namespace, claim and pod.

:class:`~dra_driver.plugin.preparing.ClaimService` reports every outcome to one
:class:`ClaimEvents`; :class:`ClaimActivity` fans it out to the operation
metrics, the claim status writer and this book. A watcher never affects the
kubelet's answer: its errors are logged and swallowed there.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from dra_driver.plugin.claims import ClaimRef, PreparedDevice
from dra_driver.plugin.claimstatus import ClaimStatusWriter
from dra_driver.retries import Retry

if TYPE_CHECKING:
    from dra_driver.plugin.metrics import OperationMetrics

ClaimGetter = Callable[[str, str], "dict[str, Any] | None"]


@dataclass(frozen=True)
class PreparedClaim:
    ref: ClaimRef
    devices: tuple[tuple[str, str | None], ...]
    """``(device name, share ID)`` of our driver on this node's pool."""
    pods: tuple[tuple[str, str], ...]
    """``(pod name, pod UID)`` the claim is reserved for."""


def pods_of(obj: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(
        (str(r.get("name", "")), str(r.get("uid", "")))
        for r in (obj.get("status") or {}).get("reservedFor") or []
        if r.get("resource") == "pods"
    )


def devices_of(obj: dict[str, Any], driver: str, pool: str) -> tuple[tuple[str, str | None], ...]:
    results = (((obj.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
        "results"
    ) or []
    return tuple(
        (str(r["device"]), r.get("shareID"))
        for r in results
        if r.get("driver") == driver and r.get("pool") == pool
    )


class PreparedClaimBook:
    def __init__(
        self, *, driver_name: str, pool_name: str, get_claim: ClaimGetter, logger: logging.Logger
    ) -> None:
        self._driver = driver_name
        self._pool = pool_name
        self._get = get_claim
        self._log = logger
        self._lock = threading.Lock()
        self._claims: dict[str, PreparedClaim] = {}

    def prepared(self, ref: ClaimRef, obj: dict[str, Any]) -> None:
        """The claim object as fetched for the prepare that just succeeded."""
        entry = PreparedClaim(ref, devices_of(obj, self._driver, self._pool), pods_of(obj))
        with self._lock:
            self._claims[ref.uid] = entry

    def unprepared(self, ref: ClaimRef) -> None:
        with self._lock:
            self._claims.pop(ref.uid, None)

    def claims(self) -> list[PreparedClaim]:
        with self._lock:
            return list(self._claims.values())

    def reload(self, refs: Iterable[ClaimRef]) -> None:
        """Rebuild from what the backend has prepared (at start, and periodically)."""
        wanted = {r.uid: r for r in refs}
        with self._lock:
            for uid in set(self._claims) - set(wanted):
                del self._claims[uid]
        for ref in wanted.values():
            self._refresh_one(ref)

    def refresh(self) -> None:
        """Re-read the pods of every prepared claim."""
        for entry in self.claims():
            self._refresh_one(entry.ref)

    def _refresh_one(self, ref: ClaimRef) -> None:
        try:
            obj = self._get(ref.namespace, ref.name)
        except Exception as exc:
            self._log.warning("cannot read claim for usage labels: %s", exc,
                              extra={"claim_uid": ref.uid})  # fmt: skip
            return
        if obj is None or (obj.get("metadata") or {}).get("uid") != ref.uid:
            return  # gone or re-created: the stale-claim cleanup unprepares it
        entry = PreparedClaim(ref, devices_of(obj, self._driver, self._pool), pods_of(obj))
        with self._lock:
            self._claims[ref.uid] = entry


@runtime_checkable
class ClaimUsage(Protocol):
    """Optional backend ability: reads the prepared claims (e.g. to label usage metrics)."""

    def watch_claims(self, claims: Callable[[], list[PreparedClaim]]) -> None: ...


class ClaimKeeper:
    """Background thread ``claim-book``: rebuilds the book from the backend at start and
    re-reads the pods of the prepared claims every ``interval_s``; writes claim status
    (new claims, removals, changed health) when the triggers (every prepare, unprepare
    and health change) have settled, and at each interval."""

    def __init__(
        self,
        *,
        book: PreparedClaimBook,
        prepared: Callable[[], Iterable[ClaimRef]],
        status: ClaimStatusWriter | None,
        interval_s: float,
        logger: logging.Logger,
        settle_s: float = 0.25,
        settle_max_s: float = 2.0,
    ) -> None:
        """Status is written once the triggers have been quiet for ``settle_s``, or
        ``settle_max_s`` after the first under steady load: a burst of pods starting
        gets one round of writes after it instead of server-side applies competing with
        its prepares for the API server (measured: they cost it about as much CPU
        again as the claim GETs), and a claim prepared and unprepared within it needs
        none."""
        self._book, self._prepared, self._status = book, prepared, status
        self._interval_s = interval_s
        self._settle_s = settle_s
        self._settle_max_s = settle_max_s
        self._log = logger
        self._stop = threading.Event()
        self._trigger = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="claim-book", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._trigger.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def trigger(self) -> None:
        self._trigger.set()

    def _loop(self) -> None:
        reload, due = True, 0.0
        retry = Retry("claim book refresh", self._log)
        while not self._stop.is_set():
            try:
                if time.monotonic() >= due:
                    if reload:
                        refs = list(self._prepared())
                        self._book.reload(refs)
                        if self._status is not None:
                            self._status.inherit(r.uid for r in refs)
                        reload = False
                    else:
                        self._book.refresh()
                    due = time.monotonic() + self._interval_s
                if self._status is not None:
                    self._status.refresh()
                retry.succeeded()
            except Exception as exc:  # e.g. a corrupt checkpoint: try again, later
                reload, due = True, time.monotonic() + retry.failed(exc)
            if self._trigger.wait(max(0.0, due - time.monotonic())):
                self._settle()
            self._trigger.clear()

    def _settle(self) -> None:
        """Wait until no trigger came for ``settle_s`` (the kubelet's calls, a burst of
        them, are over), or ``settle_max_s`` passed."""
        end = time.monotonic() + self._settle_max_s
        while True:
            self._trigger.clear()
            if self._stop.wait(min(self._settle_s, max(0.0, end - time.monotonic()))):
                return
            if not self._trigger.is_set() or time.monotonic() >= end:
                return


# -- what happens to claims on the prepare path ------------------------------------

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
                m.prepare_seconds.observe(seconds)
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
                m.unprepare_seconds.observe(seconds)
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
