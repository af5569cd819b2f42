"""HTTP health endpoint for the kubelet's probes of the plugin pod.

``GET /healthz`` (liveness): 200 while the gRPC sockets serve and no background
thread has died; 503 otherwise, so the kubelet restarts the plugin. ``GET /readyz``
(readiness): 200 once registered with the kubelet and the ResourceSlices are
in sync (:attr:`Readiness.ready`), else 503 with the problems; its body also
lists the devices that are not Healthy, exactly as last streamed to the
kubelet. Both answer a small JSON body. ``GET /metrics`` serves Prometheus
text once the server was given metrics (at construction or by
:meth:`HealthServer.serve_metrics`, so a daemon can answer probes before it
imports its metrics).

Not ``http.server``: it loads ``http.client``, ``email`` and ``html`` (1.3 MB of
resident memory at rest, measured). Probes and scrapes are one GET per
connection, so a request line and headers read with limits (8 KiB a line, 100
lines, 10 s per connection) and a ``Connection: close`` answer over
``socketserver`` (32 kB) are all it takes; GET and HEAD only.
"""

from __future__ import annotations

import json
import logging
import socketserver
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dra_driver.plugin.settings import Readiness


class HealthServer:
    """Serves ``/healthz`` and ``/readyz`` from a readiness callable in a thread."""

    def __init__(
        self,
        *,
        readiness: Callable[[], Readiness],
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
        self._server = _Server((host, port), self._handler_class())
        self._thread: threading.Thread | None = None

    def serve_metrics(self, metrics: Callable[[], tuple[bytes, str]]) -> None:
        """Serve ``/metrics`` from now on (it answered 404 until then)."""
        self._metrics = metrics

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="healthz", daemon=True
        )
        self._thread.start()
        self._log.info("health endpoint listening", extra={"port": self.port})

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

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
            devices = {
                "healthy": sum(d.health == "Healthy" for d in state.devices),
                "unhealthy": [
                    {"pool": d.pool, "device": d.device, "health": d.health, "message": d.message}
                    for d in state.devices
                    if d.health != "Healthy"
                ],
            }
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

    def _handler_class(self) -> type[socketserver.StreamRequestHandler]:
        server = self

        class Handler(socketserver.StreamRequestHandler):
            timeout = _CONNECTION_TIMEOUT_S  # a slow or silent client holds one thread this long

            def handle(self) -> None:
                try:
                    code, data, content_type, method = self._answer()
                except OSError:  # timed out or hung up: nobody to answer
                    return
                except Exception as exc:  # logged as ours, not a traceback on stderr
                    server._log.exception("health endpoint request failed")
                    code, data, content_type, method = 500, f"{exc}\n".encode(), "text/plain", ""
                head = (
                    f"HTTP/1.1 {code} {_REASONS.get(code, 'Error')}\r\n"
                    f"Content-Type: {content_type}\r\n"
                    f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
                )
                try:
                    self.wfile.write(head.encode() + (b"" if method == "HEAD" else data))
                except OSError:
                    pass

            def _answer(self) -> tuple[int, bytes, str, str]:
                line = self.rfile.readline(_MAX_LINE + 1)
                if len(line) > _MAX_LINE:
                    return 414, b"request line too long\n", "text/plain", ""
                parts = line.decode("latin-1").split()
                if len(parts) != 3 or not parts[2].startswith("HTTP/"):
                    return 400, b"malformed request line\n", "text/plain", ""
                for _ in range(_MAX_HEADERS + 1):
                    header = self.rfile.readline(_MAX_LINE + 1)
                    if header in (b"\r\n", b"\n", b""):
                        break
                    if len(header) > _MAX_LINE:
                        return 431, b"header line too long\n", "text/plain", ""
                else:
                    return 431, b"too many header lines\n", "text/plain", ""
                method, target = parts[0], parts[1]
                return (*server.respond(method, target), method)

        return Handler


_MAX_LINE = 8192
_MAX_HEADERS = 100
_CONNECTION_TIMEOUT_S = 10.0
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            414: "URI Too Long", 431: "Request Header Fields Too Large",
            500: "Internal Server Error", 503: "Service Unavailable"}  # fmt: skip


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
