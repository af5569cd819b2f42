"""A small JSON client for the few API calls the kubelet plugin makes.

Why not ``kubernetes.client``: importing it loads every generated model (about
37 MB and 0.6 s, see docs/footprint.md) in a daemon that runs on every GPU node.
This module speaks plain JSON dicts over kept-alive connections
(:mod:`dra_driver.plugin.httpconn`, made at the first request); the
credentials (:mod:`dra_driver.plugin.kubecreds`: kubeconfig lists and contexts,
certificates, tokens, exec plugins, in-cluster) are followed as they rotate: a
changed client certificate file or exec certificate opens new connections, and
an exec token the server refuses (401) is fetched again once.

Errors (all raised ``from`` the original cause)::

    KubeError
    ├── KubeConnectionError     transport failure, timeout, bad TLS
    └── KubeApiError            non-2xx answer; .status, .reason, .message
        ├── NotFoundError       404
        └── ConflictError       409 (stale resourceVersion, already exists)
"""

from __future__ import annotations

import json
import os
import ssl
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from dra_driver.plugin.httpconn import HttpError, HttpPool, Stream
from dra_driver.plugin.kubecreds import (
    IN_CLUSTER_SA_DIR,
    ExecPlugin,
    KubeConfig,
    KubeConfigError,
    KubeError,
    load_in_cluster,
    load_kubeconfig,
)

__all__ = [
    "IN_CLUSTER_SA_DIR",
    "ConflictError",
    "KubeApiError",
    "KubeClient",
    "KubeConfig",
    "KubeConfigError",
    "KubeConnectionError",
    "KubeError",
    "NotFoundError",
    "Watch",
    "load_in_cluster",
    "load_kubeconfig",
]


RESOURCE_API = "/apis/resource.k8s.io/v1"
TOKEN_REREAD_S = 60.0
"""Projected service-account tokens rotate; re-read the file at most this often."""
CERT_RECHECK_S = 10.0
"""Client certificate files are checked for a rotation at most this often."""

Obj = dict[str, Any]


class KubeConnectionError(KubeError):
    """The request did not get an HTTP answer (refused, timeout, TLS)."""


class KubeApiError(KubeError):
    """The API server answered with an error status."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class NotFoundError(KubeApiError):
    pass


class ConflictError(KubeApiError):
    pass


def _ssl_context(
    config: KubeConfig, cert_pem: str | None, key_pem: str | None, *, http2: bool = False
) -> ssl.SSLContext:
    """``http2``: offer ``h2`` by ALPN (a context without ALPN gets HTTP/1.1 from any
    server; ALPN is set per context, so each protocol needs its own)."""
    ctx = (
        ssl.create_default_context(cadata=config.ca_pem)
        if config.ca_pem
        else (ssl.create_default_context())
    )
    if config.insecure_skip_tls_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cert_pem and key_pem:
        _load_key_pair(ctx, cert_pem, key_pem)
    if http2:
        ctx.set_alpn_protocols(["h2", "http/1.1"])
    return ctx


def _load_key_pair(ctx: ssl.SSLContext, cert_pem: str, key_pem: str) -> None:
    """ssl loads key pairs only from paths: these are anonymous memory files
    (``memfd_create``) opened through ``/proc/self/fd``, so the private key never
    touches a filesystem, not even a private temp dir for a moment."""
    fds: list[int] = []
    try:
        for name, pem in (("kubeclient-cert", cert_pem), ("kubeclient-key", key_pem)):
            fd = os.memfd_create(name, os.MFD_CLOEXEC)
            fds.append(fd)
            data = memoryview(pem.encode())
            while data:
                data = data[os.write(fd, data) :]
        ctx.load_cert_chain(f"/proc/self/fd/{fds[0]}", f"/proc/self/fd/{fds[1]}")
    finally:
        for fd in fds:
            os.close(fd)


class KubeClient:
    """Thread-safe; one pooled connection set shared by all callers."""

    def __init__(
        self,
        config: KubeConfig,
        *,
        timeout_s: float = 10.0,
        connections: int = 4,
        http2: bool = False,
    ) -> None:
        self._config = config
        self._timeout_s = timeout_s
        if connections < 1:
            raise ValueError(f"connections: {connections}; want at least 1")
        self._connections = connections
        self._exec = ExecPlugin(config.exec, config.server, config.ca_pem) if config.exec else None
        self._token_lock = threading.Lock()
        self._token: str | None = config.token
        self._token_read_at = 0.0
        self._cert_lock = threading.Lock()
        self._cert_pems = (config.client_cert_pem, config.client_key_pem)
        self._cert_files = _stat(config.client_cert_file, config.client_key_file)
        self._cert_checked_at = time.monotonic()
        if self._exec is not None:
            cred = self._exec.credential()
            if cred.cert_pem:
                self._cert_pems = (cred.cert_pem, cred.key_pem)
        self._ssl = _ssl_context(config, *self._cert_pems)  # bad TLS material fails here
        self._ssl_h2 = _ssl_context(config, *self._cert_pems, http2=True) if http2 else None
        self._pool_now: HttpPool | None = None

    @property
    def _http(self) -> HttpPool:
        """The connection pool, made at the first request."""
        pool = self._pool_now
        if pool is None:
            with self._cert_lock:
                if self._pool_now is None:
                    self._pool_now = self._pool()
                pool = self._pool_now
        return pool

    def _pool(self) -> HttpPool:
        return HttpPool(
            self._config.server,
            ssl_context=self._ssl,
            connections=self._connections,
            http2_ssl_context=self._ssl_h2,
        )

    def _use_cert(self, pems: tuple[str | None, str | None]) -> None:
        """Switch to another client certificate: new connections from now on."""
        with self._cert_lock:
            if pems == self._cert_pems:
                return
            self._cert_pems = pems
            self._ssl = _ssl_context(self._config, *pems)
            if self._ssl_h2 is not None:
                self._ssl_h2 = _ssl_context(self._config, *pems, http2=True)
            old, self._pool_now = self._pool_now, self._pool()
        if old is not None:
            old.close()

    def _check_cert_files(self) -> None:
        """Re-read rotated client certificate files (at most every CERT_RECHECK_S)."""
        cfg = self._config
        if cfg.client_cert_file is None or cfg.client_key_file is None:
            return
        now = time.monotonic()
        if now - self._cert_checked_at < CERT_RECHECK_S:
            return
        self._cert_checked_at = now
        seen = _stat(cfg.client_cert_file, cfg.client_key_file)
        if seen == self._cert_files:
            return
        try:
            pems = (cfg.client_cert_file.read_text(), cfg.client_key_file.read_text())
            _ssl_context(cfg, *pems)  # a half-written pair must not replace a good one
        except (OSError, ssl.SSLError):
            return
        self._cert_files = seen
        self._use_cert(pems)

    @property
    def server(self) -> str:
        return self._config.server

    def close(self) -> None:
        if self._pool_now is not None:
            self._pool_now.close()

    # -- plumbing ------------------------------------------------------------

    def _headers(self, *, refresh: bool = False) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "dra-driver-plugin"}
        token = self._current_token()
        if self._exec is not None:
            cred = self._exec.credential(refresh=refresh)
            token = cred.token or token
            if cred.cert_pem:
                self._use_cert((cred.cert_pem, cred.key_pem))
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def _current_token(self) -> str | None:
        path = self._config.token_file
        if path is None:
            return self._token
        with self._token_lock:
            now = time.monotonic()
            if self._token is None or now - self._token_read_at > TOKEN_REREAD_S:
                try:
                    self._token = path.read_text().strip()
                except OSError as exc:
                    raise KubeConfigError(f"cannot read token file {path}: {exc}") from exc
                self._token_read_at = now
            return self._token

    def _target(self, path: str, params: Mapping[str, str | int] | None) -> str:
        return f"{path}?{urlencode(params)}" if params else path

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Obj | None = None,
        params: Mapping[str, str | int] | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        """One API call; returns the decoded JSON body or raises a :class:`KubeError`."""
        self._check_cert_files()
        data = json.dumps(body).encode() if body is not None else None
        for attempt in (0, 1):
            headers = self._headers(refresh=attempt == 1)
            if data is not None:
                headers["Content-Type"] = content_type
            try:
                resp = self._http.request(
                    method,
                    self._target(path, params),
                    body=data,
                    headers=headers,
                    timeout=self._timeout_s,
                )
            except HttpError as exc:
                raise KubeConnectionError(f"{method} {path}: {exc}") from exc
            if resp.status != 401 or self._exec is None:
                break  # only an exec credential can be fetched anew
        return _decode(method, path, resp.status, resp.body)

    # -- typed helpers used by the plugin --------------------------------------

    def get_resource_claim(self, namespace: str, name: str) -> Obj | None:
        """The claim, or None when it does not exist."""
        path = f"{RESOURCE_API}/namespaces/{_segment(namespace)}/resourceclaims/{_segment(name)}"
        try:
            return self.request("GET", path)
        except NotFoundError:
            return None

    def apply_resource_claim_status(
        self, namespace: str, name: str, body: Obj, *, field_manager: str
    ) -> None:
        """Server-side apply of the claim's status (our ``status.devices`` entries); a claim
        that no longer exists is fine (nothing to write or remove)."""
        path = (
            f"{RESOURCE_API}/namespaces/{_segment(namespace)}/resourceclaims/"
            f"{_segment(name)}/status"
        )
        try:
            self.request(
                "PATCH",
                path,
                body=body,
                params={"fieldManager": field_manager, "force": "true"},
                content_type="application/apply-patch+yaml",
            )
        except NotFoundError:
            pass

    def get_node(self, name: str) -> Obj:
        return self.request("GET", f"/api/v1/nodes/{_segment(name)}")

    def list_resource_slices(self, field_selector: str) -> Obj:
        return self.request(
            "GET", f"{RESOURCE_API}/resourceslices", params={"fieldSelector": field_selector}
        )

    def create_resource_slice(self, obj: Obj) -> Obj:
        return self.request("POST", f"{RESOURCE_API}/resourceslices", body=obj)

    def update_resource_slice(self, obj: Obj) -> Obj:
        name = _segment(obj["metadata"]["name"])
        return self.request("PUT", f"{RESOURCE_API}/resourceslices/{name}", body=obj)

    def delete_resource_slice(
        self, name: str, *, uid: str | None = None, resource_version: str | None = None
    ) -> None:
        """Delete with optional preconditions; an already deleted slice is fine."""
        pre: dict[str, str] = {}
        if uid:
            pre["uid"] = uid
        if resource_version:
            pre["resourceVersion"] = resource_version
        body: Obj = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if pre:
            body["preconditions"] = pre
        try:
            self.request("DELETE", f"{RESOURCE_API}/resourceslices/{_segment(name)}", body=body)
        except NotFoundError:
            pass

    def watch_resource_slices(
        self, field_selector: str, resource_version: str, *, timeout_s: int = 300
    ) -> Watch:
        """Events after ``resource_version``; ends when the server closes (timeout_s)."""
        params: dict[str, str | int] = {
            "watch": "1",
            "fieldSelector": field_selector,
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": timeout_s,
        }
        target = self._target(f"{RESOURCE_API}/resourceslices", params)
        try:
            resp = self._http.stream(
                target,
                headers=self._headers(),
                connect_timeout=self._timeout_s,
                read_timeout=timeout_s + 30,
            )
            if resp.status != 200:
                _decode("GET", "watch resourceslices", resp.status, resp.body())
        except HttpError as exc:
            raise KubeConnectionError(f"watch resourceslices: {exc}") from exc
        return Watch(resp)


class Watch:
    """Iterator of ``(type, object)``; :meth:`close` from any thread ends it."""

    def __init__(self, resp: Stream) -> None:
        self._resp = resp

    def __iter__(self) -> Iterator[tuple[str, Obj]]:
        buf = b""
        try:
            for chunk in self._resp.chunks():
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        event = json.loads(line)
                        yield str(event.get("type", "")), dict(event.get("object") or {})
        except (HttpError, OSError, ValueError) as exc:
            raise KubeConnectionError(f"watch stream broken: {exc}") from exc
        finally:
            self._resp.close()

    def close(self) -> None:
        self._resp.close()


def _segment(value: str) -> str:
    """One URL path segment: every reserved character escaped (``/`` included), and
    the dot segments that an HTTP stack would resolve refused."""
    if value in ("", ".", ".."):
        raise KubeError(f"{value!r} cannot be an object name in an API path")
    return quote(value, safe="")


def _decode(method: str, path: str, status: int, data: bytes) -> Obj:
    try:
        body = json.loads(data) if data else {}
    except ValueError:
        body = {"message": data[:256].decode(errors="replace")}
    if 200 <= status < 300:
        return dict(body)
    reason = str(body.get("reason", "")) if isinstance(body, dict) else ""
    message = str(body.get("message", "")) if isinstance(body, dict) else ""
    message = f"{method} {path}: {message}"
    cls = {404: NotFoundError, 409: ConflictError}.get(status, KubeApiError)
    raise cls(status, reason, message)


def _stat(*paths: Path | None) -> tuple[tuple[int, int], ...]:
    """(mtime_ns, size) of each file, to notice a rotation."""
    out = []
    for path in paths:
        try:
            st = path.stat() if path is not None else None
        except OSError:
            st = None
        out.append((st.st_mtime_ns, st.st_size) if st else (0, 0))
    return tuple(out)
