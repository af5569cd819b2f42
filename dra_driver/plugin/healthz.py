"""HTTP health endpoint for the kubelet's probes of the plugin pod.

``GET /healthz`` (liveness): 200 while the gRPC sockets serve and no background
thread has died; 503 otherwise, so the kubelet restarts the plugin. ``GET /readyz``
(readiness): 200 once registered with the kubelet and the ResourceSlices are
in sync (:attr:`Readiness.ready`), else 503 with the problems; its body also
lists the devices that are not Healthy, exactly as last streamed to the
kubelet. Both answer a small JSON body. ``GET /metrics`` serves Prometheus
text once the server was given metrics (at construction or by
:meth:`HealthServer.serve_metrics`, so a daemon can answer probes before it
imports prometheus-client). Stdlib HTTP: a few kB of RSS.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dra_driver.plugin.app import Readiness


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
        self._server = ThreadingHTTPServer((host, port), self._handler_class())
        self._server.daemon_threads = True
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

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics" and server._metrics is not None:
                    try:
                        data, content_type = server._metrics()
                        code = 200
                    except Exception as exc:  # a scrape must answer, not kill the thread
                        server._log.exception("rendering metrics failed")
                        data, content_type, code = f"{exc}\n".encode(), "text/plain", 500
                else:
                    code, body = server.answer(path)
                    data, content_type = (json.dumps(body) + "\n").encode(), "application/json"
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                """Probes every few seconds would flood the log; stay quiet."""

        return Handler
