"""HTTP/1.1 over kept-alive sockets: the transport of :mod:`dra_driver.plugin.kubeclient`.

Why not urllib3 (the transport before): every claim GET of a prepare paid ~1.25 ms of
CPU in urllib3 and ``http.client`` (whose header parsing runs the ``email`` package)
against ~0.33 ms here, a quarter of the plugin's CPU per prepare, and urllib3 kept
2.2 MB resident (README "Benchmarks"). What the API server and we exchange is narrow:
JSON bodies with ``Content-Length`` or chunked, no compression (never asked for), no
redirects, proxies or ``100-continue``; this module speaks exactly that and refuses
anything else with :class:`HttpError`.

Connections are pooled per :class:`HttpPool` (one server); a pooled connection that
became readable while idle (the server closed it) is dropped before reuse, and an
idempotent request whose reused connection fails before any answer is sent once more
on a new one. Timeouts apply to each connect, send and receive.

A pool runs ``connections`` whole-answer requests at once (streams aside); more wait
for a free connection, up to ``overflow_after_s``, and then go ahead on a connection of
their own (no more than ``connections`` are kept idle). Each connection costs a TLS
handshake (1-2 ms of CPU here, under the GIL) and a socket on the API server: a burst of
16 prepares on an uncapped pool opened up to 16 of them over its first bursts, where
client-go multiplexes one HTTP/2 connection, while a claim GET holds its connection for
about a millisecond, so four serve a burst as fast (README "Benchmarks"). The overflow
keeps a slow server's latency from queueing up into timeouts: requests then run side by
side as before.

With ``http2_ssl_context`` (its ALPN offering ``h2``), GETs go over one HTTP/2
connection (:mod:`.http2`), side by side on one socket as client-go's: a burst of 16
claim GETs then costs the API server and etcd what the Go reference plugin's does (34
instead of 40 ms of CPU, README "Benchmarks"). A server that does not choose ``h2`` is
not asked again (the connection it chose serves HTTP/1.1), and a GET beyond the
server's limit of concurrent streams goes over HTTP/1.1.
"""

from __future__ import annotations

import select
import socket
import ssl
import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import BinaryIO
from urllib.parse import urlsplit

from dra_driver.plugin.http2 import Busy, H2Connection, Unsent
from dra_driver.plugin.httptypes import HttpError, Response

__all__ = ["HttpError", "HttpPool", "Response", "Stream"]

MAX_LINE = 65536
MAX_HEADERS = 200
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE"})


class _Stale(HttpError):
    """A reused connection failed before any answer: safe to send again."""


class _Conn:
    def __init__(self, sock: socket.socket, *, unused: bool = False) -> None:
        self.sock = sock
        self.rfile: BinaryIO = sock.makefile("rb")
        self.unused = unused

    def idle_ok(self) -> bool:
        """An idle keep-alive connection has nothing to read; if it has, the server
        closed it (or broke the protocol): not reusable. A connection not used yet is:
        what a TLS 1.3 server sends after the handshake (session tickets) is read with
        the first answer."""
        if self.unused:
            self.unused = False
            return True
        if isinstance(self.sock, ssl.SSLSocket) and self.sock.pending():
            return False
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return False
        return not readable

    def close(self) -> None:
        for closer in (self.rfile.close, self.sock.close):
            try:
                closer()
            except OSError:
                pass


def _line(f: BinaryIO) -> bytes:
    line = f.readline(MAX_LINE + 1)
    if len(line) > MAX_LINE:
        raise HttpError("response line longer than 64 KiB")
    return line


def _read_head(f: BinaryIO) -> tuple[str, int, dict[str, str]]:
    while True:
        status_line = _line(f)
        if not status_line:
            raise _Stale("connection closed before the response")
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise HttpError(f"malformed status line {status_line[:80]!r}")
        headers: dict[str, str] = {}
        for _ in range(MAX_HEADERS + 1):
            line = _line(f)
            if line in (b"\r\n", b"\n"):
                break
            if not line:
                raise HttpError("connection closed inside the response headers")
            name, sep, value = line.decode("latin-1").partition(":")
            if not sep:
                raise HttpError(f"malformed header line {line[:80]!r}")
            key, value = name.strip().lower(), value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        else:
            raise HttpError(f"more than {MAX_HEADERS} response headers")
        status = int(parts[1])
        if 100 <= status < 200:
            continue  # informational: the real answer follows
        return parts[0].decode("latin-1"), status, headers


def _chunks(f: BinaryIO) -> Iterator[bytes]:
    """The decoded chunks of a chunked body (trailers read and dropped)."""
    while True:
        size_line = _line(f)
        try:
            size = int(size_line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise HttpError(f"malformed chunk size {size_line[:40]!r}") from None
        if size == 0:
            while _line(f) not in (b"\r\n", b"\n", b""):
                pass
            return
        data = f.read(size)
        if len(data) != size or _line(f) not in (b"\r\n", b"\n"):
            raise HttpError("connection closed inside a chunk")
        yield data


def _exact(f: BinaryIO, length: int) -> bytes:
    data = f.read(length)
    if len(data) != length:
        raise HttpError(f"connection closed after {len(data)} of {length} body bytes")
    return data


def _chunked(headers: Mapping[str, str]) -> bool:
    return "chunked" in headers.get("transfer-encoding", "").lower()


def _body(f: BinaryIO, headers: Mapping[str, str]) -> Iterator[bytes]:
    """The body as it arrives, framed as the headers say: chunked, ``Content-Length``,
    or (neither) up to the server's close."""
    if _chunked(headers):
        yield from _chunks(f)
    elif "content-length" in headers:
        yield _exact(f, int(headers["content-length"]))
    else:
        while data := f.read1(65536):  # type: ignore[attr-defined]
            yield data


def _close_all(conns: list[_Conn], h2: Iterable[H2Connection] = ()) -> None:
    for conn in conns:
        conn.close()
    for h2conn in h2:
        h2conn.close()


def _keeps_alive(version: str, headers: Mapping[str, str], *, bodyless: bool) -> bool:
    """Reusable after this answer: HTTP/1.1, not ``Connection: close``, and a body whose
    end was known (one read up to the server's close used the connection up)."""
    tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
    framed = bodyless or _chunked(headers) or "content-length" in headers
    return version == "HTTP/1.1" and "close" not in tokens and framed


class HttpPool:
    """Kept-alive connections to one server (``http(s)://host[:port][/prefix]``);
    thread-safe, each connection used by one request at a time, ``connections``
    requests at once unless one waited ``overflow_after_s`` for its turn."""

    def __init__(
        self,
        server: str,
        *,
        ssl_context: ssl.SSLContext | None,
        connections: int = 4,
        overflow_after_s: float = 0.25,
        http2_ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        url = urlsplit(server)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"server {server!r}: want http(s)://host[:port][/path]")
        self._tls = ssl_context if url.scheme == "https" else None
        if url.scheme == "https" and self._tls is None:
            raise ValueError(f"server {server!r}: https needs a TLS context")
        self._host = url.hostname
        default = 443 if url.scheme == "https" else 80
        self._port = url.port or default
        host = f"[{self._host}]" if ":" in self._host else self._host
        self._host_header = host if self._port == default else f"{host}:{self._port}"
        self._prefix = url.path.rstrip("/")
        if connections < 1:
            raise ValueError(f"connections: {connections}; want at least 1")
        self._maxsize = connections
        self._slots = threading.BoundedSemaphore(connections)
        self._overflow_after_s = overflow_after_s
        self._idle: list[_Conn] = []
        self._lock = threading.Lock()
        self._closed = False
        self._h2_tls = http2_ssl_context if url.scheme == "https" else None
        self._h2: list[H2Connection] = []  # the current one last; older ones retired
        self._h2_lock = threading.Lock()  # one HTTP/2 connect at a time
        # A pool dropped without close() still closes its sockets.
        weakref.finalize(self, _close_all, self._idle, self._h2)

    # -- connections ---------------------------------------------------------

    def _socket(self, timeout: float, tls: ssl.SSLContext | None) -> socket.socket:
        try:
            sock = socket.create_connection((self._host, self._port), timeout=timeout)
        except OSError as exc:
            raise HttpError(f"connect to {self._host}:{self._port}: {exc}") from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if tls is not None:
                sock = tls.wrap_socket(sock, server_hostname=self._host)
        except (OSError, ssl.SSLError) as exc:
            sock.close()
            raise HttpError(f"TLS with {self._host}:{self._port}: {exc}") from exc
        return sock

    def _connect(self, timeout: float) -> _Conn:
        return _Conn(self._socket(timeout, self._tls))

    def _http2(self, timeout: float) -> H2Connection | None:
        """The HTTP/2 connection, opened if needed; None once the server chose HTTP/1.1."""
        current = self._h2[-1] if self._h2 else None
        if current is not None and current.accepting:
            return current
        with self._h2_lock:
            with self._lock:
                if self._h2_tls is None or self._closed:
                    return None
                self._h2[:] = [c for c in self._h2 if not c.closed]
                current = self._h2[-1] if self._h2 else None
                if current is not None and current.accepting:
                    return current
            if current is not None:
                current.retire()  # told to go away, or out of stream ids
            sock = self._socket(timeout, self._h2_tls)
            if not isinstance(sock, ssl.SSLSocket) or sock.selected_alpn_protocol() != "h2":
                with self._lock:
                    self._h2_tls = None
                self._checkin(_Conn(sock, unused=True))  # it speaks HTTP/1.1: use it so
                return None
            try:
                conn = H2Connection(sock, self._host_header, timeout=timeout)
            except (OSError, ssl.SSLError) as exc:
                sock.close()
                raise HttpError(f"HTTP/2 preface to {self._host}:{self._port}: {exc}") from exc
            if self._keep_http2(conn):
                return conn
            conn.close()  # the pool closed meanwhile
            return None

    def _keep_http2(self, conn: H2Connection) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._h2.append(conn)
            return True

    def _checkout(self, timeout: float) -> tuple[_Conn, bool]:
        """A connection, and whether it was reused from the pool."""
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                if conn.idle_ok():
                    return conn, True
                conn.close()
        return self._connect(timeout), False

    def _checkin(self, conn: _Conn) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._maxsize:
                self._idle.append(conn)
                return
        conn.close()

    def clear(self) -> None:
        """Close idle connections; connections in use close when their requests end."""
        with self._lock:
            idle = self._idle[:]
            self._idle.clear()
            h2 = self._h2[:]
        _close_all(idle)
        for conn in h2:
            conn.retire()

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self.clear()

    # -- requests ------------------------------------------------------------

    def _head(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes | None
    ) -> bytes:
        if any(c in part for part in (method, target, *headers, *headers.values())
               for c in "\r\n\0"):  # fmt: skip
            raise ValueError("CR, LF or NUL in the request line or a header")
        lines = [f"{method} {self._prefix}{target} HTTP/1.1", f"Host: {self._host_header}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body or b'')}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")

    def _send(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes | None,
        connect_timeout: float, read_timeout: float,
    ) -> tuple[_Conn, str, int, dict[str, str]]:  # fmt: skip
        """Send and read the answer's head, once more on a new connection when a
        reused one turned out closed (idempotent methods only)."""
        data = self._head(method, target, headers, body)
        for attempt in (0, 1):
            conn, reused = self._checkout(connect_timeout)
            try:
                conn.sock.settimeout(read_timeout)
                try:
                    conn.sock.sendall(data)
                except (BrokenPipeError, ConnectionResetError) as exc:
                    raise _Stale(f"send: {exc}") from exc
                version, status, resp_headers = _read_head(conn.rfile)
                return conn, version, status, resp_headers
            except _Stale as exc:
                conn.close()
                if not (reused and attempt == 0 and method in IDEMPOTENT):
                    raise HttpError(f"{method} {target}: {exc}") from exc
            except HttpError:
                conn.close()
                raise
            except (OSError, ssl.SSLError) as exc:
                conn.close()
                raise HttpError(f"{method} {target}: {exc}") from exc
        raise AssertionError("unreachable")

    def request(
        self,
        method: str,
        target: str,
        *,
        headers: Mapping[str, str],
        body: bytes | None = None,
        timeout: float = 10.0,
    ) -> Response:
        """One request with its whole answer; ``target`` is the path and query."""
        if body is None and method == "GET" and self._h2_tls is not None:
            answer = self._request_http2(target, headers, timeout)
            if answer is not None:
                return answer
        # Without a slot (every connection stayed busy: a slow server) the request goes
        # ahead on one more connection, which _checkin closes again.
        slot = self._slots.acquire(timeout=self._overflow_after_s)
        try:
            return self._request(method, target, headers, body, timeout)
        finally:
            if slot:
                self._slots.release()

    def _request_http2(
        self, target: str, headers: Mapping[str, str], timeout: float
    ) -> Response | None:
        """The answer over HTTP/2, or None where HTTP/1.1 must serve it."""
        for attempt in (0, 1):
            conn = self._http2(timeout)
            if conn is None:
                return None
            try:
                return conn.request("GET", target, headers, timeout)
            except Busy:
                return None
            except Unsent as exc:
                if attempt:
                    raise HttpError(f"GET {target}: {exc}") from exc
            except HttpError as exc:
                raise HttpError(f"GET {target}: {exc}") from exc
        raise AssertionError("unreachable")

    def _request(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes | None,
        timeout: float,
    ) -> Response:  # fmt: skip
        conn, version, status, resp_headers = self._send(
            method, target, headers, body, timeout, timeout
        )
        try:
            bodyless = method == "HEAD" or status in (204, 304)
            data = b"" if bodyless else b"".join(_body(conn.rfile, resp_headers))
        except (OSError, ssl.SSLError, ValueError) as exc:
            conn.close()
            raise HttpError(f"{method} {target}: reading the body: {exc}") from exc
        except HttpError:
            conn.close()
            raise
        if _keeps_alive(version, resp_headers, bodyless=bodyless):
            self._checkin(conn)
        else:
            conn.close()
        return Response(status, resp_headers, data)

    def stream(
        self,
        target: str,
        *,
        headers: Mapping[str, str],
        connect_timeout: float = 10.0,
        read_timeout: float = 330.0,
    ) -> Stream:
        """A GET whose body is read as it arrives (watches); the connection is never
        reused. A non-2xx answer is read whole (``Stream.body``)."""
        conn, _, status, resp_headers = self._send(
            "GET", target, headers, None, connect_timeout, read_timeout
        )
        return Stream(conn, status, resp_headers)


class Stream:
    """A streamed answer: :meth:`chunks` yields body bytes as they come; :meth:`close`
    from any thread ends a read blocked in another."""

    def __init__(self, conn: _Conn, status: int, headers: Mapping[str, str]) -> None:
        self._conn = conn
        self.status = status
        self.headers = headers

    def chunks(self) -> Iterator[bytes]:
        try:
            yield from _body(self._conn.rfile, self.headers)
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise HttpError(f"stream broken: {exc}") from exc
        finally:
            self.close()

    def body(self) -> bytes:
        return b"".join(self.chunks())

    def close(self) -> None:
        try:
            self._conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._conn.close()
