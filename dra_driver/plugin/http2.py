"""HTTP/2 (RFC 9113) to the API server for whole-answer requests without a body.

Why: a burst of prepares GETs 16 claims at once. The API server and etcd spent 1.2 ms
of CPU per GET on our HTTP/1.1 connections and 0.65 ms on client-go's single HTTP/2
connection; with this module a burst costs the control plane what the Go reference
plugin's does (README "Benchmarks"), and a node holds one socket on the API server for
its GETs instead of up to four. The ``h2`` package keeps 1.75 MB resident, more than
the daemon's idle-memory margin; what a GET needs is small: one HEADERS frame out,
HEADERS and DATA frames back, flow control on what we receive, SETTINGS, PING and
GOAWAY. Requests with a body and watches stay on HTTP/1.1 (:mod:`.httpconn`), so we
never send DATA and need no send-side flow control.

Every TLS operation (the reader's non-blocking reads and the
writers' frames) runs under one lock: OpenSSL does not allow one ``SSL`` object to be
used from two threads at once. Frames are queued in the order their stream ids were
taken, because a server treats a lower id sent after a higher one as a protocol error.
"""

from __future__ import annotations

import select
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from dra_driver.plugin import hpack
from dra_driver.plugin.httptypes import HttpError, Response

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY = range(8)
WINDOW_UPDATE, CONTINUATION = 8, 9
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
SETTINGS_ENABLE_PUSH, SETTINGS_MAX_CONCURRENT_STREAMS, SETTINGS_INITIAL_WINDOW_SIZE = 2, 3, 4
NO_ERROR, PROTOCOL_ERROR, REFUSED_STREAM, CANCEL = 0, 1, 7, 8
ERROR_NAMES = {
    0: "NO_ERROR", 1: "PROTOCOL_ERROR", 2: "INTERNAL_ERROR", 3: "FLOW_CONTROL_ERROR",
    4: "SETTINGS_TIMEOUT", 5: "STREAM_CLOSED", 6: "FRAME_SIZE_ERROR", 7: "REFUSED_STREAM",
    8: "CANCEL", 9: "COMPRESSION_ERROR", 10: "CONNECT_ERROR", 11: "ENHANCE_YOUR_CALM",
    12: "INADEQUATE_SECURITY", 13: "HTTP_1_1_REQUIRED",
}  # fmt: skip
MAX_FRAME = 16384
"""SETTINGS_MAX_FRAME_SIZE: we keep the default, so no frame may be larger."""
STREAM_WINDOW = 1 << 20
"""Our SETTINGS_INITIAL_WINDOW_SIZE: one answer may be in flight up to this."""
CONNECTION_WINDOW = 1 << 24
LAST_STREAM_ID = (1 << 31) - 1
FIRST_STREAMS = 100
"""Streams at once until the server's SETTINGS say how many (RFC: unlimited)."""
CONTROL_SEND_TIMEOUT_S = 10.0
HEALTH_CHECK_S = 3.0
"""Waiting for an answer with nothing heard for this long, PING; with no answer for as
long again the connection is dead (a peer gone without a FIN): its streams fail (a GET
with no answer yet goes again on a new connection) and no new stream is sent into it."""


class Unsent(HttpError):
    """The server did not process the request (GOAWAY above its stream, REFUSED_STREAM,
    or the connection ended before any answer to a GET): safe to send again."""


class Busy(HttpError):
    """The connection is at the server's limit of concurrent streams."""


def frame(ftype: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return (
        len(payload).to_bytes(3, "big")
        + bytes((ftype, flags))
        + stream_id.to_bytes(4, "big")
        + payload
    )


def _unpad(payload: bytes, flags: int) -> bytes:
    if not flags & PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise HttpError("HTTP/2 frame padding longer than the frame")
    return payload[1 : len(payload) - payload[0]]


@dataclass
class _Stream:
    done: threading.Event = field(default_factory=threading.Event)
    wake: threading.Event = field(default_factory=threading.Event)
    """Set when done, or when this stream's thread is to take over reading."""
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytearray = field(default_factory=bytearray)
    unacked: int = 0
    error: HttpError | None = None


class H2Connection:
    """One HTTP/2 connection over a TLS socket that negotiated ``h2``; thread-safe.

    No reader thread: a thread waiting for its answer reads the socket itself when no
    other does (the leader), and hands every other stream its frames; when its own
    answer is complete it wakes a waiting thread to read on. A lone GET thus wakes only
    its own thread, as on HTTP/1.1 (a reader thread cost 0.08 ms more CPU per GET
    here). Frames that arrive while no request waits (PING, GOAWAY) are read with the
    next request."""

    def __init__(self, sock: ssl.SSLSocket, authority: str, *, timeout: float) -> None:
        self._sock = sock
        sock.settimeout(0)  # for good: see _sendall
        self._authority = authority
        self._io = threading.Lock()  # every use of the TLS socket
        self._lock = threading.Lock()  # the fields below
        self._streams: dict[int, _Stream] = {}
        self._next_id = 1
        self._max_streams = FIRST_STREAMS
        self._accepting = True
        self._closed = False
        self._reading = False  # a thread holds the reader's role
        self._outbox: list[bytes] = []  # frames not yet sent, in order
        self._blocks: dict[tuple[str, tuple[tuple[str, str], ...]], bytes] = {}
        # The reader's own (only the thread holding the role touches them):
        self._buf = bytearray()
        self._decoder = hpack.Decoder()
        self._unacked = 0
        self._continuation: tuple[int, int, bytearray] | None = None
        self._heard_at = time.monotonic()
        self._ping_sent_at: float | None = None  # a health-check PING awaits its answer
        settings = b"".join(
            k.to_bytes(2, "big") + v.to_bytes(4, "big")
            for k, v in ((SETTINGS_ENABLE_PUSH, 0), (SETTINGS_INITIAL_WINDOW_SIZE, STREAM_WINDOW))
        )
        grow = (CONNECTION_WINDOW - 65535).to_bytes(4, "big")
        self._send(PREFACE + frame(SETTINGS, 0, 0, settings) + frame(WINDOW_UPDATE, 0, 0, grow),
                   timeout)  # fmt: skip

    # -- state -----------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def accepting(self) -> bool:
        """New streams may start here (not closing, not told to go away, ids left)."""
        return self._accepting and not self._closed

    def retire(self) -> None:
        """No new streams; close once the open ones have their answers."""
        with self._lock:
            self._accepting = False
            idle = not self._streams
        if idle:
            self.close()

    def close(self) -> None:
        """Fail what is open and close the socket."""
        self._fail_all(HttpError("connection closed"))

    def _fail_all(self, exc: HttpError) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._accepting = False
            streams, self._streams = self._streams, {}
        for stream in streams.values():
            # No answer yet to a GET: it may go again elsewhere.
            stream.error = exc if stream.status else Unsent(str(exc))
            stream.done.set()
            stream.wake.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # a leader in select() wakes up
        except OSError:
            pass
        with self._io:  # never under a thread inside an SSL call
            self._sock.close()

    # -- requests --------------------------------------------------------------

    def request(
        self, method: str, target: str, headers: Mapping[str, str], timeout: float
    ) -> Response:
        block = self._header_block(method, target, headers)
        if len(block) > MAX_FRAME:
            raise HttpError(f"request headers over {MAX_FRAME} bytes")
        stream = _Stream()
        with self._lock:
            if not self.accepting:
                raise Unsent("connection no longer takes requests")
            if len(self._streams) >= self._max_streams:
                raise Busy(f"{self._max_streams} streams open")
            sid = self._next_id
            self._next_id += 2
            if self._next_id > LAST_STREAM_ID:
                self._accepting = False
            self._streams[sid] = stream
            self._outbox.append(frame(HEADERS, END_STREAM | END_HEADERS, sid, block))
        sent_at = time.monotonic()
        try:
            self._flush(timeout)
        except (OSError, ssl.SSLError, ValueError) as exc:
            self._fail_all(HttpError(f"send: {exc}"))  # the stream fails as Unsent
        deadline = sent_at + timeout
        while not stream.done.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._cancel(sid)
                raise HttpError(f"no answer within {timeout:g} s")
            if self._lead():
                try:
                    self._read_until(stream, deadline, sent_at)
                finally:
                    self._hand_over(stream)
            else:
                stream.wake.wait(remaining)
                stream.wake.clear()
        if stream.error is not None:
            raise stream.error
        return Response(stream.status, stream.headers, bytes(stream.body))

    def _header_block(self, method: str, target: str, headers: Mapping[str, str]) -> bytes:
        """The request's HPACK block: the part after ``:path`` (the same for every GET
        of a client but after a token rotation) is encoded once."""
        if any(c in target or c in method for c in "\r\n\0"):
            raise ValueError("CR, LF or NUL in the request line")
        key = (method, tuple(headers.items()))
        rest = self._blocks.get(key)
        if rest is None:
            fields = [(":method", method), (":scheme", "https"), (":authority", self._authority)]
            fields += [(k.lower(), v) for k, v in headers.items() if k.lower() != "host"]
            if any(c in part for pair in fields for part in pair for c in "\r\n\0"):
                raise ValueError("CR, LF or NUL in a header")
            rest = hpack.encode(fields)
            if len(self._blocks) >= 8:
                self._blocks.clear()
            self._blocks[key] = rest
        return hpack.encode([(":path", target)]) + rest

    def _lead(self) -> bool:
        with self._lock:
            if self._reading or self._closed:
                return False
            self._reading = True
            return True

    def _hand_over(self, own: _Stream) -> None:
        """Give up the reader's role; wake a thread still waiting, to take it."""
        with self._lock:
            self._reading = False
            heir = next((s for s in self._streams.values() if s is not own), None)
        if heir is not None:
            heir.wake.set()

    def _cancel(self, sid: int) -> None:
        with self._lock:
            if self._streams.pop(sid, None) is None or self._closed:
                return
        try:
            self._send(frame(RST_STREAM, 0, sid, CANCEL.to_bytes(4, "big")),
                       CONTROL_SEND_TIMEOUT_S)  # fmt: skip
        except (OSError, ssl.SSLError, ValueError) as exc:
            self._fail_all(HttpError(f"send: {exc}"))
        self._maybe_close()

    def _finish(self, sid: int, error: HttpError | None = None) -> None:
        with self._lock:
            stream = self._streams.pop(sid, None)
        if stream is not None:
            stream.error = error
            stream.done.set()
            stream.wake.set()
        self._maybe_close()

    def _maybe_close(self) -> None:
        with self._lock:
            idle = not self._accepting and not self._streams and not self._closed
        if idle:
            self.close()

    # -- the socket --------------------------------------------------------------

    def _send(self, data: bytes, timeout: float) -> None:
        with self._lock:
            self._outbox.append(data)
        self._flush(timeout)

    def _flush(self, timeout: float) -> None:
        """Send what is queued. Frames queue in stream-id order (ids are taken under the
        same lock); a thread that waited for the socket often finds its frame already
        sent by the one before, in one TLS record with others: a burst of GETs reaches
        the server together, as a multi-core client's would."""
        with self._io:
            with self._lock:
                data = b"".join(self._outbox)
                self._outbox.clear()
            if data:
                self._sendall(data, timeout)

    def _sendall(self, data: bytes, timeout: float) -> None:
        """The socket stays non-blocking (switching modes costs two fcntl calls a time):
        a full send buffer is waited out here, under the socket lock."""
        view = memoryview(data)
        wanted: tuple[list[ssl.SSLSocket], list[ssl.SSLSocket]]
        deadline = time.monotonic() + timeout
        while view:
            try:
                view = view[self._sock.send(view) :]
                continue
            except (ssl.SSLWantWriteError, BlockingIOError):
                wanted = ([], [self._sock])
            except ssl.SSLWantReadError:
                wanted = ([self._sock], [])
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not any(select.select(*wanted, [], remaining)):
                raise TimeoutError(f"send blocked for {timeout:g} s")

    def _read_until(self, stream: _Stream, deadline: float, sent_at: float) -> None:
        """As the reader: read and dispatch frames until ``stream`` is done or the
        deadline passes. A connection that fails fails every stream on it."""
        try:
            while not stream.done.is_set():
                now = time.monotonic()
                if now >= deadline:
                    return
                quiet_since = max(self._heard_at, sent_at)
                if self._ping_sent_at is not None:
                    check_at = self._ping_sent_at + HEALTH_CHECK_S
                else:
                    check_at = quiet_since + HEALTH_CHECK_S
                if now >= check_at:
                    if self._ping_sent_at is not None:
                        raise HttpError(f"no answer to a PING within {HEALTH_CHECK_S:g} s")
                    self._ping_sent_at = now
                    self._send(frame(PING, 0, 0, b"dra-ping"), CONTROL_SEND_TIMEOUT_S)
                    continue
                data = self._recv(min(deadline, check_at) - now)
                if data is None:
                    continue
                if not data:
                    raise HttpError("the server closed the connection")
                self._heard_at = time.monotonic()
                self._ping_sent_at = None
                self._ingest(data)
        except hpack.HpackError as exc:
            self._fail_all(HttpError(f"HTTP/2 header block: {exc}"))
        except HttpError as exc:
            self._fail_all(exc)
        except (OSError, ssl.SSLError, ValueError) as exc:
            self._fail_all(HttpError(f"HTTP/2 connection: {exc}"))

    def _recv(self, wait: float) -> bytes | None:
        """Bytes from the server (b"" at its end or our close), None if none came."""
        if not self._sock.pending() and not select.select([self._sock], [], [], wait)[0]:
            return None
        with self._io:
            if self._closed:
                return b""
            try:
                return self._sock.recv(16384)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
                return None  # part of a TLS record

    def _ingest(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        while len(buf) >= 9:
            length = int.from_bytes(buf[:3], "big")
            if length > MAX_FRAME:
                raise HttpError(f"HTTP/2 frame of {length} bytes (FRAME_SIZE_ERROR)")
            if len(buf) < 9 + length:
                break
            ftype, flags = buf[3], buf[4]
            sid = int.from_bytes(buf[5:9], "big") & LAST_STREAM_ID
            payload = bytes(buf[9 : 9 + length])
            del buf[: 9 + length]
            self._on_frame(ftype, flags, sid, payload)

    # -- frames ----------------------------------------------------------------

    def _on_frame(self, ftype: int, flags: int, sid: int, payload: bytes) -> None:
        if self._continuation is not None:
            csid, cflags, block = self._continuation
            if ftype != CONTINUATION or sid != csid:
                raise HttpError("HTTP/2 header block interrupted (PROTOCOL_ERROR)")
            block += payload
            if flags & END_HEADERS:
                self._continuation = None
                self._on_headers(csid, bytes(block), cflags & END_STREAM)
            return
        if ftype == DATA:
            self._on_data(sid, flags, payload)
        elif ftype == HEADERS:
            fragment = _unpad(payload, flags)
            if flags & PRIORITY_FLAG:
                fragment = fragment[5:]
            if flags & END_HEADERS:
                self._on_headers(sid, fragment, flags & END_STREAM)
            else:
                self._continuation = (sid, flags, bytearray(fragment))
        elif ftype == RST_STREAM:
            code = int.from_bytes(payload[:4], "big")
            name = ERROR_NAMES.get(code, str(code))
            cls = Unsent if code == REFUSED_STREAM else HttpError
            self._finish(sid, cls(f"the server reset the stream ({name})"))
        elif ftype == SETTINGS:
            if not flags & ACK:
                self._on_settings(payload)
        elif ftype == PING:
            if not flags & ACK:
                self._send(frame(PING, ACK, 0, payload), CONTROL_SEND_TIMEOUT_S)
        elif ftype == GOAWAY:
            self._on_goaway(payload)
        elif ftype in (CONTINUATION, PUSH_PROMISE):
            raise HttpError(f"unexpected HTTP/2 frame type {ftype} (PROTOCOL_ERROR)")
        # WINDOW_UPDATE and PRIORITY only matter to a sender of DATA; unknown types
        # are ignored, as RFC 9113 requires.

    def _on_headers(self, sid: int, block: bytes, end_stream: int) -> None:
        fields = self._decoder.decode(block)  # always: the table must stay in step
        with self._lock:
            stream = self._streams.get(sid)
        if stream is None:
            return  # cancelled
        if not stream.status:
            status = next((v for k, v in fields if k == ":status"), "")
            if not status.isdigit():
                self._finish(sid, HttpError(f"HTTP/2 answer without a valid :status {status!r}"))
                return
            if 100 <= int(status) < 200:
                return  # informational: the real answer follows
            for name, value in fields:
                if not name.startswith(":"):
                    old = stream.headers.get(name)
                    stream.headers[name] = value if old is None else f"{old}, {value}"
            stream.status = int(status)
        if end_stream:
            self._finish(sid)

    def _on_data(self, sid: int, flags: int, payload: bytes) -> None:
        with self._lock:
            stream = self._streams.get(sid)
        updates = b""
        self._unacked += len(payload)
        if self._unacked >= CONNECTION_WINDOW // 2:
            updates += frame(WINDOW_UPDATE, 0, 0, self._unacked.to_bytes(4, "big"))
            self._unacked = 0
        if stream is not None:
            stream.body += _unpad(payload, flags)
            stream.unacked += len(payload)
            if not flags & END_STREAM and stream.unacked >= STREAM_WINDOW // 2:
                updates += frame(WINDOW_UPDATE, 0, sid, stream.unacked.to_bytes(4, "big"))
                stream.unacked = 0
        if updates:
            self._send(updates, CONTROL_SEND_TIMEOUT_S)
        if stream is not None and flags & END_STREAM:
            self._finish(sid)

    def _on_settings(self, payload: bytes) -> None:
        if len(payload) % 6:
            raise HttpError("HTTP/2 SETTINGS frame of a length not a multiple of 6")
        for off in range(0, len(payload), 6):
            key = int.from_bytes(payload[off : off + 2], "big")
            value = int.from_bytes(payload[off + 2 : off + 6], "big")
            if key == SETTINGS_MAX_CONCURRENT_STREAMS:
                with self._lock:
                    self._max_streams = value
        self._send(frame(SETTINGS, ACK, 0), CONTROL_SEND_TIMEOUT_S)

    def _on_goaway(self, payload: bytes) -> None:
        last = int.from_bytes(payload[:4], "big") & LAST_STREAM_ID
        code = int.from_bytes(payload[4:8], "big")
        name = ERROR_NAMES.get(code, str(code))
        with self._lock:
            self._accepting = False
            unsent = [sid for sid in self._streams if sid > last]
        for sid in unsent:
            self._finish(sid, Unsent(f"the server is going away ({name})"))
        self._maybe_close()
