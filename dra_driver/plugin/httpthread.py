"""A standard-library HTTP server in a daemon thread: what the plugin's health endpoint
(:mod:`dra_driver.plugin.healthz`) and the scoring extender
(:mod:`dra_driver.extender.serving`) share, so both bind, serve and stop alike.

``ThreadingHTTPServer``: a thread per connection, so one slow client never holds up the
others. Its ``server_bind`` also resolves this host's FQDN, a DNS lookup that can take
seconds in a pod, for a name nothing here uses: binding skips it.
"""

from __future__ import annotations

import http.server
import socketserver
import threading


class BackgroundHTTPServer:
    """Serves ``handler`` on ``host``:``port`` in a daemon thread named ``name`` from
    :meth:`start` until :meth:`stop`."""

    def __init__(
        self, host: str, port: int, handler: type[http.server.BaseHTTPRequestHandler], name: str
    ) -> None:
        """``port`` 0 picks a free one (:attr:`port`); ``host`` "" binds all addresses."""
        self._server = _Server((host, port), handler)
        self._name = name
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._server.serve_forever, name=self._name, daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


class _Server(http.server.ThreadingHTTPServer):
    def server_bind(self) -> None:
        socketserver.TCPServer.server_bind(self)  # not HTTPServer's: no FQDN lookup
        self.server_name, self.server_port = "", int(self.server_address[1])
