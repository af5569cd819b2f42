"""One node's plugin as the kubelet and its DaemonSet see it: a ``dra-driver
kubelet-plugin`` host process on emulated GPUs with its own state, socket and CDI dirs,
registered through its registration socket, ready when its ``/readyz`` answers 200.

Nothing here is a kubelet: the bench does the two calls the kubelet's plugin watcher
makes when a registration socket appears (``GetInfo``, then ``NotifyRegistrationStatus``
with ``plugin_registered``), because the plugin is not ready until it was registered.
``/readyz`` is what the chart's readiness probe asks, so "ready" here is what a
DaemonSet rolling update waits for: sockets serving, registered, the node's slices in
sync (the publisher's first sync found them up to date or wrote them), no problem
(the CDI hook in place, the checkpoint readable).
"""

from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from dra_driver.devcluster.processes import Component, http_ok
from dra_driver.plugin._proto import pluginregistration_pb2 as reg_pb
from dra_driver.plugin._proto import pluginregistration_pb2_grpc as reg_grpc
from dra_driver.plugin.sockets import socket_paths

DRIVER = "gpu.nvidia.com"
NAMESPACE = "dra-driver"
"""The chart's namespace, where ``--mps-daemons pod`` (the chart's default) keeps its pods."""
_LISTENING = re.compile(r'msg="health endpoint listening" port=(\d+)')


@dataclass(frozen=True)
class PluginFlags:
    """What every plugin runs with besides its node's own paths: the chart's defaults
    where a flag changes what the plugin asks of the API server."""

    profile: str
    cdi_hook: Path
    """nvidia-cdi-hook installed into each node's plugin dir (else the plugin is unready)."""
    mig_mode: str = "static"
    rediscover_interval_s: float = 60.0
    """The chart's ``rediscoverIntervalSeconds``."""

    def argv(self) -> list[str]:
        return [
            f"--emulate={self.profile}",
            f"--mig-mode={self.mig_mode}",
            f"--rediscover-interval={self.rediscover_interval_s:g}",
            f"--cdi-hook-source={self.cdi_hook}",
            "--mps-daemons=pod",
            f"--namespace={NAMESPACE}",
            "--mps-daemon-image=registry.invalid/dra-driver:bench",
        ]


@dataclass
class PluginNode:
    """One node and the plugin process currently running for it (None while none is)."""

    name: str
    workdir: Path
    kubeconfig: Path
    flags: PluginFlags
    surge: bool = False
    """Rolling-update mode: UID-suffixed sockets (``--rolling-update-uid``), as the chart
    runs the plugin with ``rollingUpdate.enabled`` so two processes can overlap."""
    restarts: int = 0
    process: Component | None = None
    registered: bool = False
    port: int | None = None
    """The health port the process said it listens on (it picks a free one: a port
    chosen here could be taken meanwhile as some client's ephemeral port)."""
    _old: Component | None = field(default=None, repr=False)
    _log_from: int = field(default=0, repr=False)

    @property
    def uid(self) -> str | None:
        return f"{self.name}-{self.restarts}" if self.surge else None

    def argv(self) -> list[str]:
        w = self.workdir
        uid = [f"--rolling-update-uid={self.uid}"] if self.uid else []
        return [
            sys.executable, "-m", "dra_driver", "kubelet-plugin",
            f"--node-name={self.name}", f"--kubeconfig={self.kubeconfig}",
            f"--host-root={w / 'host'}", f"--cdi-dir={w / 'cdi'}", f"--state-dir={w / 'state'}",
            f"--kubelet-registry-dir={w / 'reg'}", f"--kubelet-plugins-dir={w / 'plugins'}",
            "--health-port=0", *self.flags.argv(), *uid,
        ]  # fmt: skip

    @property
    def registration_socket(self) -> Path:
        w = self.workdir
        return socket_paths(
            driver=DRIVER,
            registry_dir=w / "reg",
            plugins_dir=w / "plugins",
            rolling_update_uid=self.uid,
        ).registration

    def start(self) -> None:
        """A new process for this node (the previous one must have exited, unless
        :meth:`start_beside` keeps it for a surge update)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("DRA_")}
        self.process = Component(f"plugin-{self.name}", self.argv(), self.workdir, env=env)
        self.registered, self.port = False, None
        log = self.process.log_path
        self._log_from = log.stat().st_size if log.exists() else 0
        self.process.start()

    def stop(self, grace_s: float = 30.0) -> float:
        """SIGTERM, wait for the exit (SIGKILL after ``grace_s``); seconds it took."""
        began = time.monotonic()
        if self.process is not None:
            self.process.stop(grace=grace_s)
            self.process = None
        return time.monotonic() - began

    def restart(self, grace_s: float = 30.0) -> float:
        """maxUnavailable: the process stops, then the next one starts; seconds to the exit."""
        exit_s = self.stop(grace_s)
        self.restarts += 1
        self.start()
        return exit_s

    def start_beside(self) -> None:
        """Surge: the next process starts while the current one runs."""
        self._old = self.process
        self.restarts += 1
        self.start()

    def stop_old(self, grace_s: float = 30.0) -> float:
        began = time.monotonic()
        if self._old is not None:
            self._old.stop(grace=grace_s)
            self._old = None
        return time.monotonic() - began

    def check(self) -> bool:
        """One look, as the kubelet and the readiness probe would: register the process
        once its registration socket is there, then ask ``/readyz``. Raises when the
        process exited."""
        proc = self.process
        if proc is None or not proc.running():
            tail = proc.log_tail() if proc else ""
            raise RuntimeError(f"plugin of {self.name} is not running\n{tail}")
        if not self.registered:
            self.registered = register(self.registration_socket)
            if not self.registered:
                return False
        if self.port is None:
            with proc.log_path.open("rb") as log:
                log.seek(self._log_from)
                said = _LISTENING.search(log.read().decode("utf-8", "replace"))
            if said is None:
                return False
            self.port = int(said[1])
        ok, _ = http_ok(f"http://127.0.0.1:{self.port}/readyz", None)
        return ok

    def log_tail(self) -> str:
        return self.process.log_tail() if self.process else f"{self.name}: no process"


def register(socket: Path) -> bool:
    """The kubelet's plugin watcher: ``GetInfo`` (its 1 s deadline), then tell the plugin
    it was registered. False while the socket is not there or does not answer."""
    if not socket.exists():
        return False
    try:
        with grpc.insecure_channel(f"unix:{socket}") as channel:
            stub = reg_grpc.RegistrationStub(channel)
            info = stub.GetInfo(reg_pb.InfoRequest(), timeout=1)
            if info.name != DRIVER:
                raise RuntimeError(f"{socket}: plugin says it is {info.name!r}, not {DRIVER}")
            stub.NotifyRegistrationStatus(
                reg_pb.RegistrationStatus(plugin_registered=True), timeout=5
            )
    except grpc.RpcError:
        return False
    return True
