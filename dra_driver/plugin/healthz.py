"""HTTP health endpoint for the kubelet's probes of the plugin pod (and of the
ComputeDomain controller's, from any :class:`HealthState`).

``GET /healthz`` (liveness): 200 while the gRPC sockets serve and no background
thread has died; 503 otherwise, so the kubelet restarts the plugin. ``GET /readyz``
(readiness): 200 once registered with the kubelet and the ResourceSlices are
in sync (:attr:`Readiness.ready`), else 503 with the problems; its body also
lists the devices that are not Healthy, exactly as last streamed to the
kubelet. Both answer a small JSON body. ``GET /metrics`` serves Prometheus
text once the server was given metrics (at construction or by
:meth:`HealthServer.serve_metrics`, so a daemon can answer probes before it
imports its metrics).

Served by the standard library's ``http.server`` (``ThreadingHTTPServer``: a thread
per connection, so a slow client never holds up the kubelet's probes; each one gets
10 s). Every answer closes its connection; GET and HEAD are answered, POST, PUT,
DELETE, PATCH and OPTIONS get 405, anything else the library's 501.
"""

from __future__ import annotations

import http.server
import json
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from dra_driver.plugin.httpthread import BackgroundHTTPServer

if TYPE_CHECKING:
    from dra_driver.plugin.backend import DeviceHealth


class HealthState(Protocol):
    """What a probe answers from: the kubelet plugin's ``Readiness``, or any other
    process's snapshot (the ComputeDomain controller's)."""

    @property
    def alive(self) -> bool: ...

    @property
    def ready(self) -> bool: ...

    @property
    def problems(self) -> list[str]: ...


class HealthServer:
    """Serves ``/healthz`` and ``/readyz`` from a readiness callable in a thread."""

    def __init__(
        self,
        *,
        readiness: Callable[[], HealthState],
        port: int,
        logger: logging.Logger,
        host: str = "",
        metrics: Callable[[], tuple[bytes, str]] | None = None,
    ) -> None:
        """``port`` 0 picks a free port (see :attr:`port`); ``host`` "" binds all addresses.
        ``metrics`` renders ``/metrics`` (body, content type); None answers 404 there."""
        self._readiness = readiness
        self._metrics = metrics
        self._log = logger
        self._http = BackgroundHTTPServer(host, port, self._handler_class(), "healthz")

    def serve_metrics(self, metrics: Callable[[], tuple[bytes, str]]) -> None:
        """Serve ``/metrics`` from now on (it answered 404 until then)."""
        self._metrics = metrics

    @property
    def port(self) -> int:
        return self._http.port

    def start(self) -> None:
        self._http.start()
        self._log.info("health endpoint listening", extra={"port": self.port})

    def stop(self) -> None:
        self._http.stop()

    def answer(self, path: str) -> tuple[int, dict[str, Any]]:
        """Status code and JSON body for ``path``; what the handler sends."""
        if path not in ("/healthz", "/readyz"):
            known = "/healthz, /readyz" + (", /metrics" if self._metrics is not None else "")
            return 404, {"error": f"unknown path {path}; use {known}"}
        try:
            state = self._readiness()
        except Exception as exc:  # a probe must answer, not hang or crash the thread
            self._log.exception("readiness check failed")
            return 503, {"ok": False, "problems": [f"readiness check failed: {exc}"]}
        if path == "/healthz":
            ok = state.alive
            problems = [] if ok else state.problems[:1]
        else:
            ok = state.ready
            problems = state.problems
            listed: Sequence[DeviceHealth] | None = getattr(state, "devices", None)
            if listed is not None:  # a kubelet plugin: the devices it streams
                devices = {
                    "healthy": sum(d.health == "Healthy" for d in listed),
                    "unhealthy": [
                        {"pool": d.pool, "device": d.device, "health": d.health,
                         "message": d.message}
                        for d in listed
                        if d.health != "Healthy"
                    ],
                }  # fmt: skip
                return (200 if ok else 503), {"ok": ok, "problems": problems, "devices": devices}
        return (200 if ok else 503), {"ok": ok, "problems": problems}

    def respond(self, method: str, path: str) -> tuple[int, bytes, str]:
        """Status, body and content type for a request (HEAD gets no body)."""
        if method not in ("GET", "HEAD"):
            return 405, b"only GET and HEAD\n", "text/plain"
        path = path.split("?", 1)[0]
        if path == "/metrics" and self._metrics is not None:
            try:
                data, content_type = self._metrics()
            except Exception as exc:  # a scrape must answer, not kill the thread
                self._log.exception("rendering metrics failed")
                return 500, f"{exc}\n".encode(), "text/plain"
            return 200, data, content_type
        code, body = self.answer(path)
        return code, (json.dumps(body) + "\n").encode(), "application/json"

    def _handler_class(self) -> type[http.server.BaseHTTPRequestHandler]:
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # the status line; the connection still closes
            timeout = _CONNECTION_TIMEOUT_S  # a slow or silent client holds one thread this long

            def _reply(self) -> None:
                try:
                    code, data, content_type = server.respond(self.command, self.path)
                except Exception as exc:  # logged as ours, not a traceback on stderr
                    server._log.exception("health endpoint request failed")
                    code, data, content_type = 500, f"{exc}\n".encode(), "text/plain"
                self.close_connection = True
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", content_type)
                    self.send_header("Content-Length", str(len(data)))
                    self.send_header("Connection", "close")
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                except OSError:  # hung up: nobody to answer, and no traceback on stderr
                    pass

            do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _reply

            def log_message(self, format: str, *args: Any) -> None:
                # Not stderr: probes every few seconds are not news; malformed requests
                # and timeouts are worth a debug line.
                server._log.debug("health endpoint: " + format, *args)

        return Handler


_CONNECTION_TIMEOUT_S = 10.0
