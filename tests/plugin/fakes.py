"""Test doubles for the plugin-layer unit tier.

- :class:`FakeBackend`: the *driver* side (allowed to be fake: the layer under
  test is the plugin plumbing). Records calls and concurrency.
- :class:`FakeApiServer`: a tiny HTTP server speaking the few API paths the
  plugin uses (claims, nodes, resourceslices), so the real
  :class:`~dra_driver.plugin.kubeclient.KubeClient` is exercised at the wire.
  Tier-2 tests use the real kube-apiserver instead.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import yaml

from dra_driver.plugin.backend import DeviceHealth
from dra_driver.plugin.claims import Claim, ClaimRef, PreparedDevice, PrepareError
from dra_driver.plugin.kubeclient import KubeClient
from dra_driver.plugin.resources import CounterSet, Device, Pool

DRIVER = "gpu.test.example.com"


def read_head(conn: socket.socket, buf: bytes) -> tuple[bytes, bytes] | None:
    """The next request head on a kept-alive connection (``buf``: bytes already read),
    and what followed it; None when the client closed first."""
    while b"\r\n\r\n" not in buf:
        data = conn.recv(65536)
        if not data:
            return None
        buf += data
    head, rest = buf.split(b"\r\n\r\n", 1)
    return head, rest


@dataclass
class FakeBackend:
    devices: tuple[Device, ...] = (Device("gpu-0"), Device("gpu-1"))
    counter_sets: tuple[CounterSet, ...] = ()
    fail: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    supports_parallel_claims: bool = False
    prepared: dict[str, ClaimRef] = field(default_factory=dict)
    seen_claims: list[Claim] = field(default_factory=list)
    unprepared: list[ClaimRef] = field(default_factory=list)
    active: dict[str, int] = field(default_factory=dict)
    max_active_per_claim: int = 0
    max_active_total: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _enter(self, uid: str) -> None:
        with self._lock:
            self.active[uid] = self.active.get(uid, 0) + 1
            self.max_active_per_claim = max(self.max_active_per_claim, self.active[uid])
            self.max_active_total = max(self.max_active_total, sum(self.active.values()))

    def _leave(self, uid: str) -> None:
        with self._lock:
            self.active[uid] -= 1

    def prepare(self, claim: Claim) -> list[PreparedDevice]:
        self._enter(claim.uid)
        try:
            time.sleep(self.delay_s)
            with self._lock:
                self.seen_claims.append(claim)
            if claim.uid in self.fail:
                raise PrepareError(self.fail[claim.uid])
            self.prepared[claim.uid] = claim.ref
            return [
                PreparedDevice(
                    request_names=(d.request,),
                    pool_name=d.pool,
                    device_name=d.device,
                    cdi_device_ids=(f"{DRIVER}/gpu={claim.uid}-{d.device}",),
                    share_id=d.share_id,
                )
                for d in claim.devices
            ]
        finally:
            self._leave(claim.uid)

    def unprepare(self, claim: ClaimRef) -> None:
        self._enter(claim.uid)
        try:
            time.sleep(self.delay_s)
            with self._lock:
                self.unprepared.append(claim)
                self.prepared.pop(claim.uid, None)
        finally:
            self._leave(claim.uid)

    def prepared_claims(self) -> list[ClaimRef]:
        return list(self.prepared.values())

    def pool(self) -> Pool:
        return Pool(devices=self.devices, counter_sets=self.counter_sets)


@dataclass
class HealthyBackend(FakeBackend):
    """Adds the optional HealthReporter ability."""

    health: list[DeviceHealth] = field(default_factory=list)

    def device_health(self) -> list[DeviceHealth]:
        return list(self.health)


def claim_object(
    name: str,
    uid: str,
    *,
    namespace: str = "default",
    node: str = "node-a",
    results: list[dict[str, Any]] | None = None,
    config: list[dict[str, Any]] | None = None,
    allocated: bool = True,
) -> dict[str, Any]:
    """A ResourceClaim as the API returns it after the scheduler allocated it."""
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {"devices": {"requests": []}},
        "status": {},
    }
    if allocated:
        obj["status"]["allocation"] = {
            "devices": {
                "results": results
                if results is not None
                else [{"request": "gpu", "driver": DRIVER, "pool": node, "device": "gpu-0"}],
                "config": config or [],
            }
        }
    return obj


class _Listener(ThreadingHTTPServer):
    # socketserver listens with a backlog of 5: a burst of new connections beyond it
    # lost SYNs to a 1 s retransmit, which no real API server's backlog does.
    request_queue_size = 128


class JsonHandler(BaseHTTPRequestHandler):
    """A quiet HTTP/1.1 handler of JSON requests and answers, for the fake API servers."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict[str, Any]:
        n = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(n)) if n else {}


class FakeApiServer:
    """Claims, nodes and a naive slice store over plain HTTP on 127.0.0.1."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.slices: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self.fail_slice_requests = 0
        """Answer this many resourceslice requests with 500 first (API outage)."""
        self.slice_outage_until = 0.0
        """Answer every resourceslice request with 500 until this ``time.monotonic()``."""
        self.claim_get_delay_s = 0.0
        """Hold every claim GET this long (a slow API server)."""
        self.claim_get_peers: set[tuple[str, int]] = set()
        """Client addresses, one per connection, that carried a claim GET."""
        self.authorizations: list[str] = []
        """The Authorization header of every GET, in order."""
        self.accepted_authorizations: set[str] | None = None
        """When set, a GET with another Authorization header is answered 401."""
        self._rv = 1
        self._lock = threading.Lock()
        server = self

        class Handler(JsonHandler):
            # Headers and body go out as two writes: with Nagle on, the body waits for
            # the client's delayed ACK (40 ms), which no real API server adds.
            disable_nagle_algorithm = True

            def do_GET(self) -> None:
                url = urlparse(self.path)
                server.requests.append(("GET", url.path))
                server.authorizations.append(self.headers.get("Authorization", ""))
                accepted = server.accepted_authorizations
                if accepted is not None and self.headers.get("Authorization", "") not in accepted:
                    self._send(401, {"kind": "Status", "reason": "Unauthorized", "message": "u"})
                    return
                if m := re.fullmatch(
                    r"/apis/resource.k8s.io/v1/namespaces/([^/]+)/resourceclaims/([^/]+)", url.path
                ):
                    server.claim_get_peers.add(self.client_address)
                    time.sleep(server.claim_get_delay_s)
                    obj = server.claims.get((m[1], m[2]))
                    if obj is None:
                        self._send(404, {"kind": "Status", "reason": "NotFound", "message": "nf"})
                    else:
                        self._send(200, obj)
                elif m := re.fullmatch(r"/api/v1/nodes/([^/]+)", url.path):
                    node = server.nodes.get(m[1])
                    self._send(200, node) if node else self._send(404, {"reason": "NotFound"})
                elif url.path == "/apis/resource.k8s.io/v1/resourceslices":
                    if server._outage():
                        self._send(500, {"reason": "InternalError", "message": "etcd down"})
                        return
                    if "watch" in parse_qs(url.query):
                        # An idle watch that the server ends without an event: whatever
                        # changed meanwhile is only seen by the watcher's next list.
                        time.sleep(0.5)
                        self.send_response(200)
                        self.send_header("Content-Type", "application/json")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    with server._lock:
                        items = list(server.slices.values())
                    self._send(200, {"items": items, "metadata": {"resourceVersion": "1"}})
                else:
                    self._send(404, {"reason": "NotFound", "message": url.path})

            def do_POST(self) -> None:
                obj = self._body()
                with server._lock:
                    server._rv += 1
                    obj["metadata"].update(uid=str(uuid.uuid4()), resourceVersion=str(server._rv))
                    server.slices[obj["metadata"]["name"]] = obj
                self._send(201, obj)

            def do_PUT(self) -> None:
                obj = self._body()
                with server._lock:
                    server._rv += 1
                    obj["metadata"]["resourceVersion"] = str(server._rv)
                    server.slices[obj["metadata"]["name"]] = obj
                self._send(200, obj)

            def do_DELETE(self) -> None:
                self._body()
                name = urlparse(self.path).path.rsplit("/", 1)[-1]
                with server._lock:
                    server.slices.pop(name, None)
                self._send(200, {"kind": "Status", "status": "Success"})

        self._httpd = _Listener(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def write_kubeconfig(self, path: Path) -> Path:
        """A kubeconfig for this server with a bearer token (the fake checks none)."""
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": {"server": self.server}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
        }))  # fmt: skip
        return path

    def __enter__(self) -> FakeApiServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    @property
    def server(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def client(self, **kw: Any) -> KubeClient:
        """The plugin's real API client (the ``kubernetes`` library below it), aimed here."""
        return KubeClient.for_server(self.server, token="test-token", **kw)

    def _outage(self) -> bool:
        if time.monotonic() < self.slice_outage_until:
            return True
        with self._lock:
            if self.fail_slice_requests > 0:
                self.fail_slice_requests -= 1
                return True
            return False

    def add_claim(self, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        self.claims[(meta["namespace"], meta["name"])] = obj

    def add_node(self, name: str) -> None:
        self.nodes[name] = {"metadata": {"name": name, "uid": str(uuid.uuid4())}}
