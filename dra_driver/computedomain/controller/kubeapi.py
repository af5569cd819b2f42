"""The API calls of the ComputeDomain controller: lists, watches and writes on plain dicts.

Credentials, TLS, retries and error mapping are the kubelet plugin's facade's
(:class:`~dra_driver.plugin.kubeclient.KubeClient`, the ``kubernetes`` library below
it), whose generic watch the informers use; this counts what the controller writes (and
how many writes the API server refused with 409), which the scale bench reports.
Only this module of the controller imports the library.
"""

from __future__ import annotations

import threading
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from dra_driver.plugin.kubeclient import ConflictError, KubeApiError, KubeClient

Obj = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True)
class Resource:
    """One kind of object by REST path: ``prefix`` is ``/api/v1`` or ``/apis/<group>/<v>``."""

    prefix: str
    plural: str
    namespaced: bool

    def collection(self, namespace: str | None = None) -> str:
        """All namespaces when ``namespace`` is None (or the kind is cluster-scoped)."""
        if self.namespaced and namespace is not None:
            return f"{self.prefix}/namespaces/{_segment(namespace)}/{self.plural}"
        return f"{self.prefix}/{self.plural}"

    def item(self, namespace: str | None, name: str, subresource: str = "") -> str:
        path = f"{self.collection(namespace)}/{_segment(name)}"
        return f"{path}/{subresource}" if subresource else path


@dataclass
class WriteCounts:
    """Writes sent (create, patch, delete) and how many the API server answered with 409."""

    writes: int = 0
    conflicts: int = 0


class ControllerApi(KubeClient):
    """Thread-safe like its base; :attr:`counts` is shared by every caller."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.counts = WriteCounts()
        self._count_lock = threading.Lock()

    def list_objects(self, path: str, label_selector: str = "") -> Obj:
        params = {"labelSelector": label_selector} if label_selector else {}
        return self.request("GET", path, params=params)

    def write(
        self,
        method: str,
        path: str,
        body: Obj | list[Obj] | None = None,
        *,
        params: Mapping[str, str | int] | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        """One counted write (POST, PATCH, PUT, DELETE); a list body is a JSON patch."""
        with self._count_lock:
            self.counts.writes += 1
        try:
            # The library serializes a list (a JSON patch) as it does a dict.
            sent = cast(Obj | None, body)
            return self.request(method, path, body=sent, params=params, content_type=content_type)
        except ConflictError:
            with self._count_lock:
                self.counts.conflicts += 1
            raise

    def merge_patch(self, path: str, patch: Obj) -> Obj:
        return self.write("PATCH", path, patch, content_type=MERGE_PATCH)


def is_status(exc: Exception, *statuses: int) -> bool:
    return isinstance(exc, KubeApiError) and exc.status in statuses


def _segment(value: str) -> str:
    if value in ("", ".", ".."):
        raise ValueError(f"{value!r} cannot be an object name in an API path")
    return urllib.parse.quote(value, safe="")
