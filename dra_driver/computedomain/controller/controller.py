"""Wiring: six caches, one work queue of domain keys, a few workers.

Every cached object leads to one key: a ComputeDomain to its own, anything else by
its ``DOMAIN_LABEL`` (the domain's UID) to that domain's key, or, when no domain has
that UID once the domains are listed, to an orphan key whose pass removes what the
UID still labels. A worker that fails a pass puts the key back with exponential
backoff (0.1 s doubling to 30 s); the informers' resync puts every key back now and
then anyway.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from dra_driver.computedomain import names
from dra_driver.computedomain.controller import reconciling
from dra_driver.computedomain.controller.events import EventRecorder, EventType
from dra_driver.computedomain.controller.informers import Informer, key_of
from dra_driver.computedomain.controller.kubeapi import ControllerApi, Obj, Resource
from dra_driver.computedomain.controller.objects import DaemonSettings
from dra_driver.computedomain.controller.workqueue import ShutDown, WorkQueue
from dra_driver.plugin.kubeclient import KubeError

logger = logging.getLogger(__name__)

WorkKey = tuple[str, str, str]
"""("domain", namespace, name) or ("orphan", uid, "")."""
MAX_BACKOFF_S = 30.0


@dataclass(frozen=True)
class ControllerSettings:
    daemon: DaemonSettings
    workers: int = 4
    """Domains reconciled at once (a domain is never reconciled by two at once)."""
    resync_s: float = 300.0
    """Every cached object is looked at again this often (seconds)."""


@dataclass(frozen=True)
class Health:
    """What the probes answer (:class:`~dra_driver.plugin.healthz.HealthServer`)."""

    failed: str = ""
    """Why a reconcile worker died ("" while none did)."""
    lease_ok: bool = True
    """False once a leader has gone past its renew deadline."""
    leading: bool = True
    synced: bool = False

    @property
    def alive(self) -> bool:
        return not self.failed and self.lease_ok

    @property
    def ready(self) -> bool:
        """A standby is ready (a rolling update waits for it, and it takes over when the
        leader goes); the leader once its caches hold every object."""
        return self.alive and (self.synced or not self.leading)

    @property
    def problems(self) -> list[str]:
        out = [f"reconcile worker died: {self.failed}"] if self.failed else []
        if not self.lease_ok:
            out.append("leader lease not renewed in time")
        if self.leading and not self.synced:
            out.append("caches not synced yet")
        return out


class Controller:
    def __init__(
        self, api: ControllerApi, settings: ControllerSettings,
        events: EventRecorder | None = None,
    ) -> None:  # fmt: skip
        self.api = api
        self._settings = settings
        self._queue: WorkQueue[WorkKey] = WorkQueue()
        self._uids: dict[str, tuple[str, str]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.failed: BaseException | None = None
        """Set when a worker died of a bug; :meth:`run` then returns."""
        ns = settings.daemon.namespace
        labelled = names.DOMAIN_LABEL

        def informer(
            resource: Resource, on: Callable[[Obj], None], namespace: str | None = None,
            selector: str = labelled,
        ) -> Informer:  # fmt: skip
            return Informer(
                api, resource, namespace=namespace, label_selector=selector, on_change=on,
                resync_s=settings.resync_s,
            )  # fmt: skip

        self.caches = reconciling.Caches(
            domains=informer(reconciling.DOMAINS, self._domain_changed, selector=""),
            cliques=informer(reconciling.CLIQUES, self._child_changed, ns),
            templates=informer(reconciling.TEMPLATES, self._child_changed),
            daemonsets=informer(reconciling.DAEMONSETS, self._child_changed, ns),
            pods=informer(reconciling.PODS, self._child_changed, ns),
            nodes=informer(reconciling.NODES, self._child_changed),
        )
        self._reconciler = reconciling.Reconciler(api, self.caches, settings.daemon,
                                                  events=events)  # fmt: skip

    # -- events to keys -------------------------------------------------------------

    def _domain_changed(self, obj: Obj) -> None:
        namespace, name = key_of(obj)
        uid = str(obj.get("metadata", {}).get("uid", ""))
        with self._lock:
            if self.caches.domains.get((namespace, name)) is None:
                self._uids.pop(uid, None)
            else:
                self._uids[uid] = (namespace, name)
        self._queue.add(("domain", namespace, name))

    def _child_changed(self, obj: Obj) -> None:
        uid = str((obj.get("metadata", {}).get("labels") or {}).get(names.DOMAIN_LABEL, ""))
        if not uid:
            return
        with self._lock:
            owner = self._uids.get(uid)
        if owner is not None:
            self._queue.add(("domain", *owner))
        else:
            self._queue.add(("orphan", uid, ""))

    # -- running ----------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Starts the caches and workers; returns when ``stop`` is set or a worker dies."""
        for cache in self._all_caches():
            cache.start()
        for i in range(self._settings.workers):
            threading.Thread(target=self._work, name=f"reconcile-{i}", daemon=True).start()
        while not stop.wait(0.5) and not self._stop.is_set():
            pass
        self._queue.shut_down()
        for cache in self._all_caches():
            cache.stop()

    def synced(self) -> bool:
        return all(c.synced.is_set() for c in self._all_caches())

    def _all_caches(self) -> list[Informer]:
        c = self.caches
        return [c.domains, c.cliques, c.templates, c.daemonsets, c.pods, c.nodes]

    def _work(self) -> None:
        try:
            for cache in self._all_caches():
                cache.synced.wait()
            while True:
                key = self._queue.get()
                try:
                    self._process(key)
                finally:
                    self._queue.done(key)
        except ShutDown:
            return
        except BaseException as exc:  # a bug: end the process, the Deployment restarts it
            logger.exception("reconcile worker died")
            self.failed = exc
            self._stop.set()

    def _domain_event(self, key: WorkKey, type_: EventType, reason: str, note: str) -> None:
        kind, namespace, name = key
        obj = self.caches.domains.get((namespace, name)) if kind == "domain" else None
        if obj is not None:
            self._reconciler.event(obj, type_, reason, "Reconcile", note)

    def _process(self, key: WorkKey) -> None:
        kind, first, second = key
        try:
            if kind == "domain":
                again = self._reconciler.reconcile((first, second))
            else:
                with self._lock:
                    live = first in self._uids
                again = None if live or self._reconciler.tear_down(first) else reconciling.WAIT_S
        except KubeError as exc:
            failures = self._queue.failures(key, True)
            delay = min(0.1 * 2 ** (failures - 1), MAX_BACKOFF_S)
            what = {"key": "/".join(filter(None, key)), "error": str(exc), "retry_s": delay}
            logger.warning("reconcile failed; retrying", extra=what)
            self._domain_event(key, "Warning", "ReconcileFailed", f"{exc}; retrying")
            self._queue.add_after(key, delay)
            return
        except ValueError as exc:  # a domain the schema let through but we cannot use
            logger.error("domain refused", extra={"key": "/".join(key[1:]), "error": str(exc)})
            self._domain_event(key, "Warning", "InvalidSpec", str(exc))
            return
        self._queue.failures(key, False)
        if again is not None:
            self._queue.add_after(key, again)
