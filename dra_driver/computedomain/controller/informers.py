"""List+watch caches of one collection each, as client-go's informers keep them.

An :class:`Informer` lists its collection, then watches from the list's
resourceVersion; every object seen (added, changed, deleted) is handed to
``on_change``. When the watch ends it resumes from the last version seen; when the
server says that version is gone (410, or an ERROR event) it lists again and reports
what vanished meanwhile. Every ``resync_s`` it hands every cached object to
``on_change`` again, so a reconcile that failed without a retry is repeated: the
controller is level-triggered, events only say *when* to look.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from dra_driver.computedomain.controller.kubeapi import ControllerApi, Obj, Resource, is_status
from dra_driver.plugin.kubeclient import KubeError

logger = logging.getLogger(__name__)

Key = tuple[str, str]
"""(namespace, name); namespace is "" for cluster-scoped objects."""
RETRY_S = 0.5
MAX_RETRY_S = 30.0
"""Failed lists and watches are retried after 0.5 s, doubling up to 30 s (a CRD not
installed yet, RBAC not bound yet, an API server away)."""


def key_of(obj: Obj) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


class Informer:
    """One collection's cache, kept by a named daemon thread (:meth:`start`)."""

    def __init__(
        self,
        api: ControllerApi,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str = "",
        on_change: Callable[[Obj], None],
        resync_s: float = 300.0,
        watch_timeout_s: int = 300,
    ) -> None:
        self._api = api
        self._path = resource.collection(namespace)
        self._selector = label_selector
        self._on_change = on_change
        self._resync_s = resync_s
        self._watch_timeout_s = watch_timeout_s
        self._lock = threading.Lock()
        self._items: dict[Key, Obj] = {}
        self._stop = threading.Event()
        self._watch: Any = None
        self.synced = threading.Event()
        """Set once the first list is in the cache and handed to ``on_change``."""
        self.name = resource.plural

    # -- the cache --------------------------------------------------------------

    def get(self, key: Key) -> Obj | None:
        with self._lock:
            return self._items.get(key)

    def items(self) -> list[Obj]:
        with self._lock:
            return list(self._items.values())

    # -- the loops ----------------------------------------------------------------

    def start(self) -> None:
        threading.Thread(target=self._run, name=f"informer-{self.name}", daemon=True).start()
        threading.Thread(target=self._resync, name=f"resync-{self.name}", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        watch = self._watch
        if watch is not None:
            watch.close()

    def _run(self) -> None:
        version = ""
        failures = 0
        while not self._stop.is_set():
            try:
                if not version:
                    version = self._relist()
                version = self._follow(version)
                failures = 0
            except KubeError as exc:
                if is_status(exc, 410):
                    version = ""  # compacted: list again
                    continue
                failures += 1
                delay = min(RETRY_S * 2 ** (failures - 1), MAX_RETRY_S)
                if not self._stop.is_set():
                    what = {"resource": self.name, "error": str(exc), "retry_s": delay}
                    logger.warning("list or watch failed; retrying", extra=what)
                    self._stop.wait(delay)
            except Exception:  # a bug must not end the cache silently: log it and go on
                logger.exception("informer loop failed", extra={"resource": self.name})
                version = ""
                self._stop.wait(MAX_RETRY_S)

    def _relist(self) -> str:
        listing = self._api.list_objects(self._path, self._selector)
        fresh = {key_of(o): o for o in listing.get("items", [])}
        with self._lock:
            gone = [o for k, o in self._items.items() if k not in fresh]
            self._items = fresh
        for obj in [*fresh.values(), *gone]:
            self._on_change(obj)
        # Only now: a consumer may rely on every object having been handed over (the
        # controller's map of live domain UIDs, which says what is an orphan).
        self.synced.set()
        return str(listing.get("metadata", {}).get("resourceVersion", ""))

    def _follow(self, version: str) -> str:
        """Applies watch events until the watch ends; returns the version to resume from
        ("" to list again)."""
        params = {"labelSelector": self._selector} if self._selector else {}
        self._watch = self._api.watch(self._path, params, version, timeout_s=self._watch_timeout_s)
        try:
            for kind, obj in self._watch:
                if kind == "ERROR":
                    return ""  # 410 Gone inside the stream, or another error: list again
                version = str(obj.get("metadata", {}).get("resourceVersion", version))
                if kind == "BOOKMARK":
                    continue
                with self._lock:
                    if kind == "DELETED":
                        self._items.pop(key_of(obj), None)
                    else:
                        self._items[key_of(obj)] = obj
                self._on_change(obj)
        finally:
            self._watch.close()
            self._watch = None
        return version

    def _resync(self) -> None:
        while not self._stop.wait(self._resync_s):
            for obj in self.items():
                self._on_change(obj)
