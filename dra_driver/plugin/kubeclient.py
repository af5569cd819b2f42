"""A small JSON client for the few API calls the kubelet plugin makes.

Why not ``kubernetes.client``: importing it loads every generated model (about
37 MB and 0.6 s, see docs/footprint.md) in a daemon that runs on every GPU node.
This module speaks plain JSON dicts over a pooled ``urllib3`` connection and
loads credentials itself from a kubeconfig file (certificates, bearer token or
token file; no exec plugins) or from the in-cluster service-account mount.

Errors (all raised ``from`` the original cause)::

    KubeError
    ├── KubeConnectionError     transport failure, timeout, bad TLS
    └── KubeApiError            non-2xx answer; .status, .reason, .message
        ├── NotFoundError       404
        └── ConflictError       409 (stale resourceVersion, already exists)
"""

from __future__ import annotations

import base64
import json
import ssl
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import urllib3
import yaml

from dra_driver.errors import DriverError

RESOURCE_API = "/apis/resource.k8s.io/v1"
IN_CLUSTER_SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD_S = 60.0
"""Projected service-account tokens rotate; re-read the file at most this often."""

Obj = dict[str, Any]


class KubeError(DriverError):
    """Any failure talking to the API server."""


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


class KubeConfigError(KubeError):
    """Credentials could not be loaded; names the file and the missing piece."""


@dataclass(frozen=True)
class KubeConfig:
    """Where and how to reach the API server; one of token/token_file/client cert."""

    server: str
    ca_pem: str | None = None
    client_cert_pem: str | None = None
    client_key_pem: str | None = None
    token: str | None = None
    token_file: Path | None = None
    insecure_skip_tls_verify: bool = False


def _data_or_file(entry: Mapping[str, Any], key: str, base: Path) -> str | None:
    data = entry.get(f"{key}-data")
    if data:
        return base64.b64decode(data).decode()
    path = entry.get(key)
    if path:
        return (base / str(path)).read_text()
    return None


def load_kubeconfig(path: Path, context: str | None = None) -> KubeConfig:
    """Read one context of a kubeconfig file (current-context by default)."""
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise KubeConfigError(f"kubeconfig {path}: cannot read: {exc}") from exc
    if not isinstance(doc, dict):
        raise KubeConfigError(f"kubeconfig {path}: not a mapping")
    name = context or doc.get("current-context")

    def pick(kind: str, wanted: str | None) -> dict[str, Any]:
        for item in doc.get(kind) or []:
            if item.get("name") == wanted:
                return dict(item.get(kind[:-1]) or {})
        raise KubeConfigError(f"kubeconfig {path}: {kind[:-1]} {wanted!r} not found")

    ctx = pick("contexts", name)
    cluster = pick("clusters", ctx.get("cluster"))
    user = pick("users", ctx.get("user"))
    if "exec" in user or "auth-provider" in user:
        raise KubeConfigError(f"kubeconfig {path}: exec/auth-provider users are not supported")
    base = path.parent
    server = cluster.get("server")
    if not server:
        raise KubeConfigError(f"kubeconfig {path}: cluster has no server")
    token_file = user.get("tokenFile")
    return KubeConfig(
        server=str(server).rstrip("/"),
        ca_pem=_data_or_file(cluster, "certificate-authority", base),
        client_cert_pem=_data_or_file(user, "client-certificate", base),
        client_key_pem=_data_or_file(user, "client-key", base),
        token=user.get("token"),
        token_file=base / token_file if token_file else None,
        insecure_skip_tls_verify=bool(cluster.get("insecure-skip-tls-verify", False)),
    )


def load_in_cluster(environ: Mapping[str, str], sa_dir: Path = IN_CLUSTER_SA_DIR) -> KubeConfig:
    """Service-account credentials of the pod; ``environ`` is passed in, not read here."""
    host = environ.get("KUBERNETES_SERVICE_HOST")
    port = environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise KubeConfigError("in-cluster config: KUBERNETES_SERVICE_HOST is not set")
    if ":" in host:
        host = f"[{host}]"
    try:
        ca = (sa_dir / "ca.crt").read_text()
    except OSError as exc:
        raise KubeConfigError(f"in-cluster config: cannot read {sa_dir / 'ca.crt'}") from exc
    return KubeConfig(server=f"https://{host}:{port}", ca_pem=ca, token_file=sa_dir / "token")


def _ssl_context(config: KubeConfig) -> ssl.SSLContext:
    ctx = (
        ssl.create_default_context(cadata=config.ca_pem)
        if config.ca_pem
        else (ssl.create_default_context())
    )
    if config.insecure_skip_tls_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if config.client_cert_pem and config.client_key_pem:
        # ssl only loads key pairs from files: write them to a private temp dir
        # (0700, removed right after loading).
        with tempfile.TemporaryDirectory(prefix="kubeclient-") as tmp:
            cert = Path(tmp) / "cert.pem"
            key = Path(tmp) / "key.pem"
            cert.write_text(config.client_cert_pem)
            key.touch(mode=0o600)
            key.write_text(config.client_key_pem)
            ctx.load_cert_chain(cert, key)
    return ctx


class KubeClient:
    """Thread-safe; one pooled connection set shared by all callers."""

    def __init__(self, config: KubeConfig, *, timeout_s: float = 10.0, pool_size: int = 16) -> None:
        self._config = config
        self._timeout_s = timeout_s
        self._http = urllib3.PoolManager(
            num_pools=2,
            maxsize=pool_size,
            block=False,
            ssl_context=_ssl_context(config),
            retries=False,
        )
        self._token_lock = threading.Lock()
        self._token: str | None = config.token
        self._token_read_at = 0.0

    @property
    def server(self) -> str:
        return self._config.server

    def close(self) -> None:
        self._http.clear()

    # -- plumbing ------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "dra-driver-plugin"}
        token = self._current_token()
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

    def _url(self, path: str, params: Mapping[str, str | int] | None) -> str:
        url = self._config.server + path
        if params:
            url += "?" + urlencode(params)
        return url

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
        headers = self._headers()
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        try:
            resp = self._http.request(
                method,
                self._url(path, params),
                body=data,
                headers=headers,
                timeout=urllib3.Timeout(total=self._timeout_s),
            )
        except urllib3.exceptions.HTTPError as exc:
            raise KubeConnectionError(f"{method} {path}: {exc}") from exc
        return _decode(method, path, resp.status, resp.data)

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
        url = self._url(f"{RESOURCE_API}/resourceslices", params)
        try:
            resp = self._http.request(
                "GET",
                url,
                headers=self._headers(),
                preload_content=False,
                timeout=urllib3.Timeout(connect=self._timeout_s, read=timeout_s + 30),
            )
        except urllib3.exceptions.HTTPError as exc:
            raise KubeConnectionError(f"watch resourceslices: {exc}") from exc
        if resp.status != 200:
            data = resp.read()
            resp.release_conn()
            _decode("GET", "watch resourceslices", resp.status, data)
        return Watch(resp)


class Watch:
    """Iterator of ``(type, object)``; :meth:`close` from any thread ends it."""

    def __init__(self, resp: urllib3.BaseHTTPResponse) -> None:
        self._resp = resp

    def __iter__(self) -> Iterator[tuple[str, Obj]]:
        buf = b""
        try:
            for chunk in self._resp.stream(4096, decode_content=True):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        event = json.loads(line)
                        yield str(event.get("type", "")), dict(event.get("object") or {})
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            raise KubeConnectionError(f"watch stream broken: {exc}") from exc
        finally:
            self._resp.release_conn()

    def close(self) -> None:
        self._resp.shutdown()
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
