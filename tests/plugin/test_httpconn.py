"""The API client's HTTP/1.1 transport against a scripted server: what it must parse
(Content-Length, chunked with extensions and trailers, informational answers), when it
reuses a connection and when it must not, what it refuses, and that a watch stream can
be ended from another thread. TLS and the real API server: test_kubeclient_live and
every cluster tier."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from dra_driver.plugin.httpconn import HttpError, HttpPool
from dra_driver.plugin.kubeclient import KubeClient, KubeConfig

from .fakes import read_head

Handler = Callable[[socket.socket, bytes], bool]
"""Gets the connection and one request's head; returns False to close the connection."""
Serve = Callable[[list[Handler]], "tuple[Scripted, HttpPool]"]


class Scripted:
    """A TCP server answering each request with the next handler of a script."""

    def __init__(self, script: list[Handler]) -> None:
        self.script = script
        self.requests: list[bytes] = []
        self.connections = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while self.script:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                buf = b""
                while self.script:
                    got = read_head(conn, buf)
                    if got is None:
                        break
                    head, buf = got
                    self.requests.append(head)
                    if not self.script.pop(0)(conn, head):
                        break

    def close(self) -> None:
        self.sock.close()
        self.thread.join(5)


@pytest.fixture
def serve() -> Iterator[Serve]:
    made: list[tuple[Scripted, HttpPool]] = []

    def make(script: list[Handler]) -> tuple[Scripted, HttpPool]:
        server = Scripted(script)
        pool = HttpPool(f"http://127.0.0.1:{server.port}/prefix/", ssl_context=None)
        made.append((server, pool))
        return server, pool

    yield make
    for server, pool in made:
        pool.close()
        server.close()


def reply(body: bytes = b"{}", *, status: str = "200 OK", extra: str = "") -> Handler:
    def handle(conn: socket.socket, _head: bytes) -> bool:
        conn.sendall(
            f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body
        )
        return "Connection: close" not in extra

    return handle


def raw(data: bytes, keep: bool = True) -> Handler:
    def handle(conn: socket.socket, _head: bytes) -> bool:
        conn.sendall(data)
        return keep

    return handle


def hang_up(conn: socket.socket, _head: bytes) -> bool:
    return False


def test_keep_alive_reuses_one_connection_and_sends_a_well_formed_request(serve: Serve) -> None:
    server, pool = serve([reply(b'{"a": 1}'), reply(b'{"b": 2}', extra="X-Two: 1\r\nX-Two: 2\r\n")])
    first = pool.request("GET", "/api/v1/nodes/n", headers={"Accept": "application/json"})
    second = pool.request("PUT", "/x", headers={}, body=b'{"k": 1}')
    assert (first.status, first.body) == (200, b'{"a": 1}')
    assert second.headers["x-two"] == "1, 2"
    assert server.connections == 1
    get, put = server.requests
    assert get.split(b"\r\n") == [
        b"GET /prefix/api/v1/nodes/n HTTP/1.1",
        f"Host: 127.0.0.1:{server.port}".encode(),
        b"Accept: application/json",
    ]
    assert b"Content-Length: 8" in put


def test_chunked_bodies_with_extensions_and_trailers_after_an_informational_answer(
    serve: Serve,
) -> None:
    body = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
        b'4;ext=1\r\n{"a"\r\n6\r\n: 1, "\r\n4\r\nb": \r\n1\r\n2\r\n1\r\n}\r\n'
        b"0\r\nX-Trailer: t\r\n\r\n"
    )
    server, pool = serve([raw(body), reply()])
    resp = pool.request("POST", "/x", headers={}, body=b"{}")
    assert (resp.status, resp.body) == (201, b'{"a": 1, "b": 2}')
    pool.request("GET", "/again", headers={})  # the trailer was consumed: still in step
    assert server.connections == 1


def test_a_closed_idle_connection_is_not_reused(serve: Serve) -> None:
    server, pool = serve([reply(extra="Connection: close\r\n"), reply(), reply()])
    pool.request("GET", "/1", headers={})
    pool.request("GET", "/2", headers={})
    assert server.connections == 2
    # The server closes after answering (no Connection header): the pooled socket
    # turns readable (EOF) and is dropped before reuse.
    server2, pool2 = serve([raw(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", keep=False),
                            reply()])  # fmt: skip
    pool2.request("GET", "/1", headers={})
    time.sleep(0.2)
    assert pool2.request("GET", "/2", headers={}).status == 200
    assert server2.connections == 2


def test_a_body_without_framing_is_read_to_the_close_and_its_connection_not_reused(
    serve: Serve,
) -> None:
    server, pool = serve([raw(b"HTTP/1.1 200 OK\r\n\r\n{\"to\": \"the end\"}", keep=False),
                          reply()])  # fmt: skip
    assert pool.request("GET", "/1", headers={}).body == b'{"to": "the end"}'
    assert pool._idle == []  # used up: never pooled (the idle check would hide it)
    assert pool.request("GET", "/2", headers={}).status == 200
    assert server.connections == 2


def test_a_reused_connection_that_dies_before_answering_is_retried_only_when_idempotent(
    serve: Serve,
) -> None:
    server, pool = serve([reply(), hang_up, reply()])
    pool.request("GET", "/1", headers={})
    assert pool.request("GET", "/2", headers={}).status == 200  # sent once more
    assert server.connections == 2 and len(server.requests) == 3

    server2, pool2 = serve([reply(), hang_up, reply()])
    pool2.request("GET", "/1", headers={})
    with pytest.raises(HttpError, match="POST /2: connection closed before the response"):
        pool2.request("POST", "/2", headers={}, body=b"{}")
    assert len(server2.requests) == 2


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (b"HTTX 200 OK\r\n\r\n", "malformed status line"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "malformed header line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", "after 5 of 10 body bytes"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "malformed chunk size"),
        (b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 201 + b"\r\n", "more than 200 response headers"),
    ],
)
def test_malformed_answers_are_transport_errors(serve: Serve, answer: bytes, error: str) -> None:
    _, pool = serve([raw(answer, keep=False)])
    with pytest.raises(HttpError, match=error):
        pool.request("GET", "/x", headers={})


def test_header_injection_and_bad_servers_are_refused(serve: Serve) -> None:
    server, pool = serve([reply()])
    with pytest.raises(ValueError, match="CR, LF or NUL"):
        pool.request("GET", "/x", headers={"Authorization": "Bearer t\r\nX-Evil: 1"})
    with pytest.raises(ValueError, match="CR, LF or NUL"):
        pool.request("GET", "/x HTTP/1.1\r\nHost: other", headers={})
    assert server.requests == []
    with pytest.raises(ValueError, match="want http"):
        HttpPool("ftp://host", ssl_context=None)
    with pytest.raises(ValueError, match="https needs a TLS context"):
        HttpPool("https://host", ssl_context=None)


def test_a_silent_server_times_out(serve: Serve) -> None:
    _, pool = serve([lambda conn, head: (time.sleep(2), True)[1]])
    started = time.monotonic()
    with pytest.raises(HttpError, match="timed out"):
        pool.request("GET", "/x", headers={}, timeout=0.3)
    assert time.monotonic() - started < 1.5


def test_a_refused_connection_is_a_transport_error() -> None:
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    with pytest.raises(HttpError, match=f"connect to 127.0.0.1:{port}"):
        HttpPool(f"http://127.0.0.1:{port}", ssl_context=None).request("GET", "/", headers={})


def test_a_stream_yields_chunks_as_they_come_and_closes_from_another_thread(serve: Serve) -> None:
    sent = threading.Event()

    def watch(conn: socket.socket, _head: bytes) -> bool:
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        conn.sendall(b'6\r\n{"a":1\r\n')
        conn.sendall(b"3\r\n}\n{\r\n")
        sent.set()
        time.sleep(3)  # then silence, as a watch without events
        return False

    _, pool = serve([watch])
    stream = pool.stream("/watch", headers={}, read_timeout=30)
    chunks = stream.chunks()
    assert stream.status == 200
    assert next(chunks) == b'{"a":1'
    assert next(chunks) == b"}\n{"
    threading.Timer(0.2, stream.close).start()
    started = time.monotonic()
    with pytest.raises((HttpError, StopIteration)):
        next(chunks)
    assert time.monotonic() - started < 2


def test_a_refused_stream_is_read_whole(serve: Serve) -> None:
    _, pool = serve([reply(b'{"reason": "Gone"}', status="410 Gone")])
    stream = pool.stream("/watch", headers={})
    assert (stream.status, stream.body()) == (410, b'{"reason": "Gone"}')


class Gated:
    """A threaded server: every connection served at once; a GET of ``/hold`` is
    answered only when the gate opens, ``/watch`` starts a stream that never ends, and
    anything else is answered at once."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.lock = threading.Lock()
        self.accepted = 0
        self.live = 0
        self.held = 0
        self.most_held = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.accepted += 1
                self.live += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            self._answer(conn)
        finally:
            with self.lock:
                self.live -= 1

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            buf = b""
            while got := read_head(conn, buf):
                head, buf = got
                if b" /watch " in head:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                    self.gate.wait(10)
                    return
                if b" /hold " in head:
                    with self.lock:
                        self.held += 1
                        self.most_held = max(self.most_held, self.held)
                    self.gate.wait(10)
                    with self.lock:
                        self.held -= 1
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")

    def until(self, check: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 5
        while not check():
            assert time.monotonic() < deadline, "server never got there"
            time.sleep(0.01)

    def close(self) -> None:
        self.gate.set()
        self.sock.close()


@pytest.fixture
def gated() -> Iterator[Gated]:
    server = Gated()
    yield server
    server.close()


def test_requests_beyond_the_connection_cap_wait_for_a_free_connection(gated: Gated) -> None:
    """A burst of claim GETs shares a few connections instead of opening one each (each
    connection is a TLS handshake and a socket on the API server)."""
    pool = HttpPool(
        f"http://127.0.0.1:{gated.port}", ssl_context=None, connections=2, overflow_after_s=30
    )
    results: list[int] = []
    threads = [
        threading.Thread(
            target=lambda: results.append(pool.request("GET", "/hold", headers={}).status)
        )
        for _ in range(6)
    ]
    for t in threads:
        t.start()
    gated.until(lambda: gated.held == 2)
    time.sleep(0.2)  # the other four must be waiting, not connecting
    assert (gated.accepted, gated.held) == (2, 2)
    gated.gate.set()
    for t in threads:
        t.join(5)
    assert results == [200] * 6
    assert (gated.accepted, gated.most_held) == (2, 2)
    pool.close()


def test_a_request_that_waited_its_overflow_time_goes_ahead_on_a_connection_of_its_own(
    gated: Gated,
) -> None:
    """A slow server must not turn its latency into a queue of timeouts: after waiting
    ``overflow_after_s`` a request opens one more connection, and the pool keeps no more
    than ``connections`` idle afterwards."""
    pool = HttpPool(
        f"http://127.0.0.1:{gated.port}", ssl_context=None, connections=1, overflow_after_s=0.3
    )
    held = threading.Thread(target=lambda: pool.request("GET", "/hold", headers={}))
    held.start()
    gated.until(lambda: gated.held == 1)
    started = time.monotonic()
    assert pool.request("GET", "/x", headers={}, timeout=5).status == 200
    assert 0.3 <= time.monotonic() - started < 3
    assert gated.accepted == 2
    gated.gate.set()
    held.join(5)
    gated.until(lambda: gated.live == 1)  # one of the two was closed, not kept idle
    assert pool.request("GET", "/x", headers={}).status == 200
    assert gated.accepted == 2
    pool.close()


def test_a_failed_request_gives_its_connection_slot_back(serve: Serve) -> None:
    server, _ = serve([hang_up, reply()])
    pool = HttpPool(
        f"http://127.0.0.1:{server.port}", ssl_context=None, connections=1, overflow_after_s=30
    )
    with pytest.raises(HttpError):
        pool.request("POST", "/x", headers={}, body=b"{}")
    started = time.monotonic()
    assert pool.request("GET", "/x", headers={}, timeout=1).status == 200
    assert time.monotonic() - started < 2  # not after waiting for a slot that leaked
    pool.close()


def test_an_open_stream_does_not_take_a_request_connection(gated: Gated) -> None:
    pool = HttpPool(
        f"http://127.0.0.1:{gated.port}", ssl_context=None, connections=1, overflow_after_s=30
    )
    stream = pool.stream("/watch", headers={})
    assert stream.status == 200
    started = time.monotonic()
    assert pool.request("GET", "/x", headers={}, timeout=1).status == 200
    assert time.monotonic() - started < 2
    stream.close()
    pool.close()


def test_a_pool_without_connections_is_refused() -> None:
    with pytest.raises(ValueError, match="connections: 0; want at least 1"):
        HttpPool("http://127.0.0.1:1", ssl_context=None, connections=0)
    with pytest.raises(ValueError, match="connections: 0; want at least 1"):  # not at first use
        KubeClient(KubeConfig(server="https://127.0.0.1:1", token="t"), connections=0)
