"""Plain-dict API calls for the dev cluster's tooling, over the ``kubernetes`` client.

Tooling (the dev cluster, the demo, the tests) talks to the API server through
the well-kept ``kubernetes`` library (its transport, TLS, credentials and
kubeconfig loading), as the daemon does through its own facade of the eight calls
it makes (:mod:`dra_driver.plugin.kubeclient`, imported once its sockets serve, see
docs/footprint.md). This module only
adds what setting up clusters and reading raw answers needs on top of
``kubernetes.client.ApiClient``: JSON in and out by REST path, server-side
apply of plain dicts (kinds resolved through discovery), merge patches, and an
:class:`ApiError` that keeps the server's status and reason.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kubernetes.client

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


def api_client(
    server: str,
    ca_file: Path,
    *,
    cert_file: Path | None = None,
    key_file: Path | None = None,
    token: str | None = None,
) -> kubernetes.client.ApiClient:
    """A ``kubernetes`` ApiClient for one server and one credential."""
    config = kubernetes.client.Configuration(host=server.rstrip("/"))
    config.ssl_ca_cert = str(ca_file)
    config.verify_ssl = True
    if cert_file is not None:
        config.cert_file = str(cert_file)
        config.key_file = str(key_file) if key_file else None
    if token:
        config.api_key = {"authorization": f"Bearer {token}"}
    return kubernetes.client.ApiClient(config)


class ToolClient:
    """JSON by REST path over a ``kubernetes`` ApiClient (thread-safe like it)."""

    def __init__(self, client: kubernetes.client.ApiClient, timeout: float = 30.0) -> None:
        self.client = client
        self._timeout = timeout
        self._resources: dict[str, dict[str, tuple[str, bool]]] = {}

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
        headers = {"Accept": "application/json"}
        payload: Any = None
        if body is not None:
            headers["Content-Type"] = content_type
            # The library encodes *json* content types itself; YAML (apply) goes as
            # text, and JSON is valid YAML.
            payload = dict(body) if "json" in content_type else json.dumps(body)
        _method, url, headers, payload, _post = self.client.param_serialize(
            method=method,
            resource_path=path,
            query_params=list((query or {}).items()),
            header_params=headers,
            body=payload,
            auth_settings=["BearerToken"],
        )
        try:
            resp = self.client.call_api(
                method, url, header_params=headers, body=payload, _request_timeout=self._timeout
            )
            data: bytes = resp.read()  # type: ignore[no-untyped-call]
        except kubernetes.client.exceptions.ApiException as err:
            raise ApiError(
                method, path, int(err.status or 0), str(err.body or err.reason)
            ) from None
        if not 200 <= resp.status < 300:
            raise ApiError(method, path, resp.status, data.decode("utf-8", "replace"))
        decoded: JsonObject = json.loads(data) if data else {}
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
