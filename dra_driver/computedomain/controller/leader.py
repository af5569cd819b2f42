"""Leader election on a ``coordination.k8s.io/v1`` Lease, so that the chart may run more
than one controller replica and only one of them reconciles.

The rules are client-go's: a candidate takes the Lease when nobody holds it, or when
the holder has not renewed it for ``leaseDurationSeconds`` *as this candidate saw it*
(a local monotonic clock, never the timestamps in the object, so clock skew between
nodes does not matter). Every write carries the Lease's resourceVersion: of two
candidates racing for an expired Lease, one gets 409 and stays a follower. The leader
renews every ``retry_s``; one that has not renewed for ``renew_deadline_s`` stops
leading (the caller then stops reconciling and exits), well before another candidate
may take over at ``lease_duration_s``. On a clean stop the leader gives the Lease up
(no holder), so a standby takes over at its next try instead of after a full lease.

The ``kubernetes`` library's own elector is not used: it talks through the
process-wide default client configuration and its follower loop cannot be stopped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from dra_driver.computedomain.controller.kubeapi import ControllerApi, Obj, Resource
from dra_driver.plugin.kubeclient import ConflictError, KubeError, NotFoundError

logger = logging.getLogger(__name__)

LEASES = Resource("/apis/coordination.k8s.io/v1", "leases", True)


@dataclass(frozen=True)
class ElectionSettings:
    namespace: str
    name: str
    """The Lease's name, in ``namespace``."""
    identity: str
    """This candidate (the pod's name and a random suffix): the Lease's holder."""
    lease_duration_s: float = 15.0
    """A follower takes an unrenewed Lease after this long (client-go's default)."""
    renew_deadline_s: float = 10.0
    """A leader that could not renew for this long stops leading; below the duration."""
    retry_s: float = 2.0
    """Between tries to take or renew the Lease."""

    def __post_init__(self) -> None:
        if not 0 < self.retry_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError(
                "leader election: want 0 < retry period < renew deadline < lease duration, "
                f"got {self.retry_s:g} < {self.renew_deadline_s:g} < {self.lease_duration_s:g}"
            )


def _micro_time(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElector:
    """Takes and keeps one Lease; thread-safe to read (:attr:`leading`, :meth:`healthy`)."""

    def __init__(
        self,
        api: ControllerApi,
        settings: ElectionSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._api = api
        self._s = settings
        self._clock = clock
        self._now = now
        self._path = LEASES.item(settings.namespace, settings.name)
        self._observed: tuple[str, str] | None = None
        """(holder, renewTime) last seen, and when (``_observed_at``, local clock)."""
        self._observed_at = 0.0
        self._renewed_at: float | None = None
        self._lock = threading.Lock()
        self.holder = ""
        """Who holds the Lease, as last seen ("" before the first look)."""

    @property
    def leading(self) -> bool:
        with self._lock:
            return self._renewed_at is not None

    def healthy(self) -> bool:
        """False once a leader has gone past its renew deadline (a liveness verdict)."""
        with self._lock:
            renewed = self._renewed_at
        return renewed is None or self._clock() - renewed <= self._s.renew_deadline_s + 5.0

    def acquire(self, stop: threading.Event) -> bool:
        """Blocks until this candidate leads (True) or ``stop`` is set (False)."""
        logger.info("waiting to lead", extra={"lease": self._s.name, "identity": self._s.identity})
        while not stop.is_set():
            if self._try():
                logger.info("leading", extra={"lease": self._s.name, "identity": self._s.identity})
                return True
            stop.wait(self._s.retry_s)
        return False

    def keep(self, stop: threading.Event, lost: threading.Event) -> None:
        """Renews until ``stop`` is set (then gives the Lease up) or the renew deadline
        passes (then sets ``lost``). Run in its own thread once :meth:`acquire` is True."""
        while not stop.wait(self._s.retry_s):
            if self._try():
                continue
            with self._lock:
                renewed = self._renewed_at
            if renewed is None or self._clock() - renewed > self._s.renew_deadline_s:
                logger.error("lost the lease: could not renew it in time",
                             extra={"lease": self._s.name, "holder": self.holder})  # fmt: skip
                with self._lock:
                    self._renewed_at = None
                lost.set()
                return
        self.release()

    def release(self) -> None:
        """Gives the Lease up if this candidate still holds it (a clean stop)."""
        if not self.leading:
            return
        with self._lock:
            self._renewed_at = None
        try:
            lease = self._api.request("GET", self._path)
            if lease.get("spec", {}).get("holderIdentity") != self._s.identity:
                return
            spec = {**lease["spec"], "holderIdentity": None, "leaseDurationSeconds": 1,
                    "renewTime": _micro_time(self._now())}  # fmt: skip
            self._api.write("PUT", self._path, {**lease, "spec": spec})
            logger.info("lease released", extra={"lease": self._s.name})
        except KubeError as exc:  # the others take over after the lease duration
            logger.warning("could not release the lease", extra={"error": str(exc)})

    # -- one try ------------------------------------------------------------------

    def _try(self) -> bool:
        """One look at the Lease: takes or renews it when allowed. True if this
        candidate holds it now."""
        try:
            return self._try_once()
        except ConflictError:  # another candidate wrote first
            return False
        except KubeError as exc:
            logger.warning("lease not read or written", extra={"lease": self._s.name,
                                                               "error": str(exc)})  # fmt: skip
            return False

    def _try_once(self) -> bool:
        now = self._now()
        me = self._s.identity
        duration = max(1, round(self._s.lease_duration_s))
        try:
            lease: Obj | None = self._api.request("GET", self._path)
        except NotFoundError:
            lease = None
        if lease is None:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self._s.name, "namespace": self._s.namespace},
                    "spec": {"holderIdentity": me, "leaseDurationSeconds": duration,
                             "acquireTime": _micro_time(now), "renewTime": _micro_time(now),
                             "leaseTransitions": 0}}  # fmt: skip
            self._api.write("POST", LEASES.collection(self._s.namespace), body)
            return self._took(me)
        spec = dict(lease.get("spec") or {})
        holder = str(spec.get("holderIdentity") or "")
        seen = (holder, str(spec.get("renewTime") or ""))
        if seen != self._observed:
            self._observed, self._observed_at = seen, self._clock()
        self.holder = holder
        held_by_other = holder and holder != me
        # A holder's own lease duration, as written, decides when it expires.
        others_duration = float(spec.get("leaseDurationSeconds") or duration)
        if held_by_other and self._clock() - self._observed_at < others_duration:
            with self._lock:
                self._renewed_at = None
            return False
        if holder != me:
            spec["acquireTime"] = _micro_time(now)
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        spec.update(holderIdentity=me, leaseDurationSeconds=duration, renewTime=_micro_time(now))
        self._api.write("PUT", self._path, {**lease, "spec": spec})
        return self._took(me)

    def _took(self, me: str) -> bool:
        with self._lock:
            self._renewed_at = self._clock()
        self.holder = me
        return True
