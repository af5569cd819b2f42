"""HTTP/2 to the API server (dra_driver.plugin.http2 and .hpack) against the ``h2`` and
``hpack`` packages, independent implementations of RFC 9113 and RFC 7541: header
blocks both ways, a burst of GETs multiplexed on one connection and demultiplexed
correctly, flow control of large answers, what the server may do to a stream or the
connection (refuse, reset, go away, drop, ping, limit streams) and what the pool then
does (send again, fall back to HTTP/1.1). The real API server: test_kubeclient_live."""

from __future__ import annotations

import json
import random
import string
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import hpack as reference_hpack
import pytest

from dra_driver.plugin import hpack, http2
from dra_driver.plugin.http2 import CANCEL
from dra_driver.plugin.httpconn import HttpError, HttpPool

from .h2server import H2Server

HEADERS = {"Accept": "application/json", "User-Agent": "test"}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[H2Server]:
    srv = H2Server(tmp_path / "certs")
    yield srv
    srv.close()


def pool_for(srv: H2Server, *, http2: bool = True, connections: int = 4) -> HttpPool:
    return HttpPool(
        srv.url,
        ssl_context=srv.client_context(http2=False),
        http2_ssl_context=srv.client_context(http2=True) if http2 else None,
        connections=connections,
    )


def get(pool: HttpPool, path: str, timeout: float = 5.0) -> str:
    resp = pool.request("GET", path, headers=HEADERS, timeout=timeout)
    assert resp.status == 200, resp
    return str(json.loads(resp.body)["path"])


def client_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if not t.name.startswith("h2server"))


# -- HPACK -----------------------------------------------------------------------------


def test_hpack_decodes_what_a_standard_encoder_writes() -> None:
    """Huffman and plain strings, the dynamic table across blocks (with eviction in a
    small table) and a table size update: every block decodes to what was encoded."""
    rnd = random.Random(7)
    for table_size, huffman in ((4096, True), (4096, False), (200, True)):
        encoder = reference_hpack.Encoder()
        decoder = hpack.Decoder()
        if table_size != 4096:
            encoder.header_table_size = table_size  # sends a size update in the next block
        for _ in range(200):
            headers = [
                (":status", rnd.choice(["200", "404", "201"])),
                ("content-type", "application/json"),
                ("audit-id", "".join(rnd.choices(string.hexdigits.lower(), k=36))),
                (f"x-{rnd.randint(0, 30)}",
                 "".join(rnd.choices(string.printable, k=rnd.randint(0, 60)))),
            ]  # fmt: skip
            assert decoder.decode(encoder.encode(headers, huffman=huffman)) == headers


def test_our_header_blocks_decode_with_a_standard_decoder() -> None:
    fields = [(":method", "GET"), (":path", "/api/v1/nodes/n?x=1"), (":authority", "h:6443"),
              ("authorization", "Bearer " + "t" * 300), ("x-unlisted", "v")]  # fmt: skip
    decoded = reference_hpack.Decoder().decode(hpack.encode(fields))
    assert [(str(k), str(v)) for k, v in decoded] == fields


@pytest.mark.parametrize(
    ("block", "message"),
    [
        (bytes([0x80 | 70]), "header index 70 is not in the table"),
        (bytes([0x7F]), "ends inside an integer"),
        (bytes([0x0F, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01]), r"integer longer than 2\^28"),
        (bytes([0x00, 0x05]) + b"ab", "runs past the header block"),
        (bytes([0x00, 0x01, 0x61, 0x81, 0x00]), "padded with other than 1 bits"),  # a 0 pad
        (bytes([0x00, 0x01, 0x61, 0x84, 0xFF, 0xFF, 0xFF, 0xFF]), "EOS symbol"),
        (bytes([0x3F, 0x80, 0x20]), "table size update to 4127 above our 4096"),
        (bytes([0x88, 0x20]), "size update after a header field"),
    ],
)
def test_hpack_refuses_malformed_blocks(block: bytes, message: str) -> None:
    with pytest.raises(hpack.HpackError, match=message):
        hpack.Decoder().decode(block)


# -- one connection, many streams --------------------------------------------------------


def test_a_burst_of_gets_shares_one_connection_and_each_gets_its_own_answer(
    server: H2Server,
) -> None:
    """The server holds 16 streams and answers them in reverse order: each thread must
    still get the answer to its own path. Writes (a body) stay on HTTP/1.1."""
    server.hold = 16
    pool = pool_for(server)
    paths = [f"/claims/c{i}" for i in range(16)]
    with ThreadPoolExecutor(16) as ex:
        assert list(ex.map(lambda p: get(pool, p), paths)) == paths
    assert (server.h2_connections, server.h1_connections) == (1, 0)
    server.hold = 0
    resp = pool.request("POST", "/write", headers=HEADERS, body=b"{}")
    assert (resp.status, server.h1_connections, server.h2_connections) == (200, 1, 1)
    pool.close()


def test_when_the_reading_thread_has_its_answer_another_reads_on(server: H2Server) -> None:
    """Answers come one by one, 50 ms apart, lowest stream first: the thread reading
    the socket (whichever it is) gets its answer while others still wait, and one of
    them must take over the reading, or they wait out their timeout."""
    server.hold, server.stagger_s = 8, 0.05
    pool = pool_for(server)
    paths = [f"/s{i}" for i in range(8)]
    start = time.monotonic()
    with ThreadPoolExecutor(8) as ex:
        assert list(ex.map(lambda p: get(pool, p, timeout=5), paths)) == paths
    assert time.monotonic() - start < 3
    assert server.h2_connections == 1
    pool.close()


def test_large_padded_answers_with_long_headers_are_flow_controlled(server: H2Server) -> None:
    """6 MiB answers, three at once: each more than our stream window (1 MiB), together
    more than the connection window (16 MiB), so they arrive only if we send both kinds
    of WINDOW_UPDATE; a 40 KB header arrives in CONTINUATION frames; padding is
    stripped."""
    big = random.Random(1).randbytes(6 << 20)
    long_value = "v" * 40_000

    def answer(path: str) -> tuple[int, list[tuple[str, str]], bytes]:
        return 200, [("x-long", long_value), ("x-path", path)], big

    server.answer = answer
    server.pad = 17
    pool = pool_for(server)
    with ThreadPoolExecutor(3) as ex:
        paths = ["/a", "/b", "/c"]
        resps = list(ex.map(lambda p: pool.request("GET", p, headers=HEADERS, timeout=30), paths))
    assert [r.body == big for r in resps] == [True, True, True]
    assert [r.headers["x-path"] for r in resps] == ["/a", "/b", "/c"]
    assert resps[0].headers["x-long"] == long_value
    assert server.h2_connections == 1
    pool.close()


# -- what the server may do ------------------------------------------------------------------


def test_a_refused_stream_goes_again(server: H2Server) -> None:
    """REFUSED_STREAM: the server did not process it; the pool sends it once more and
    the caller sees only the answer."""
    server.refuse_first = True
    pool = pool_for(server)
    assert get(pool, "/one") == "/one"
    assert server.paths == ["/one", "/one"]
    pool.close()


def test_streams_above_a_goaway_go_again_on_a_new_connection(server: H2Server) -> None:
    """Four GETs at once; the server answers the first and says GOAWAY with its id as the
    last: the other three were not processed and go again on a new connection."""
    server.goaway_after, server.hold = 4, 4
    pool = pool_for(server)
    paths = [f"/g{i}" for i in range(4)]
    barrier = threading.Barrier(4)

    def one(path: str) -> str:
        barrier.wait()
        return get(pool, path)

    with ThreadPoolExecutor(4) as ex:
        assert sorted(ex.map(one, paths)) == paths
    assert server.h2_connections == 2  # the second took the three sent again
    assert len(server.paths) == 7
    pool.close()


def test_a_reset_stream_fails_with_the_code_named(server: H2Server) -> None:
    server.reset_code = 2
    pool = pool_for(server)
    reset = r"^GET /x: the server reset the stream \(INTERNAL_ERROR\)$"
    with pytest.raises(HttpError, match=reset):
        get(pool, "/x")
    assert server.paths == ["/x"]  # not sent again: the server may have acted on it
    pool.close()


def test_a_silent_server_times_out_and_the_stream_is_cancelled(server: H2Server) -> None:
    server.silent = True
    pool = pool_for(server)
    start = time.monotonic()
    with pytest.raises(HttpError, match=r"^GET /slow: no answer within 0.5 s$"):
        get(pool, "/slow", timeout=0.5)
    assert 0.5 <= time.monotonic() - start < 2
    deadline = time.monotonic() + 5
    while not server.client_resets and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.client_resets == [(1, CANCEL)]
    server.silent = False
    assert get(pool, "/after") == "/after"  # the connection is still good
    assert server.h2_connections == 1
    pool.close()


def test_a_dropped_connection_sends_a_get_again_once(server: H2Server) -> None:
    server.close_after = 1
    pool = pool_for(server)
    assert get(pool, "/dropped") == "/dropped"
    assert server.paths == ["/dropped", "/dropped"]
    assert server.h2_connections == 2
    pool.close()


def test_a_connection_gone_silent_is_found_dead_and_replaced(
    server: H2Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A peer that vanished without a FIN: with a stream open and nothing heard, the
    reader PINGs; with no answer either, the connection fails and its GET goes again on
    a new one, within the GET's own timeout."""
    monkeypatch.setattr(http2, "HEALTH_CHECK_S", 0.3)
    server.freeze_after = 2
    pool = pool_for(server)
    assert get(pool, "/before") == "/before"
    start = time.monotonic()
    assert get(pool, "/frozen", timeout=5) == "/frozen"
    assert 0.6 <= time.monotonic() - start < 3
    assert server.h2_connections == 2
    assert server.paths == ["/before", "/frozen", "/frozen"]
    pool.close()


def test_the_servers_ping_is_answered(server: H2Server) -> None:
    server.ping = True
    pool = pool_for(server)
    assert get(pool, "/p") == "/p"
    deadline = time.monotonic() + 5
    while not server.ping_acks and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.ping_acks == 1
    pool.close()


def test_gets_beyond_the_servers_stream_limit_go_over_http1(server: H2Server) -> None:
    server.max_streams = 2
    pool = pool_for(server)
    assert get(pool, "/first") == "/first"  # the connection and the server's SETTINGS
    server.delay_s, server.hold = 0.5, 2
    paths = [f"/s{i}" for i in range(4)]
    with ThreadPoolExecutor(4) as ex:
        assert sorted(ex.map(get, [pool] * 4, paths)) == paths
    assert server.h2_connections == 1
    assert server.h1_connections >= 1
    pool.close()


def test_a_server_without_h2_gets_http1_on_the_connection_it_chose(tmp_path: Path) -> None:
    srv = H2Server(tmp_path / "certs", alpn=("http/1.1",))
    pool = pool_for(srv)
    assert [get(pool, f"/h1/{i}") for i in range(3)] == ["/h1/0", "/h1/1", "/h1/2"]
    assert (srv.h1_connections, srv.h2_connections) == (1, 0)  # one TLS handshake in all
    pool.close()
    srv.close()


def test_closing_the_pool_closes_the_connection_and_starts_no_thread(server: H2Server) -> None:
    """Waiting threads read the socket themselves: the connection adds no thread."""
    before = client_threads()
    pool = pool_for(server)
    assert get(pool, "/x") == "/x"
    assert client_threads() == before
    assert server.open_sockets == 1
    pool.close()
    deadline = time.monotonic() + 5
    while server.open_sockets and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.open_sockets == 0
