"""The extender's HTTP server: ``POST /prioritize`` (the Extender API verb, see
:mod:`~dra_driver.extender.prioritizing`) and ``GET /healthz``.

Standard library ``ThreadingHTTPServer`` as the plugin's health endpoint: a thread per
connection, keep-alive (kube-scheduler's client reuses its connections; a new TCP
connection per pod would cost more than the scoring). A body that is not
``ExtenderArgs`` gets 400 naming the field; kube-scheduler then scores without us
(``ignorable``), as it does when we are down or slower than its ``httpTimeout``.
"""

from __future__ import annotations

import http.server
import json
import logging
import time
from typing import Any

from dra_driver.extender.prioritizing import BadArgs, prioritize
from dra_driver.extender.view import ClusterView
from dra_driver.plugin.httpthread import BackgroundHTTPServer

MAX_BODY = 64 << 20
"""Largest request accepted (a NodeList of thousands of nodes, without node caching)."""
KINDS = ("nodes", "pods", "resourceslices", "resourceclaims")


class ExtenderServer:
    """Serves the view's scores until :meth:`stop`."""

    def __init__(
        self, *, view: ClusterView, logger: logging.Logger, host: str = "", port: int = 0
    ) -> None:
        """``port`` 0 picks a free one (:attr:`port`); ``host`` "" binds all addresses."""
        self.view = view
        self._log = logger
        self._http = BackgroundHTTPServer(host, port, self._handler_class(), "extender-http")

    @property
    def port(self) -> int:
        return self._http.port

    def start(self) -> None:
        self._http.start()
        self._log.info("scoring extender listening", extra={"port": self.port})

    def stop(self) -> None:
        self._http.stop()

    def respond(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        """Status and JSON answer for one request."""
        path = path.split("?", 1)[0].rstrip("/")
        if path == "/healthz" and method in ("GET", "HEAD"):
            missing = [k for k in KINDS if k not in self.view.synced]
            if missing:
                return 503, {"ok": False, "problems": [f"not listed yet: {', '.join(missing)}"]}
            return 200, {"ok": True}
        if path != "/prioritize":
            return 404, {"error": f"unknown path {path}; use POST /prioritize, GET /healthz"}
        if method != "POST":
            return 405, {"error": "prioritize takes POST"}
        try:
            args = json.loads(body)
        except ValueError as exc:
            return 400, {"error": f"body: not JSON: {exc}"}
        if not isinstance(args, dict):
            return 400, {"error": "body: want an ExtenderArgs object"}
        began = time.monotonic()
        try:
            scores = prioritize(self.view, args)
        except BadArgs as exc:
            return 400, {"error": str(exc)}
        meta = (args.get("Pod") or {}).get("metadata") or {}
        took_ms = round(1000 * (time.monotonic() - began), 1)
        pod = f"{meta.get('namespace')}/{meta.get('name')}"
        self._log.debug("scored", extra={"pod": pod, "nodes": len(scores), "ms": took_ms})
        return 200, scores

    def _handler_class(self) -> type[http.server.BaseHTTPRequestHandler]:
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: the scheduler reuses connections
            timeout = 60.0
            # Headers and body go out as two writes; with Nagle's algorithm the body
            # waits for the client's delayed ACK (40 ms per pod on Linux).
            disable_nagle_algorithm = True

            def _reply(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY:
                    code, answer = 413, {"error": f"body over {MAX_BODY} bytes"}
                    self.close_connection = True
                else:
                    body = self.rfile.read(length) if length else b""
                    try:
                        code, answer = server.respond(self.command, self.path, body)
                    except Exception as exc:  # logged as ours; the scheduler goes on without us
                        server._log.exception("scoring failed")
                        code, answer = 500, {"error": str(exc)}
                data = (json.dumps(answer) + "\n").encode()
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                except OSError:  # the scheduler gave up (its httpTimeout): nobody to answer
                    self.close_connection = True

            do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = _reply

            def log_message(self, format: str, *args: Any) -> None:
                server._log.debug("extender http: " + format, *args)

        return Handler
