"""Keep a :class:`~dra_driver.extender.view.ClusterView` current: per kind, list, then
watch from the list's resourceVersion through the plugin's
:class:`~dra_driver.plugin.kubeclient.KubeClient`; list again when the watch's version
is gone (410) or a call fails, after a pause. One named daemon thread per kind.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from dra_driver.extender.view import ClusterView
from dra_driver.plugin.kubeclient import KubeApiError, KubeClient, KubeError, Watch

PATHS: Mapping[str, str] = {
    "nodes": "/api/v1/nodes",
    "pods": "/api/v1/pods",
    "resourceslices": "/apis/resource.k8s.io/v1/resourceslices",
    "resourceclaims": "/apis/resource.k8s.io/v1/resourceclaims",
}
RETRY_S = 2.0
WATCH_S = 300


class Watcher:
    """Lists and watches every kind of :data:`PATHS` into ``view`` until :meth:`stop`."""

    def __init__(self, client: KubeClient, view: ClusterView, logger: logging.Logger) -> None:
        self._client = client
        self._view = view
        self._log = logger
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watches: dict[str, Watch] = {}
        self._lock = threading.Lock()

    def start(self) -> None:
        for kind in PATHS:
            t = threading.Thread(target=self._guarded, args=(kind,), name=f"watch-{kind}",
                                 daemon=True)  # fmt: skip
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            watches = list(self._watches.values())
        for w in watches:
            w.close()
        for t in self._threads:
            t.join(timeout=5)

    def _guarded(self, kind: str) -> None:
        try:
            self._loop(kind)
        except Exception:  # a dead watch would freeze the view: say so loudly
            self._log.exception("watch loop died", extra={"kind": kind})

    def _loop(self, kind: str) -> None:
        path = PATHS[kind]
        while not self._stopping.is_set():
            try:
                listed = self._client.request("GET", path)
                self._view.replace(kind, listed.get("items") or [])
                version = str((listed.get("metadata") or {}).get("resourceVersion", ""))
                self._log.info(
                    "listed", extra={"kind": kind, "count": len(listed.get("items") or [])}
                )
                while not self._stopping.is_set():
                    version = self._watch(kind, path, version)
                    if not version:
                        break  # gone: list again
            except KubeApiError as exc:
                self._log.warning("list or watch failed", extra={"kind": kind, "error": str(exc)})
            except KubeError as exc:
                self._log.warning("API unreachable", extra={"kind": kind, "error": str(exc)})
            self._stopping.wait(RETRY_S)

    def _watch(self, kind: str, path: str, version: str) -> str:
        """Apply events after ``version``; the last version seen, or "" to list again."""
        watch = self._client.watch(path, {}, version, timeout_s=WATCH_S)
        with self._lock:
            self._watches[kind] = watch
        try:
            for event, obj in watch:
                if self._stopping.is_set():
                    return version
                if event == "ERROR":
                    self._log.info("watch expired", extra={"kind": kind, "status": obj.get("code")})
                    return ""
                version = str((obj.get("metadata") or {}).get("resourceVersion", version))
                if event != "BOOKMARK":
                    self._view.apply(kind, event, obj)
        finally:
            with self._lock:
                self._watches.pop(kind, None)
        return version
