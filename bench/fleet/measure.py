"""What a fleet run measures: pod creation -> bound, and the control plane's footprint.

Bound time: a watch on the run's namespace sees ``spec.nodeName`` set; the
creation time is taken just before the pod's POST, so both ends are this
process's clock (the API's ``creationTimestamp`` has one-second resolution).
Footprint: ``VmRSS`` of each component's PID from ``/proc``, and etcd's data
directory (its bbolt ``db`` file and everything under it, WAL included).
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from dra_driver.devcluster import Cluster


class BindWatch:
    """Watches pods of one namespace from a given resourceVersion in a named thread and
    records when each first showed a node (monotonic seconds)."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self._cluster = cluster
        self._ns = namespace
        self.bound: dict[str, float] = {}
        self.nodes: dict[str, str] = {}
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._resp: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="bind-watch", daemon=True)

    def start(self) -> None:
        listing = self._cluster.rest.get(f"/api/v1/namespaces/{self._ns}/pods")
        self._rv = str(listing["metadata"]["resourceVersion"])
        self._thread.start()

    def _run(self) -> None:
        from kubernetes.watch.watch import iter_resp_lines

        api = self._cluster.rest.client
        try:
            while not self._stop.is_set():
                params = [("watch", "true"), ("resourceVersion", self._rv),
                          ("allowWatchBookmarks", "true"), ("timeoutSeconds", 300)]  # fmt: skip
                serialized = api.param_serialize(
                    "GET", f"/api/v1/namespaces/{self._ns}/pods", query_params=params,
                    header_params={"Accept": "application/json"}, auth_settings=["BearerToken"],
                )  # fmt: skip
                resp = api.call_api(*serialized[:4], _request_timeout=(10, 330))
                self._resp = resp.response
                for line in iter_resp_lines(self._resp):  # type: ignore[no-untyped-call]
                    if line:
                        self._event(json.loads(line))
        except BaseException as exc:  # surfaced by wait(); a closed watch ends here too
            if not self._stop.is_set():
                self._error = exc
        finally:
            with self._cond:
                self._cond.notify_all()

    def _event(self, event: Mapping[str, Any]) -> None:
        obj = event.get("object") or {}
        meta = obj.get("metadata") or {}
        if meta.get("resourceVersion"):
            self._rv = str(meta["resourceVersion"])
        node = (obj.get("spec") or {}).get("nodeName")
        name = str(meta.get("name"))
        if event.get("type") in ("ADDED", "MODIFIED") and node and name not in self.bound:
            with self._cond:
                self.bound[name] = time.monotonic()
                self.nodes[name] = str(node)
                self._cond.notify_all()

    def wait(self, names: Iterable[str], timeout: float) -> bool:
        """Whether every pod in ``names`` was bound within ``timeout`` seconds."""
        wanted = set(names)
        deadline = time.monotonic() + timeout
        with self._cond:
            while not wanted <= self.bound.keys():
                if self._error is not None:
                    raise RuntimeError(f"pod watch failed: {self._error!r}") from self._error
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 1.0))
        return True

    def stop(self) -> None:
        self._stop.set()
        resp = self._resp
        if resp is not None:
            try:
                resp.shutdown()
            except (RuntimeError, ValueError):
                pass
            resp.close()
        self._thread.join(timeout=10)


def latencies(created: Mapping[str, float], bound: Mapping[str, float]) -> dict[str, Any]:
    """``bound, pods_per_s, p50_s, p99_s`` of the pods in ``created``."""
    waits = sorted(bound[n] - t for n, t in created.items() if n in bound)
    if not waits:
        return {"bound": 0, "pods_per_s": 0.0, "p50_s": None, "p99_s": None}
    span = max(bound[n] for n in created if n in bound) - min(created.values())
    p99 = waits[min(len(waits) - 1, round(0.99 * (len(waits) - 1)))]
    return {
        "bound": len(waits),
        "pods_per_s": round(len(waits) / span, 2) if span > 0 else None,
        "p50_s": round(statistics.median(waits), 3),
        "p99_s": round(p99, 3),
    }


def rss_bytes(pid: int | None, proc: Path = Path("/proc")) -> int | None:
    """Resident set size of ``pid`` (``VmRSS``), None when it is gone."""
    if pid is None:
        return None
    try:
        for line in (proc / str(pid) / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def footprint(cluster: Cluster) -> dict[str, Any]:
    """RSS of every control-plane component and etcd's on-disk size, in bytes."""
    data = cluster.workdir / "etcd-data"
    db = next(data.glob("member/snap/db"), None)
    return {
        "rss_bytes": {c.name: rss_bytes(c.pid) for c in cluster.components},
        "etcd_db_bytes": db.stat().st_size if db else None,
        "etcd_dir_bytes": sum(p.stat().st_size for p in data.rglob("*") if p.is_file()),
    }
