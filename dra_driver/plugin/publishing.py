"""Keeps this node's ResourceSlices in line with the backend's pool.

Two named background threads:

- ``slice-sync`` lists our slices (field selector ``spec.nodeName`` +
  ``spec.driver``), diffs them against the desired split of the pool and
  writes the difference: obsolete slices first (delete with UID and
  resourceVersion preconditions), then updates, then creates. Runs at start
  and on every trigger; on API errors it retries with exponential backoff.
  Every ``resync_interval_s`` it re-reads the pool, and asks the API server
  only if the pool is not the one last synced: the watch reports every other
  change (asking anyway cost each node 240 requests an idle hour).
- ``slice-watch`` lists (once the first sync has recorded what it found) and
  watches the same slices and triggers a sync whenever somebody else touches
  them or a list finds them other than last written or found -- the kubelet
  deletes all slices of its node when it starts and 30 s after losing the
  plugin, and they must come back.

Generation rule (what the scheduler expects): when exactly one existing slice
changes, none is added or removed, and its devices keep their names (only
attributes, capacities or taints changed, e.g. a health taint), it is updated
in place with the same generation. Any other change -- in particular a device
that appears or disappears -- bumps the generation and rewrites every slice,
with ``resourceSliceCount`` = number of slices, so a half-written pool is
never mistaken for a complete one and consumers see a new inventory as a new
generation.

Every write is read back: a field we sent that the server did not store
(its feature gate is off) is logged as an error and reported in
:attr:`PublishStatus.dropped_fields` instead of being silently lost.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dra_driver.plugin.kubeclient import (
    ConflictError,
    KubeApiError,
    KubeClient,
    KubeError,
    Watch,
)
from dra_driver.plugin.resources import Pool
from dra_driver.plugin.slicediff import (
    dropped_fields,
    has_list_attributes,
    holds,
    plan_sync,
    written_fingerprint,
)
from dra_driver.plugin.slices import (
    SliceValidationError,
    split_pool,
    validate_names,
    validate_pool,
)
from dra_driver.retries import Retry

if TYPE_CHECKING:
    from dra_driver.plugin.metrics import PublishMetrics

Obj = dict[str, Any]


@dataclass(frozen=True)
class PublishStatus:
    in_sync: bool = False
    generation: int = -1
    slice_count: int = 0
    last_error: str = ""
    dropped_fields: tuple[str, ...] = ()


class SlicePublisher:
    def __init__(
        self,
        *,
        client: KubeClient,
        driver_name: str,
        node_name: str,
        pool_source: Callable[[], Pool],
        logger: logging.Logger,
        resync_interval_s: float = 30.0,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 5.0,
        watch_timeout_s: int = 300,
        metrics: PublishMetrics | None = None,
        on_fatal: Callable[[str], None] | None = None,
    ) -> None:
        """``on_fatal`` is told when a background thread crashes or ends on its own. After
        a failure both loops retry after ``backoff_initial_s``, doubling up to
        ``backoff_max_s``: short, so slices are checked within seconds of the API
        server's return after an outage of any length."""
        validate_names(driver_name, node_name)
        self._on_fatal = on_fatal
        self.metrics = metrics
        """None counts nothing; may be set once later, while running (the plugin's
        :meth:`~dra_driver.plugin.app.KubeletPlugin.add_metrics`)."""
        self._client = client
        self._driver = driver_name
        self._node = node_name
        self._pool_source = pool_source
        self._log = logger
        self._resync_s = resync_interval_s
        self._backoff = (backoff_initial_s, backoff_max_s)
        self._watch_timeout_s = watch_timeout_s
        self._selector = f"spec.nodeName={node_name},spec.driver={driver_name}"
        self._stop = threading.Event()
        self._trigger = threading.Event()
        self._lock = threading.Lock()
        self._status = PublishStatus()
        self._node_uid: str | None = None
        self._generation = -1
        # name -> (resourceVersion we wrote, fingerprint of what we meant to store)
        self._written: dict[str, tuple[str, str]] = {}
        # Names being written: the watch may see our write before the call returns.
        self._writing: set[str] = set()
        self._written_cond = threading.Condition()
        self._watch: Watch | None = None
        self._synced_pool: Pool | None = None
        self._first_sync = threading.Event()
        self._threads: list[threading.Thread] = []

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> None:
        self._trigger.set()
        for name, target in (("slice-sync", self._sync_loop), ("slice-watch", self._watch_loop)):
            t = threading.Thread(target=self._guard, args=(name, target), name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        self._trigger.set()
        self._first_sync.set()
        watch = self._watch
        if watch is not None:
            watch.close()
        for t in self._threads:
            t.join(timeout=10)
        self._threads.clear()

    def trigger(self) -> None:
        """Re-read the pool and sync soon (call after the backend's pool changed)."""
        self._trigger.set()

    @property
    def status(self) -> PublishStatus:
        with self._lock:
            return self._status

    def _set_status(self, **changes: Any) -> None:
        with self._lock:
            self._status = PublishStatus(**{**self._status.__dict__, **changes})

    def _guard(self, name: str, target: Callable[[], None]) -> None:
        try:
            target()
        except Exception as exc:
            self._log.exception("background thread %s crashed", name)
            self._set_status(in_sync=False, last_error=f"{name} crashed")
            if self._on_fatal is not None:
                self._on_fatal(f"{name} crashed: {exc!r}")
            return
        if not self._stop.is_set():
            self._log.error("background thread %s ended unexpectedly", name)
            self._set_status(in_sync=False, last_error=f"{name} ended")
            if self._on_fatal is not None:
                self._on_fatal(f"{name} ended unexpectedly")

    # -- loops ---------------------------------------------------------------

    def _retry(self, what: str) -> Retry:
        return Retry(what, self._log, initial_s=self._backoff[0], max_s=self._backoff[1])

    def _sync_loop(self) -> None:
        retry = self._retry("publishing slices")
        while not self._stop.is_set():
            triggered = self._trigger.wait(timeout=self._resync_s)
            if self._stop.is_set():
                return
            if not triggered and self.status.in_sync and self._synced_pool == self._pool_source():
                continue  # (a trigger set since the timeout is kept for the next wait)
            self._trigger.clear()
            started = time.perf_counter()
            try:
                self.sync_once()
                retry.succeeded()
                if (m := self.metrics) is not None:
                    m.sync(time.perf_counter() - started, ok=True, generation=self._generation)
            except SliceValidationError as exc:
                if (m := self.metrics) is not None:
                    m.sync(time.perf_counter() - started, ok=False)
                self._log.error("not publishing an invalid pool: %s", exc)
                self._set_status(in_sync=False, last_error=str(exc))
            except KubeError as exc:
                if (m := self.metrics) is not None:
                    m.sync(time.perf_counter() - started, ok=False)
                self._set_status(in_sync=False, last_error=str(exc))
                if self._stop.wait(retry.failed(exc)):
                    return
                self._trigger.set()

    def _watch_loop(self) -> None:
        retry = self._retry("watching slices")
        # A new process finds its predecessor's slices: listed before the first sync
        # recorded them as found, they would look changed and cost a second sync.
        self._first_sync.wait()
        while not self._stop.is_set():
            try:
                listed = self._client.list_resource_slices(self._selector)
                rv = str(listed.get("metadata", {}).get("resourceVersion", ""))
                if self._differs_from_written(listed.get("items") or []):
                    # Whatever happened while no watch was open (an outage, a watch
                    # that expired) is only in the list: repair now, not at the resync.
                    self._log.info("slices changed while not watched; resyncing")
                    self._trigger.set()
                self._watch = self._client.watch_resource_slices(
                    self._selector, rv, timeout_s=self._watch_timeout_s
                )
                for kind, obj in self._watch:
                    if self._stop.is_set():
                        return
                    if kind == "ERROR":
                        break  # e.g. 410 Gone: relist
                    if kind != "BOOKMARK" and not self._is_own_write(obj):
                        self._log.info(
                            "slice %s changed by someone else (%s); resyncing",
                            obj.get("metadata", {}).get("name"),
                            kind,
                        )
                        self._trigger.set()
                retry.succeeded()
            except KubeError as exc:
                if self._stop.is_set() or self._stop.wait(retry.failed(exc)):
                    return
            finally:
                self._watch = None

    def _differs_from_written(self, items: list[Obj]) -> bool:
        listed = {
            str(o.get("metadata", {}).get("name")): o.get("metadata", {}).get("resourceVersion")
            for o in items
        }
        written = dict(self._written)  # one C-level copy: the sync thread writes it
        return listed != {name: rv for name, (rv, _) in written.items()}

    def _is_own_write(self, obj: Obj) -> bool:
        """Whether the watch shows a version we wrote. The event can arrive before our
        create or update returned (at start, 3 of 4 times): wait for that call first."""
        meta = obj.get("metadata", {})
        name = str(meta.get("name"))
        with self._written_cond:
            self._written_cond.wait_for(lambda: name not in self._writing, timeout=30)
        written = self._written.get(name)
        return written is not None and written[0] == meta.get("resourceVersion")

    # -- one sync ------------------------------------------------------------

    def _owner_uid(self) -> str:
        """Looked up on every sync: a re-created Node has a new UID, and slices owned by
        the old one would be garbage-collected right after each repair."""
        self._node_uid = str(self._client.get_node(self._node)["metadata"]["uid"])
        return self._node_uid

    def _up_to_date(self, have: Obj, want: Obj) -> bool:
        meta = have.get("metadata", {})
        fp = written_fingerprint(want)
        written = self._written.get(str(meta.get("name")))
        if written is not None and written == (meta.get("resourceVersion"), fp):
            return True
        found = holds(have, want)
        if found:  # e.g. a previous process's: the watch knows this version as ours now
            self._written[str(meta.get("name"))] = (str(meta.get("resourceVersion")), fp)
        return found

    def sync_once(self) -> None:
        """One full reconcile; raises SliceValidationError or KubeError."""
        try:
            self._reconcile()
        finally:
            self._first_sync.set()

    def _reconcile(self) -> None:
        pool = self._pool_source()
        validate_pool(pool)
        contents = split_pool(pool)
        uid = self._owner_uid()
        items: list[Obj] = self._client.list_resource_slices(self._selector).get("items") or []
        plan = plan_sync(
            items,
            contents,
            driver=self._driver,
            node=self._node,
            node_uid=uid,
            generation=self._generation,
            up_to_date=self._up_to_date,
        )
        current, n = plan.generation, plan.count
        if plan.in_sync:
            self._generation, self._synced_pool = current, pool
            self._set_status(in_sync=True, generation=current, slice_count=n, last_error="")
            return
        self._log.info(
            "publishing pool generation %d in %d slice(s): %d update(s), %d create(s), "
            "%d delete(s)",
            current,
            n,
            len(plan.update),
            len(plan.create),
            len(plan.delete),
        )
        for s in plan.delete:
            meta = s["metadata"]
            self._client.delete_resource_slice(
                meta["name"], uid=meta.get("uid"), resource_version=meta.get("resourceVersion")
            )
            self._written.pop(str(meta["name"]), None)
            if (m := self.metrics) is not None:
                m.write("delete")
        dropped: set[str] = set()
        for obj in plan.update:
            dropped |= self._write(obj, create=False)
        for obj in plan.create:
            dropped |= self._write(obj, create=True)
        self._generation, self._synced_pool = current, pool
        if dropped:
            self._log.error(
                "the API server dropped fields we published (feature gate off?): %s",
                ", ".join(sorted(dropped)),
            )
        self._set_status(
            in_sync=True,
            generation=current,
            slice_count=n,
            last_error="",
            dropped_fields=tuple(sorted(dropped)),
        )

    def _write(self, obj: Obj, *, create: bool) -> set[str]:
        name = str(obj["metadata"]["name"])
        with self._written_cond:
            self._writing.add(name)
        try:
            return self._write_one(obj, create=create)
        finally:
            with self._written_cond:
                self._writing.discard(name)
                self._written_cond.notify_all()

    def _write_one(self, obj: Obj, *, create: bool) -> set[str]:
        fp = written_fingerprint(obj)
        try:
            if create:
                stored = self._client.create_resource_slice(obj)
            else:
                stored = self._client.update_resource_slice(obj)
        except ConflictError:
            if (m := self.metrics) is not None:
                m.conflict()
            self._trigger.set()  # someone raced us; the next sync sees their version
            raise
        except KubeApiError as exc:
            if exc.status == 422:
                hint = ""
                if "must specify one of" in exc.message and has_list_attributes(obj):
                    hint = (
                        " (list-typed attributes need the DRAListTypeAttributes feature gate; "
                        "without it the API server drops their values)"
                    )
                raise SliceValidationError(
                    [f"API server rejected {obj['metadata']['name']}: {exc.message}{hint}"]
                ) from exc
            raise
        if (m := self.metrics) is not None:
            m.write("create" if create else "update")
        meta = stored.get("metadata", {})
        self._written[str(meta.get("name"))] = (str(meta.get("resourceVersion")), fp)
        return {f"spec.{p}" for p in dropped_fields(obj["spec"], stored.get("spec", {}))}

    def delete_all(self) -> int:
        """Remove every slice of this node and driver (clean uninstall only)."""
        items = self._client.list_resource_slices(self._selector).get("items") or []
        for s in items:
            meta = s["metadata"]
            self._client.delete_resource_slice(meta["name"], uid=meta.get("uid"))
        self._log.info("deleted %d slice(s) on uninstall", len(items))
        return len(items)


__all__ = ["PublishStatus", "SlicePublisher"]
