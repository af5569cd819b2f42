"""The API server calls the kubelet plugin makes, through the ``kubernetes`` client.

Everything below the calls is the library's: the in-cluster configuration (the
projected service-account token, re-read as it rotates), kubeconfig files
(``:``-joined lists, contexts, client certificates, exec credential plugins whose
credentials are fetched again when they expire), TLS, and urllib3's connection
pool, sized for the gRPC workers that GET claims at once. What stays here is a
facade of the eight calls the plugin makes, on plain dicts: the library's REST
client serializes and sends them (``ApiClient.param_serialize`` / ``call_api``),
and only our JSON bodies are decoded, never its generated models.

Importing the library loads every generated model (~0.6 s, ~19 MB, docs/footprint.md):
:meth:`KubeClient.connect` does, once the daemon's sockets serve; earlier calls wait.

Errors (all raised ``from`` the original cause)::

    KubeError
    ├── KubeConfigError         credentials cannot be loaded (which file, what)
    ├── KubeConnectionError     transport failure, timeout, bad TLS
    └── KubeApiError            non-2xx answer; .status, .reason, .message
        ├── NotFoundError       404
        └── ConflictError       409 (stale resourceVersion, already exists)
"""

from __future__ import annotations

import contextlib
import json
import shutil
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dra_driver.errors import DriverError
from dra_driver.plugin import kubeauth
from dra_driver.plugin.kubeauth import Credentials

RESOURCE_API = "/apis/resource.k8s.io/v1"
USER_AGENT = "dra-driver-plugin"

Obj = dict[str, Any]


class KubeError(DriverError):
    """Any failure talking to the API server."""


class KubeConfigError(KubeError):
    """Credentials could not be loaded; names the file and the missing piece."""


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


class KubeClient:
    """Thread-safe; one connection pool shared by all callers, made by :meth:`connect`."""

    def __init__(
        self, credentials: Credentials, *, timeout_s: float = 10.0, pool_size: int = 20
    ) -> None:
        """Prefer :meth:`in_cluster`, :meth:`from_kubeconfig` or :meth:`for_server`.
        ``pool_size`` is how many requests may hold a connection at once (more wait)."""
        if pool_size < 1:
            raise ValueError(f"pool_size: {pool_size}; want at least 1")
        self._credentials = credentials
        self._timeout_s = timeout_s
        self._pool_size = pool_size
        self._lock = threading.Lock()
        self._api: Any = None
        self._tmp: Path | None = None

    @classmethod
    def in_cluster(
        cls, environ: Mapping[str, str], sa_dir: Path = kubeauth.IN_CLUSTER_SA_DIR, **kw: Any
    ) -> KubeClient:
        """The pod's service account (:func:`~dra_driver.plugin.kubeauth.in_cluster`)."""
        return cls(kubeauth.in_cluster(environ, sa_dir), **kw)

    @classmethod
    def from_kubeconfig(cls, paths: str, context: str | None = None, **kw: Any) -> KubeClient:
        """Kubeconfig file(s) as kubectl reads them
        (:func:`~dra_driver.plugin.kubeauth.kubeconfig`)."""
        return cls(kubeauth.kubeconfig(paths, context), **kw)

    @classmethod
    def for_server(cls, server: str, *, token: str | None = None, **kw: Any) -> KubeClient:
        """A server URL and a bearer token (tests and tools)."""
        return cls(kubeauth.for_server(server, token), **kw)

    # -- connection ------------------------------------------------------------

    def connect(self) -> None:
        """Import the library and load the credentials (once; any thread)."""
        self._apis()

    def _apis(self) -> Any:
        api = self._api
        if api is not None:
            return api
        with self._lock:
            if self._api is None:
                self._api = self._make()
            return self._api

    def _make(self) -> Any:
        import kubernetes.client  # heavy: see the module docstring

        cfg = kubernetes.client.Configuration()
        self._tmp = kubeauth.cert_dir()
        try:
            self._credentials.configure(cfg, self._tmp)
        except Exception as exc:  # the loaders raise ConfigException, OSError, ValueError...
            said = " ".join(str(exc).split())  # YAML errors span lines: one line for the log
            raise KubeConfigError(f"cannot load the {self._credentials.what}: {said}") from exc
        with contextlib.suppress(OSError):  # nothing written (no inline data): no dir left
            self._tmp.rmdir()  # behind a SIGKILL; the library makes it again if it must
        if not cfg.host:
            raise KubeConfigError(f"the {self._credentials.what} names no API server")
        cfg.connection_pool_maxsize = self._pool_size
        cfg.retries = _retries()
        api = kubernetes.client.ApiClient(cfg)
        api.user_agent = USER_AGENT
        return api

    @property
    def server(self) -> str:
        return str(self._apis().configuration.host)

    def close(self) -> None:
        with self._lock:
            api, self._api = self._api, None
            tmp, self._tmp = self._tmp, None
        if api is not None:
            api.close()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)

    # -- plumbing ------------------------------------------------------------

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
        api = self._apis()
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        with self._stale_on_401(), _errors(method, path):
            serialized = api.param_serialize(
                method, path, query_params=list((params or {}).items()), header_params=headers,
                body=body, auth_settings=["BearerToken"],
            )  # fmt: skip
            resp = api.call_api(*serialized[:4], _request_timeout=self._timeout_s)
            data = resp.read()
            return _decode(method, path, resp.status, data)

    @contextmanager
    def _stale_on_401(self) -> Iterator[None]:
        """A refused token is read again from its file before the next call (kubeauth)."""
        try:
            yield
        except KubeApiError as exc:
            if exc.status == 401:
                self._credentials.stale()
            raise

    # -- the calls the plugin makes -----------------------------------------------

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
                "PATCH", path, body=body, params={"fieldManager": field_manager, "force": "true"},
                content_type="application/apply-patch+yaml",
            )  # fmt: skip
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
        pre = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
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
        """Events after ``resource_version``; ends when the server closes (``timeout_s``)."""
        return self.watch(f"{RESOURCE_API}/resourceslices", {"fieldSelector": field_selector},
                          resource_version, timeout_s=timeout_s)  # fmt: skip

    def watch(
        self, path: str, params: Mapping[str, str], resource_version: str, *, timeout_s: int = 300
    ) -> Watch:
        """Events of the collection at ``path`` (``params``: its selectors) after
        ``resource_version``; ends when the server closes (``timeout_s``)."""
        api = self._apis()
        query = [("watch", "true"), *params.items(), ("resourceVersion", resource_version),
                 ("allowWatchBookmarks", "true"), ("timeoutSeconds", timeout_s)]  # fmt: skip
        what = f"{path}?watch"
        with self._stale_on_401(), _errors("GET", what):
            serialized = api.param_serialize(
                "GET", path, query_params=query,
                header_params={"Accept": "application/json"}, auth_settings=["BearerToken"],
            )  # fmt: skip
            resp = api.call_api(*serialized[:4], _request_timeout=(self._timeout_s, timeout_s + 30))
            if not 200 <= resp.status < 300:
                _decode("GET", what, resp.status, resp.read())
        return Watch(resp.response)


class Watch:
    """Iterator of ``(type, object)`` over one watch response, lines decoded by the
    library's own reader; :meth:`close` from any thread ends it at once."""

    def __init__(self, response: Any) -> None:
        self._resp = response

    def __iter__(self) -> Iterator[tuple[str, Obj]]:
        from kubernetes.watch.watch import iter_resp_lines

        try:
            with _errors("GET", "watch resourceslices"):
                for line in iter_resp_lines(self._resp):  # type: ignore[no-untyped-call]
                    if line:
                        event = json.loads(line)
                        yield str(event.get("type", "")), dict(event.get("object") or {})
        finally:
            self.close()

    def close(self) -> None:
        try:
            self._resp.shutdown()  # wakes a read blocked in another thread
        except (RuntimeError, ValueError):  # read to its end, or closed before (stop, then
            pass  # the reader's own finally): nothing left to wake
        finally:
            self._resp.close()  # never back into the pool: the server may still send


@contextmanager
def _errors(method: str, path: str) -> Iterator[None]:
    """The library's and urllib3's exceptions become ours, in one place."""
    from kubernetes.client.exceptions import ApiException, ApiValueError
    from urllib3.exceptions import HTTPError

    try:
        yield
    except ApiException as exc:  # status 0: the library's wrapping of a TLS or socket error
        if not exc.status:
            raise KubeConnectionError(f"{method} {path}: {exc.reason}") from exc
        _decode(method, path, int(exc.status), (exc.body or "").encode())
        raise  # a 2xx ApiException: cannot happen
    except (HTTPError, OSError) as exc:
        raise KubeConnectionError(f"{method} {path}: {exc}") from exc
    except (ApiValueError, ValueError) as exc:
        raise KubeError(f"{method} {path}: {exc}") from exc


def _retries() -> Any:
    """urllib3's retries: connecting is tried up to three times, and an idempotent
    request whose kept-alive connection the server had closed is sent once more; a POST
    is never sent twice, and a read that timed out is not repeated (a frozen server
    would only double the wait of a prepare the kubelet gives 45 s)."""
    from types import TracebackType

    from urllib3.connectionpool import ConnectionPool
    from urllib3.exceptions import ReadTimeoutError
    from urllib3.response import BaseHTTPResponse
    from urllib3.util.retry import Retry

    class NoTimeoutRetry(Retry):
        def increment(
            self,
            method: str | None = None,
            url: str | None = None,
            response: BaseHTTPResponse | None = None,
            error: Exception | None = None,
            _pool: ConnectionPool | None = None,
            _stacktrace: TracebackType | None = None,
        ) -> NoTimeoutRetry:
            if isinstance(error, ReadTimeoutError):
                raise error
            return super().increment(method, url, response, error, _pool, _stacktrace)

    return NoTimeoutRetry(total=2, connect=2, read=1, status=0, redirect=0, other=0)


def _segment(value: str) -> str:
    """One URL path segment: the library escapes every reserved character (``/``
    included); the dot segments an HTTP stack would resolve are refused here."""
    if value in ("", ".", ".."):
        raise KubeError(f"{value!r} cannot be an object name in an API path")
    from urllib.parse import quote

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
