"""A TLS test server that speaks HTTP/2 through the ``h2`` package (an independent
implementation of RFC 9113, so our client is checked against someone else's reading of
it) and HTTP/1.1 to clients that do not choose ``h2`` by ALPN. Its misbehaviours are
switched on by attributes; what it saw is recorded for the assertions."""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

from dra_driver.devcluster.certs import generate_certs

from .fakes import read_head

Answer = tuple[int, list[tuple[str, str]], bytes]


def echo(path: str) -> Answer:
    return 200, [("content-type", "application/json")], json.dumps({"path": path}).encode()


class H2Server:
    def __init__(self, directory: Path, *, alpn: tuple[str, ...] = ("h2", "http/1.1")) -> None:
        certs = generate_certs(directory)
        self.ca_file = certs.ca_cert
        self.ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ctx.load_cert_chain(certs.serving_cert, certs.serving_key)
        self.ctx.set_alpn_protocols(list(alpn))
        # What to do (set before the first request):
        self.answer: Callable[[str], Answer] = echo
        self.hold = 0  # first connection: answer once this many streams wait, in reverse
        self.delay_s = 0.0
        self.stagger_s = 0.0  # held streams answered one by one, in id order, this apart
        self.silent = False
        self.reset_code: int | None = None
        self.refuse_first = False  # REFUSED_STREAM for the first stream of the run
        self.goaway_after: int | None = None  # on the first connection only
        self.close_after: int | None = None  # requests, then drop the first connection
        self.freeze_after: int | None = None  # requests, then the first connection goes
        # silent without a FIN (a peer gone), until close()
        self.max_streams: int | None = None
        self.ping = False
        self.pad: int | None = None
        # What it saw:
        self.h2_connections = 0
        self.h1_connections = 0
        self.paths: list[str] = []
        self.client_resets: list[tuple[int, int]] = []
        self.ping_acks = 0
        self.open_sockets = 0
        self._released = threading.Event()
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"https://127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, name="h2server-accept", daemon=True).start()

    def client_context(self, *, http2: bool) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        if http2:
            ctx.set_alpn_protocols(["h2", "http/1.1"])
        return ctx

    def close(self) -> None:
        self._released.set()
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                raw, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(
                target=self._serve, args=(raw,), name="h2server-conn", daemon=True
            ).start()

    def _serve(self, raw: socket.socket) -> None:
        with self._lock:
            self.open_sockets += 1
        try:
            with self.ctx.wrap_socket(raw, server_side=True) as sock:
                if sock.selected_alpn_protocol() == "h2":
                    with self._lock:
                        self.h2_connections += 1
                        first = self.h2_connections == 1
                    self._serve_h2(sock, first)
                else:
                    with self._lock:
                        self.h1_connections += 1
                    self._serve_h1(sock)
        except (OSError, ssl.SSLError, h2.exceptions.ProtocolError):
            pass
        finally:
            with self._lock:
                self.open_sockets -= 1

    def _serve_h1(self, sock: ssl.SSLSocket) -> None:
        buf = b""
        while got := read_head(sock, buf):
            head, buf = got
            lines = head.decode("latin-1").split("\r\n")
            length = next(
                (int(v) for k, _, v in (x.partition(":") for x in lines[1:])
                 if k.lower() == "content-length"), 0,
            )  # fmt: skip
            while len(buf) < length:
                buf += sock.recv(65536)
            buf = buf[length:]
            path = lines[0].split(" ")[1]
            with self._lock:
                self.paths.append(path)
            status, headers, body = self.answer(path)
            out = [f"HTTP/1.1 {status} X", f"Content-Length: {len(body)}"]
            out += [f"{k}: {v}" for k, v in headers]
            sock.sendall(("\r\n".join(out) + "\r\n\r\n").encode() + body)

    def _serve_h2(self, sock: ssl.SSLSocket, first: bool) -> None:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        conn.initiate_connection()
        if self.max_streams is not None:
            limit = h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS
            conn.update_settings({limit: self.max_streams})
        if self.ping:
            conn.ping(b"12345678")
        sock.sendall(conn.data_to_send())
        waiting: list[tuple[int, str]] = []
        sending: dict[int, bytes] = {}  # stream -> body not yet sent
        seen = 0
        while True:
            data = sock.recv(65536)
            if not data:
                return
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.RequestReceived):
                    headers = {
                        (k.decode() if isinstance(k, bytes) else k): (
                            v.decode() if isinstance(v, bytes) else v
                        )
                        for k, v in event.headers
                    }
                    path = headers[":path"]
                    with self._lock:
                        self.paths.append(path)
                        refuse = self.refuse_first and len(self.paths) == 1
                    seen += 1
                    assert event.stream_id is not None
                    if refuse:
                        conn.reset_stream(event.stream_id, 7)
                    elif self.reset_code is not None:
                        conn.reset_stream(event.stream_id, self.reset_code)
                    elif not self.silent:
                        waiting.append((event.stream_id, path))
                    if first and self.close_after is not None and seen >= self.close_after:
                        return  # drop the connection without a word
                    if first and self.freeze_after is not None and seen >= self.freeze_after:
                        self._released.wait(60)
                        return
                    if first and self.goaway_after is not None and seen >= self.goaway_after:
                        keep = waiting[0][0]
                        self._start(conn, waiting[:1], sending)
                        conn.close_connection(0, last_stream_id=keep)
                        waiting = []
                elif isinstance(event, h2.events.StreamReset):
                    with self._lock:
                        code = int(event.error_code or 0)
                        self.client_resets.append((event.stream_id or 0, code))
                elif isinstance(event, h2.events.PingAckReceived):
                    with self._lock:
                        self.ping_acks += 1
                elif isinstance(event, h2.events.DataReceived):
                    conn.acknowledge_received_data(
                        event.flow_controlled_length, event.stream_id or 0
                    )
            hold = self.hold if first else 0
            if len(waiting) >= max(hold, 1):
                if self.delay_s:
                    time.sleep(self.delay_s)
                if self.stagger_s:
                    for one in waiting[:-1]:
                        self._start(conn, [one], sending)
                        sock.sendall(conn.data_to_send())
                        time.sleep(self.stagger_s)
                    waiting = waiting[-1:]
                self._start(conn, waiting[::-1] if hold else waiting, sending)
                waiting = []
            self._pump(conn, sending)
            sock.sendall(conn.data_to_send())

    def _start(
        self, conn: h2.connection.H2Connection, streams: list[tuple[int, str]],
        sending: dict[int, bytes],
    ) -> None:  # fmt: skip
        for sid, path in streams:
            status, headers, body = self.answer(path)
            conn.send_headers(sid, [(":status", str(status)), *headers])
            sending[sid] = body
        self._pump(conn, sending)

    def _pump(self, conn: h2.connection.H2Connection, sending: dict[int, bytes]) -> None:
        """Send what flow control allows now (the rest after WINDOW_UPDATEs)."""
        overhead = self.pad + 1 if self.pad else 0  # padding counts against the window
        for sid in list(sending):
            body = sending.pop(sid)
            while True:
                room = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size)
                room = max(room - overhead, 0)
                if body and not room:
                    sending[sid] = body
                    break
                chunk, body = body[:room], body[room:]
                conn.send_data(sid, chunk, end_stream=not body, pad_length=self.pad)
                if not body:
                    break
