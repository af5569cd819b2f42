"""Periodic unprepare of claims the kubelet will never unprepare itself.

A claim can stay prepared on the node after its object is gone (kubelet
checkpoint lost, node rebooted while pods were deleted, claim re-created under
the same name). Once at start and then every ``interval_s`` each claim the
backend reports as prepared is looked up; if the object is gone or carries a
different UID, it is unprepared through the normal locked path.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from dra_driver.errors import DriverError
from dra_driver.plugin.claims import ClaimRef
from dra_driver.plugin.preparing import ClaimGetter, ClaimService


class StaleClaimCleaner:
    def __init__(
        self,
        *,
        prepared: Callable[[], Iterable[ClaimRef]],
        get_claim: ClaimGetter,
        service: ClaimService,
        interval_s: float,
        logger: logging.Logger,
    ) -> None:
        self._prepared = prepared
        self._get_claim = get_claim
        self._service = service
        self._interval_s = interval_s
        self._log = logger
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> list[str]:
        """Unprepare stale claims now; returns the UIDs unprepared."""
        done: list[str] = []
        for ref in list(self._prepared()):
            log = ref.logger(self._log)
            try:
                obj = self._get_claim(ref.namespace, ref.name)
            except Exception as exc:  # API trouble: keep the claim, try next round
                log.warning("cannot check whether claim still exists: %s", exc)
                continue
            if obj is not None and (obj.get("metadata") or {}).get("uid") == ref.uid:
                continue
            log.info("claim is gone or was re-created; unpreparing stale claim")
            error = self._service.unprepare([ref])[ref.uid].error
            if error:
                log.warning("stale claim unprepare failed: %s", error)
            else:
                done.append(ref.uid)
        return done

    def _loop(self, wait: Callable[[float], bool]) -> None:
        while True:
            try:
                self.run_once()
            except DriverError as exc:  # e.g. the backend cannot read its state now
                self._log.warning("stale-claim cleanup round failed: %s", exc)
            except Exception:
                self._log.exception("stale-claim cleanup round failed")
            if wait(self._interval_s):
                return

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._loop, args=(self._stop.wait,), name="claim-cleanup", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
