"""The real node's own network namespace, and the only ways in and out of it.

containerd, the kubelet, the CNI bridge and every pod live in one network
namespace per run, never in the machine's: the bridge, veths, routes, iptables
canaries and the kubelet's ports (10250, 10248) stay private to the run, so two
runs on one machine cannot collide and the host's network is never changed.
The namespace is anonymous (``unshare --net`` on a holder process, entered by
``/proc/<pid>/ns/net``), so nothing appears under ``/run/netns``; it vanishes
when the holder and everything started in it have exited.

The control plane stays on the host's loopback. :class:`Forwarder` carries TCP
from listeners *inside* the namespace to addresses on the host: the kubelet
reaches the apiserver at the same ``127.0.0.1:<port>`` it was told, and pods
reach it at the ``kubernetes`` Service address (10.0.0.1:443), as in-cluster
clients do, although no kube-proxy runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import logging
import os
import selectors
import socket
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dra_driver.devcluster.processes import Component

logger = logging.getLogger(__name__)

CLONE_NEWNET = 0x40000000
BRIDGE = "cni0"
POD_SUBNET = "10.88.0.0/24"
"""Every node's pod range unless told otherwise: nodes live in separate namespaces, so
equal ranges never collide on the wire, but pods of two nodes then share IPs, which a
test of anything that lists peers by IP (ComputeDomain cliques) cannot tell apart."""
SERVICE_IP = "10.0.0.1"
"""The ``kubernetes`` Service's ClusterIP (first address of the control plane's range)."""


class NodeNetworkError(RuntimeError):
    """The namespace or a forwarder could not be set up; the message says which step."""


def pod_subnet(cidr: str) -> ipaddress.IPv4Network:
    """``cidr`` checked as a node's pod range: IPv4, /8 to /29, clear of the Service IP
    (the node's loopback holds it)."""
    try:
        net = ipaddress.IPv4Network(cidr)
    except ValueError as err:
        raise NodeNetworkError(f"pod_subnet: {cidr!r} is not an IPv4 network: {err}") from None
    if not 8 <= net.prefixlen <= 29:
        raise NodeNetworkError(f"pod_subnet: {cidr} must be /8 to /29 (gateway plus pods)")
    if ipaddress.IPv4Address(SERVICE_IP) in net:
        raise NodeNetworkError(f"pod_subnet: {cidr} holds the Service IP {SERVICE_IP}")
    return net


def gateway(cidr: str) -> str:
    """The range's first address: the bridge's, the pods' gateway, and the node IP the
    kubelet reports."""
    return str(next(pod_subnet(cidr).hosts()))


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


class NodeNetwork:
    """An anonymous network namespace held open by a ``sleep`` process; its pods' bridge
    serves ``subnet``."""

    def __init__(self, log_dir: Path, subnet: str = POD_SUBNET) -> None:
        self.subnet = subnet
        self.gateway = gateway(subnet)
        self._holder = Component(
            "netns-holder", ["unshare", "--net", "--", "sleep", "infinity"], log_dir
        )

    @property
    def pid(self) -> int:
        pid = self._holder.pid
        if pid is None or not self._holder.running():
            raise NodeNetworkError("the node's network namespace is not up")
        return pid

    @property
    def path(self) -> Path:
        """``/proc/<holder>/ns/net``: what ``nsenter --net=`` and ``setns`` take."""
        return Path(f"/proc/{self.pid}/ns/net")

    def inode(self) -> int:
        return self.path.stat().st_ino

    def enter_argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the namespace (nsenter execs it: same PID)."""
        return ["nsenter", f"--net={self.path}", "--", *argv]

    def ip(self, *args: str) -> None:
        done = subprocess.run(
            self.enter_argv(["ip", *args]), capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise NodeNetworkError(
                f"ip {' '.join(args)} in the node's netns: {done.stderr.strip()}"
            )

    def start(self) -> None:
        """Create the namespace: loopback up, the pods' bridge with the node IP,
        and the Service address on loopback for :class:`Forwarder`."""
        self._holder.start()
        deadline = 50
        for _ in range(deadline):
            pid = self._holder.pid
            if (
                pid
                and Path(f"/proc/{pid}/ns/net").stat().st_ino
                != Path("/proc/self/ns/net").stat().st_ino
            ):
                break
            if not self._holder.running():
                raise NodeNetworkError(f"unshare --net failed: {self._holder.log_tail(5)}")
            threading.Event().wait(0.02)
        else:
            raise NodeNetworkError("unshare --net did not enter a new network namespace")
        self.ip("link", "set", "lo", "up")
        self.ip("addr", "add", f"{SERVICE_IP}/32", "dev", "lo")
        # The CNI bridge plugin adopts an existing bridge; made here so the kubelet
        # has a non-loopback node IP before the first pod exists.
        self.ip("link", "add", BRIDGE, "type", "bridge")
        prefix = pod_subnet(self.subnet).prefixlen
        self.ip("addr", "add", f"{self.gateway}/{prefix}", "dev", BRIDGE)
        self.ip("link", "set", BRIDGE, "up")

    def stop(self) -> None:
        self._holder.stop(grace=2.0)


@dataclass(frozen=True)
class Route:
    """Listen at ``listen`` inside the namespace; connect to ``target`` on the host."""

    listen: tuple[str, int]
    target: tuple[str, int]


class Forwarder:
    """TCP relays from listeners inside the node's namespace to host addresses.

    The listening sockets are created by a short-lived thread that has entered
    the namespace (``setns`` moves only the calling thread); sockets keep the
    namespace they were made in, so the accept loops and outgoing connects run
    on ordinary threads in the host's namespace.
    """

    def __init__(self, network: NodeNetwork, routes: Sequence[Route]) -> None:
        self._network = network
        self._routes = list(routes)
        self._listeners: list[tuple[socket.socket, Route]] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()

    def start(self) -> None:
        made: list[tuple[socket.socket, Route]] = []
        failure: list[BaseException] = []

        def listen_inside() -> None:
            with open("/proc/self/ns/net", "rb") as home, self._network.path.open("rb") as node:
                _setns(node.fileno())
                try:
                    for route in self._routes:
                        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                        sock.bind(route.listen)
                        sock.listen(64)
                        made.append((sock, route))
                except BaseException as err:
                    failure.append(err)
                finally:
                    _setns(home.fileno())

        thread = threading.Thread(target=listen_inside, name="netns-listen")
        thread.start()
        thread.join()
        self._listeners = made
        if failure:
            self.stop()
            raise NodeNetworkError(f"cannot listen in the node's netns: {failure[0]}")
        for sock, route in made:
            t = threading.Thread(
                target=self._accept, args=(sock, route), name=f"fwd-{route.listen[1]}", daemon=True
            )
            t.start()
            self._threads.append(t)

    def _accept(self, listener: socket.socket, route: Route) -> None:
        while not self._stop.is_set():
            try:
                inside, _ = listener.accept()
            except OSError:
                return
            try:
                outside = socket.create_connection(route.target, timeout=10)
            except OSError as err:
                logger.warning("forward: cannot reach %s: %s", route.target, err)
                inside.close()
                continue
            outside.settimeout(None)
            with self._lock:
                self._open.update((inside, outside))
            threading.Thread(target=self._relay, args=(inside, outside), daemon=True).start()

    def _relay(self, a: socket.socket, b: socket.socket) -> None:
        """Copy both ways until both sides have closed (half-closes passed on)."""
        selector = selectors.DefaultSelector()
        selector.register(a, selectors.EVENT_READ, b)
        selector.register(b, selectors.EVENT_READ, a)
        open_ways = 2
        try:
            while open_ways and not self._stop.is_set():
                for key, _ in selector.select(timeout=1.0):
                    src: socket.socket = key.fileobj  # type: ignore[assignment]
                    dst: socket.socket = key.data
                    try:
                        chunk = src.recv(65536)
                    except OSError:
                        chunk = b""
                    if chunk:
                        dst.sendall(chunk)
                        continue
                    selector.unregister(src)
                    open_ways -= 1
                    with contextlib.suppress(OSError):
                        dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        finally:
            selector.close()
            with self._lock:
                for sock in (a, b):
                    self._open.discard(sock)
                    sock.close()

    def stop(self) -> None:
        self._stop.set()
        for sock, _ in self._listeners:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.close()
            self._open.clear()
        for t in self._threads:
            t.join(timeout=2)
