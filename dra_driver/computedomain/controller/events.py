"""Kubernetes Events on a ComputeDomain for what the controller did or could not do, so
``kubectl describe computedomain`` and ``kubectl events`` show it next to the object.

``events.k8s.io/v1`` Events (the API kube-scheduler and kubelet write; ``kubectl get
events`` shows them as core v1 Events), created through the controller's API client,
``reportingController`` ``compute-domain.nvidia.com/controller``. Events are best
effort: a failed post is logged at debug level and never fails a reconcile. One event
of a (domain, reason, note) is posted at most once per ``REPEAT_S``, so a pass retried
every few seconds does not flood the namespace.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Literal

from dra_driver.computedomain import names
from dra_driver.computedomain.controller.kubeapi import ControllerApi, Obj, Resource
from dra_driver.plugin.kubeclient import KubeError

logger = logging.getLogger(__name__)

EVENTS = Resource("/apis/events.k8s.io/v1", "events", True)
REPORTING_CONTROLLER = f"{names.DRIVER_NAME}/controller"
REPEAT_S = 600.0
"""The same event of the same domain is posted again only after this long."""
EventType = Literal["Normal", "Warning"]


class EventRecorder:
    def __init__(
        self,
        api: ControllerApi,
        instance: str,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``instance``: this controller replica (``reportingInstance``)."""
        self._api = api
        self._instance = instance[:128]
        self._clock = clock
        self._posted: dict[tuple[str, str, str], float] = {}
        self._lock = threading.Lock()

    def record(self, domain: Obj, type_: EventType, reason: str, action: str, note: str) -> bool:
        """Posts one event regarding ``domain``; True if it was posted (not a repeat
        within ``REPEAT_S``, and the API server took it)."""
        meta = domain.get("metadata") or {}
        uid, namespace = str(meta.get("uid", "")), str(meta.get("namespace", ""))
        key = (uid, reason, note)
        now = self._clock()
        with self._lock:
            last = self._posted.get(key)
            if last is not None and now - last < REPEAT_S:
                return False
            self._posted[key] = now
            if len(self._posted) > 10_000:
                self._posted = {k: t for k, t in self._posted.items() if now - t < REPEAT_S}
        stamp = datetime.now(UTC)
        event = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {
                # A DNS subdomain of at most 253 characters, whatever the domain's name.
                "name": f"{str(meta.get('name') or 'domain')[:200].rstrip('-.')}."
                f"{stamp:%Y%m%d%H%M%S}{secrets.token_hex(4)}",
                "namespace": namespace,
            },
            "eventTime": stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "reportingController": REPORTING_CONTROLLER,
            "reportingInstance": self._instance,
            "action": action,
            "reason": reason,
            "type": type_,
            "note": note[:1024],
            "regarding": {
                "apiVersion": f"{names.API_GROUP}/{names.API_VERSION}",
                "kind": names.DOMAIN_KIND,
                "namespace": namespace,
                "name": meta.get("name"),
                "uid": uid,
                "resourceVersion": meta.get("resourceVersion"),
            },
        }
        try:
            self._api.write("POST", EVENTS.collection(namespace), event)
        except KubeError as exc:
            logger.debug("event not posted", extra={"reason": reason, "error": str(exc)})
            with self._lock:
                self._posted.pop(key, None)
            return False
        return True
