"""A minimal JSON REST client for the test control plane.

Cluster setup needs only a handful of calls (create Node, TokenRequest,
server-side apply of plain dicts), so this uses the standard library rather
than the generated ``kubernetes`` client: it keeps ``dra-driver dev-cluster``
light and lets tests see raw API answers. Tests that prefer typed models build
a ``kubernetes`` client from :attr:`Cluster.kubeconfig` instead.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

JsonObject = dict[str, Any]

APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
MERGE_PATCH_CONTENT_TYPE = "application/merge-patch+json"


class ApiError(RuntimeError):
    """The apiserver answered with an error status (a ``Status`` object when available)."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        self.status = status
        self.body = body
        try:
            decoded = json.loads(body)
            self.reason = str(decoded.get("reason", ""))
            message = str(decoded.get("message", body))
        except ValueError:
            self.reason = ""
            message = body
        super().__init__(f"{method} {path}: HTTP {status} {self.reason}: {message}")


class RestClient:
    """JSON over HTTPS to one apiserver, authenticated by client cert or bearer token."""

    def __init__(
        self,
        server: str,
        ca_file: Path,
        *,
        cert_file: Path | None = None,
        key_file: Path | None = None,
        token: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.server = server.rstrip("/")
        self._context = ssl.create_default_context(cafile=str(ca_file))
        if cert_file is not None:
            self._context.load_cert_chain(str(cert_file), str(key_file) if key_file else None)
        self._token = token
        self._timeout = timeout
        self._resources: dict[str, dict[str, tuple[str, bool]]] = {}

    @property
    def ssl_context(self) -> ssl.SSLContext:
        return self._context

    def request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> JsonObject:
        """Send one request; returns the decoded JSON answer or raises :class:`ApiError`."""
        url = self.server + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method)  # noqa: S310
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        if self._token:
            req.add_header("Authorization", f"Bearer {self._token}")
        try:
            with urllib.request.urlopen(  # noqa: S310
                req, timeout=self._timeout, context=self._context
            ) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as err:
            raise ApiError(method, path, err.code, err.read().decode("utf-8", "replace")) from None
        decoded: JsonObject = json.loads(raw) if raw else {}
        return decoded

    def get(self, path: str, query: Mapping[str, str] | None = None) -> JsonObject:
        return self.request("GET", path, query=query)

    def create(self, path: str, obj: Mapping[str, Any]) -> JsonObject:
        return self.request("POST", path, obj)

    def merge_patch(self, path: str, patch: Mapping[str, Any]) -> JsonObject:
        return self.request("PATCH", path, patch, content_type=MERGE_PATCH_CONTENT_TYPE)

    def delete(self, path: str) -> JsonObject:
        return self.request("DELETE", path)

    def _resource(self, api_version: str, kind: str) -> tuple[str, bool]:
        """(plural, namespaced) for a kind, from the apiserver's discovery (cached)."""
        if api_version not in self._resources:
            base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            listing = self.get(base)
            self._resources[api_version] = {
                r["kind"]: (r["name"], bool(r["namespaced"]))
                for r in listing.get("resources", [])
                if "/" not in r["name"]
            }
        kinds = self._resources[api_version]
        if kind not in kinds:
            raise ValueError(
                f"kind {kind!r} is not served in {api_version}; served: {', '.join(sorted(kinds))}"
            )
        return kinds[kind]

    def path_for(
        self, api_version: str, kind: str, name: str | None = None, namespace: str | None = None
    ) -> str:
        """The REST path of a collection (no name) or one object."""
        plural, namespaced = self._resource(api_version, kind)
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        if namespaced:
            base += f"/namespaces/{urllib.parse.quote(namespace or 'default', safe='')}"
        path = f"{base}/{plural}"
        return f"{path}/{urllib.parse.quote(name, safe='')}" if name else path

    def object_path(self, obj: Mapping[str, Any]) -> str:
        """The REST path of ``obj`` from its apiVersion, kind and metadata."""
        for key in ("apiVersion", "kind"):
            if not isinstance(obj.get(key), str) or not obj[key]:
                raise ValueError(f"object lacks {key!r}: {json.dumps(obj)[:200]}")
        meta = obj.get("metadata") or {}
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(
                f"{obj['kind']} lacks metadata.name (server-side apply needs a name; "
                "generateName is not allowed)"
            )
        return self.path_for(obj["apiVersion"], obj["kind"], name, meta.get("namespace"))

    def apply(self, obj: Mapping[str, Any], field_manager: str) -> JsonObject:
        """Server-side apply (create or update) of one plain-dict object."""
        return self.request(
            "PATCH",
            self.object_path(obj),
            obj,
            query={"fieldManager": field_manager, "force": "true"},
            content_type=APPLY_CONTENT_TYPE,
        )
