"""One domain, level-triggered: compare what the caches show with what should exist,
and write the difference.

Every pass starts from the caches, never from what an earlier pass did, so a
controller killed between any two writes converges when it starts again. Writes that
cannot conflict are preferred: objects are created once (their specs never change),
clique objects and ``status`` are merge patches without a resourceVersion, and this
controller is their only writer. Only the finalizer list is written with the
domain's resourceVersion, since other controllers may add finalizers of their own.

Deletion, in order: the DaemonSet; then, once its pods are gone, both templates, the
clique objects and the domain's label on nodes; then the finalizer. A domain that
vanished without that (its finalizer removed by hand) is cleaned up the same way from
what carries its UID.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from dra_driver.computedomain import names
from dra_driver.computedomain.controller import cliques as cliquing
from dra_driver.computedomain.controller import objects
from dra_driver.computedomain.controller.events import EventRecorder, EventType
from dra_driver.computedomain.controller.informers import Informer, Key
from dra_driver.computedomain.controller.kubeapi import ControllerApi, Obj, Resource
from dra_driver.logs import ContextLogger
from dra_driver.plugin.kubeclient import ConflictError, KubeApiError, NotFoundError

logger = logging.getLogger(__name__)

DOMAINS = Resource(f"/apis/{names.API_GROUP}/{names.API_VERSION}", names.DOMAIN_PLURAL, True)
CLIQUES = Resource(f"/apis/{names.API_GROUP}/{names.API_VERSION}", names.CLIQUE_PLURAL, True)
TEMPLATES = Resource("/apis/resource.k8s.io/v1", "resourceclaimtemplates", True)
DAEMONSETS = Resource("/apis/apps/v1", "daemonsets", True)
PODS = Resource("/api/v1", "pods", True)
NODES = Resource("/api/v1", "nodes", False)
WAIT_S = 1.0
"""Next look while the DaemonSet's pods are still going away."""
JSON_PATCH = "application/json-patch+json"
MEMO_S = 5.0
"""How long a write is trusted over a cache that has not caught up with it yet."""


@dataclass(frozen=True)
class Caches:
    domains: Informer
    cliques: Informer
    templates: Informer
    daemonsets: Informer
    pods: Informer
    nodes: Informer


def _uid_of(obj: Obj) -> str:
    return str((obj.get("metadata", {}).get("labels") or {}).get(names.DOMAIN_LABEL, ""))


def _mine(cache: Informer, uid: str) -> list[Obj]:
    return [o for o in cache.items() if _uid_of(o) == uid]


class Reconciler:
    def __init__(
        self,
        api: ControllerApi,
        caches: Caches,
        settings: objects.DaemonSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        events: EventRecorder | None = None,
    ) -> None:
        self._api = api
        self._events = events
        self._caches = caches
        self._settings = settings
        self._clock = clock
        self._memo: dict[str, tuple[object, float]] = {}
        self._reported: set[str] = set()

    # -- live domains -------------------------------------------------------------

    def reconcile(self, key: Key) -> float | None:
        """One pass over domain ``key``; returns seconds until the next look, or None."""
        obj = self._caches.domains.get(key)
        if obj is None:
            return None
        domain = objects.Domain.from_object(obj)
        log = ContextLogger(logger, {"domain": f"{key[0]}/{key[1]}", "uid": domain.uid})
        finalizers = list(obj["metadata"].get("finalizers") or [])
        if obj["metadata"].get("deletionTimestamp"):
            if names.FINALIZER not in finalizers:
                return None
            if not self.tear_down(domain.uid):
                return WAIT_S
            self._set_finalizers(obj, [f for f in finalizers if f != names.FINALIZER])
            log.info("domain torn down; finalizer removed")
            self.event(obj, "Normal", "TornDown", "Delete",
                       "daemons, templates, cliques and node labels removed")  # fmt: skip
            return None
        if names.FINALIZER not in finalizers:
            self._set_finalizers(obj, [*finalizers, names.FINALIZER])
        self._ensure(obj, self._caches.templates, objects.workload_template(domain), TEMPLATES)
        self._ensure(
            obj, self._caches.templates, objects.daemon_template(domain, self._settings), TEMPLATES
        )
        self._ensure(
            obj, self._caches.daemonsets, objects.daemonset(domain, self._settings), DAEMONSETS
        )
        entries, waiting, unbound = self._sync_cliques(domain.uid)
        status = cliquing.domain_status(entries, waiting, unbound)
        path = DOMAINS.item(domain.namespace, domain.name, "status")
        before = (obj.get("status") or {}).get("status")
        if status != obj.get("status") and self._write_once(
            f"status/{domain.uid}", status,
            lambda: self._api.merge_patch(path, {"status": status}),
        ):  # fmt: skip
            log.info("status written", extra={"status": status["status"],
                                              "nodes": len(status["nodes"])})  # fmt: skip
            if status["status"] != before and (before or status["status"] == cliquing.READY):
                self._status_event(obj, status, len(entries))
        return None

    def event(self, domain: Obj, type_: EventType, reason: str, action: str, note: str) -> None:
        """An Event on ``domain`` (best effort; see :mod:`.events`)."""
        if self._events is not None:
            self._events.record(domain, type_, reason, action, note)

    def _status_event(self, obj: Obj, status: Obj, cliques: int) -> None:
        nodes = status["nodes"]
        if status["status"] == cliquing.READY:
            note = f"every daemon Ready: {len(nodes)} nodes in {cliques} cliques"
            self.event(obj, "Normal", "Ready", "Reconcile", note)
            return
        late = sorted(str(n["name"]) for n in nodes if n["status"] != cliquing.READY)
        note = f"{len(late)} of {len(nodes)} daemons not Ready: {', '.join(late[:5])}"
        self.event(
            obj, "Warning", "NotReady", "Reconcile", note + (", ..." if len(late) > 5 else "")
        )

    def _set_finalizers(self, obj: Obj, finalizers: list[str]) -> None:
        meta = obj["metadata"]
        patch = {"metadata": {"finalizers": finalizers or None,
                              "resourceVersion": meta["resourceVersion"]}}  # fmt: skip
        self._api.merge_patch(DOMAINS.item(meta["namespace"], meta["name"]), patch)

    def _ensure(self, domain: Obj, cache: Informer, want: Obj, resource: Resource) -> None:
        meta = want["metadata"]
        if cache.get((meta["namespace"], meta["name"])) is not None:
            return
        what = f"create/{resource.plural}/{meta['namespace']}/{meta['name']}"
        try:
            wrote = self._write_once(
                what,
                True,
                lambda: self._api.write("POST", resource.collection(meta["namespace"]), want),
            )
        except ConflictError:  # there already: the cache had not caught up, or not ours
            if self._foreign(resource, want):
                self._memo[what] = (True, self._clock())  # ask again after MEMO_S only
                self.event(domain, "Warning", "TemplateNameTaken", "Create",
                           f"{want['kind']} {meta['namespace']}/{meta['name']} exists and is "
                           "not this domain's; delete the domain and name another template "
                           "in spec.channel.resourceClaimTemplate.name")  # fmt: skip
            return
        if wrote:
            where = {"namespace": meta["namespace"], "object": meta["name"]}
            logger.info("created", extra={"kind": want["kind"], **where, "uid": _uid_of(want)})
            self.event(domain, "Normal", "Created", "Create",
                       f"created {want['kind']} {meta['namespace']}/{meta['name']}")  # fmt: skip

    def _foreign(self, resource: Resource, want: Obj) -> bool:
        """True, and said once, when an object of that name exists that is not this
        domain's (a workload template name already used in the namespace): it is left
        alone, and the domain's pods would get that template's claims."""
        meta = want["metadata"]
        try:
            found = self._api.request("GET", resource.item(meta["namespace"], meta["name"]))
        except NotFoundError:
            return False
        if _uid_of(found) == _uid_of(want):
            return False
        key = f"{resource.plural}/{meta['namespace']}/{meta['name']}/{_uid_of(want)}"
        if key not in self._reported:
            self._reported.add(key)
            logger.error(
                "an object of that name exists and is not this domain's; delete the domain "
                "and name another template in spec.channel.resourceClaimTemplate.name",
                extra={"kind": want["kind"], "namespace": meta["namespace"],
                       "object": meta["name"], "uid": _uid_of(want)},
            )  # fmt: skip
        return True

    def _sync_cliques(self, uid: str) -> tuple[dict[str, list[Obj]], list[str], int]:
        """Writes the clique objects; returns them with the daemon pods' nodes not yet in
        a clique and the number of pods not yet on a node (:func:`cliquing.waiting`)."""
        namespace = self._settings.namespace
        held = {o["metadata"]["name"]: o for o in _mine(self._caches.cliques, uid)}
        current = {name.split(".", 1)[1]: list(o.get("daemons") or [])
                   for name, o in held.items() if "." in name}  # fmt: skip
        pods = [p for p in _mine(self._caches.pods, uid)
                if p["metadata"].get("namespace") == namespace]  # fmt: skip
        placed = cliquing.daemons_of(pods)
        want = cliquing.cliques(placed, current)
        for clique_id, daemons in want.items():
            name = objects.clique_name(uid, clique_id)
            if name not in held:
                seen = self._memo.get(f"clique/{name}")
                if seen is not None and self._clock() - seen[1] < MEMO_S:
                    continue  # created a moment ago; its arrival in the cache brings a pass
                body = objects.clique(uid, clique_id, namespace, daemons)
                post = partial(self._api.write, "POST", CLIQUES.collection(namespace), body)
                try:
                    self._write_once(f"clique/{name}", daemons, post)
                except ConflictError:  # there already, the cache behind: as above
                    self._memo[f"clique/{name}"] = (None, self._clock())
            elif current.get(clique_id) != daemons:
                path = CLIQUES.item(namespace, name)
                patch = partial(self._api.merge_patch, path, {"daemons": daemons})
                self._write_once(f"clique/{name}", daemons, patch)
        for name in held.keys() - {objects.clique_name(uid, c) for c in want}:
            self._delete(CLIQUES.item(namespace, name))
        return (want, *cliquing.waiting(pods, placed))

    def _write_once(self, what: str, value: object, write: Callable[[], object]) -> bool:
        """Runs ``write`` unless ``value`` was written for ``what`` in the last MEMO_S
        seconds (a cache that has not caught up would ask for it again); remembers it
        once the write succeeded. True if it wrote."""
        now = self._clock()
        seen = self._memo.get(what)
        if seen is not None and seen[0] == value and now - seen[1] < MEMO_S:
            return False
        write()
        self._memo[what] = (value, now)
        if len(self._memo) > 100_000:
            self._memo = {k: v for k, v in self._memo.items() if now - v[1] < MEMO_S}
        return True

    # -- teardown -------------------------------------------------------------------

    def tear_down(self, uid: str) -> bool:
        """One step of removing what carries ``uid``; True once nothing is left."""
        left = False
        for ds in _mine(self._caches.daemonsets, uid):
            left = True
            meta = ds["metadata"]
            if not meta.get("deletionTimestamp"):
                self._delete(DAEMONSETS.item(meta["namespace"], meta["name"]),
                             {"propagationPolicy": "Background"})  # fmt: skip
        if _mine(self._caches.pods, uid):
            return False  # the daemons go first: their claims need the daemon template
        if left:
            return False
        for obj, resource in [
            *((t, TEMPLATES) for t in _mine(self._caches.templates, uid)),
            *((c, CLIQUES) for c in _mine(self._caches.cliques, uid)),
        ]:
            left = True
            meta = obj["metadata"]
            if not meta.get("deletionTimestamp"):
                self._delete(resource.item(meta["namespace"], meta["name"]))
        for node in _mine(self._caches.nodes, uid):
            left = True
            self._unlabel(node["metadata"]["name"], uid)
        if left:
            logger.info("tearing down", extra={"uid": uid})
        return not left

    def _unlabel(self, node: str, uid: str) -> None:
        """Removes the domain's label from ``node`` only if it still names this domain (a
        JSON patch's test): the node may have joined another domain since."""
        pointer = "/metadata/labels/" + names.DOMAIN_LABEL.replace("~", "~0").replace("/", "~1")
        patch = [{"op": "test", "path": pointer, "value": uid}, {"op": "remove", "path": pointer}]
        try:
            self._api.write("PATCH", NODES.item(None, node), patch, content_type=JSON_PATCH)
        except KubeApiError as exc:
            if exc.status not in (404, 422):  # gone, or no longer this domain's
                raise

    def _delete(self, path: str, params: dict[str, str | int] | None = None) -> None:
        try:
            self._write_once(f"delete/{path}", True,
                             lambda: self._api.write("DELETE", path, params=params))  # fmt: skip
        except NotFoundError:
            pass
