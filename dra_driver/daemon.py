"""The kubelet-plugin daemon's composition root: builds every component once, runs, stops.

:func:`run` takes validated :class:`~dra_driver.settings.DaemonSettings` and
wires, in this order: the plugin layer
(:class:`~dra_driver.plugin.app.KubeletPlugin`: sockets, registration, slices,
health, claim cleanup), serving at once, and the HTTP health endpoint; then the
metrics registry (prometheus-client's ``CollectorRegistry``), given to the plugin and to
``/metrics``; then the host (real or emulated GPUs)
and the GPU driver (discovery, devices, claim preparation; it finishes any
half-done prepare or unprepare of a previous process), given to the plugin
(:meth:`~dra_driver.plugin.app.KubeletPlugin.attach`); then slice publishing and
background work start. Serving first puts the registration socket up before the
GPU layer is even imported: claim calls that arrive meanwhile wait for the driver.
Then the main thread waits for exactly four things: SIGTERM/SIGINT (stop), SIGHUP
or the re-discovery interval (re-discover, republish if the pool changed), or a
fatal failure of a background thread (stop, exit 1, so the kubelet restarts the pod; ``/healthz``
fails meanwhile).

Signals: handlers are installed before anything starts, and the main thread
waits in ``select`` on the interpreter's signal wakeup fd
(:class:`Wakeups`), so a signal delivered to *any* thread (gRPC's, the
publisher's) wakes it at once. Waiting on an ``Event`` instead only noticed
a signal delivered to another thread when the wait timed out (up to 300 s),
so the pod sat out its grace period and was SIGKILLed.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import select
import signal
import socket
import threading
import time
from collections.abc import Mapping
from contextlib import ExitStack
from typing import TYPE_CHECKING

from dra_driver.errors import DriverError
from dra_driver.settings import DaemonSettings

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from dra_driver.gpu.driver import GpuDriver
    from dra_driver.gpu.hardware.inventory import Inventory
    from dra_driver.gpu.host.hostpaths import HostPaths
    from dra_driver.gpu.sharing.mpsrunners import DaemonRunner
    from dra_driver.gpu.sharing.tools import GpuTools
    from dra_driver.plugin.app import KubeletPlugin
    from dra_driver.plugin.kubeclient import KubeClient

logger = logging.getLogger(__name__)

_POKE = 0  # not a signal number
_STOP = (signal.SIGTERM, signal.SIGINT)


class Wakeups:
    """Signals and pokes from other threads, received by the main thread in ``select``."""

    def __init__(self) -> None:
        self._recv, self._send = socket.socketpair()
        self._recv.setblocking(False)
        self._send.setblocking(False)
        self._previous: dict[int, object] = {}
        self._old_fd = -1

    def install(self) -> None:
        """From the main thread, before any other thread starts."""
        for signum in (*_STOP, signal.SIGHUP):
            # The Python handler does nothing; its only job is to replace the default
            # action. The C-level handler writes the signal number to the wakeup fd.
            self._previous[signum] = signal.signal(signum, lambda _s, _f: None)
        self._old_fd = signal.set_wakeup_fd(self._send.fileno(), warn_on_full_buffer=False)

    def uninstall(self) -> None:
        signal.set_wakeup_fd(self._old_fd)
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)  # type: ignore[arg-type]
        self._recv.close()
        self._send.close()

    def poke(self) -> None:
        """Wake the main thread (any thread may call it)."""
        try:
            self._send.send(bytes([_POKE]))
        except BlockingIOError:
            pass  # already full of wakeups

    def wait(self, timeout_s: float | None) -> set[int]:
        """Signal numbers (and 0 for a poke) received; empty when the timeout passed."""
        ready, _, _ = select.select([self._recv], [], [], timeout_s)
        got: set[int] = set()
        while ready:
            try:
                got.update(self._recv.recv(256))
            except BlockingIOError:
                break
        return got


class Fatal:
    """The first fatal failure of a background thread; wakes the main thread."""

    def __init__(self, wakeups: Wakeups) -> None:
        self._wakeups = wakeups
        self._lock = threading.Lock()
        self.reason = ""

    def __call__(self, reason: str) -> None:
        with self._lock:
            if not self.reason:
                self.reason = reason
        self._wakeups.poke()


def run(settings: DaemonSettings, *, environ: Mapping[str, str]) -> int:
    """Run until SIGTERM/SIGINT (0) or a fatal background failure (1); our errors
    while starting propagate (the command edge prints them)."""
    wakeups = Wakeups()
    wakeups.install()
    try:
        with ExitStack() as stack:
            return _run(settings, environ, wakeups, stack)
    except DaemonError:
        raise
    except (DriverError, OSError) as exc:  # only starting raises: the loop does not
        raise DaemonError(f"cannot start: {exc}") from exc
    finally:
        wakeups.uninstall()


def _run(
    settings: DaemonSettings, environ: Mapping[str, str], wakeups: Wakeups, stack: ExitStack
) -> int:
    # The plugin layer first, so the kubelet finds our sockets before the GPU layer
    # is imported and the GPUs are discovered (start to registration
    # socket, README).
    from dra_driver.plugin.app import KubeletPlugin

    fatal = Fatal(wakeups)
    # Stopped in reverse: health endpoint, plugin, driver, then the host (NVML) last.
    gpu_host_stack = stack.enter_context(ExitStack())
    driver_stack = stack.enter_context(ExitStack())
    plugin = KubeletPlugin(
        settings=settings.plugin,
        backend=None,  # the GPU driver, once built (claim calls wait for it meanwhile)
        logger=logging.getLogger("dra_driver.plugin"),
        environ=environ,
        on_fatal=fatal,
        waiting_for="discovering GPUs",
    )
    stack.callback(plugin.stop, uninstall=settings.uninstall_on_exit)
    plugin.serve()
    # The API client's library (~0.6 s of imports) loads beside GPU discovery, not
    # before the sockets; start() waits for it and raises its error, if any.
    threading.Thread(target=_connect, args=(plugin,), name="kube-connect", daemon=True).start()
    health = None
    if settings.health_port >= 0:
        # Right after the sockets; the probes answer 503 until the GPUs are
        # discovered and the slices published.
        from dra_driver.plugin.healthz import HealthServer

        health = HealthServer(
            readiness=plugin.readiness,
            port=settings.health_port,
            logger=logging.getLogger("dra_driver.plugin"),
        )
        health.start()
        stack.callback(health.stop)
    # prometheus-client (~30 ms of imports) comes after the sockets and the probes.
    # Our own registry: the library's global REGISTRY (process and GC collectors it
    # registers on import) is never served.
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    plugin.add_metrics(registry)
    if health is not None and settings.metrics:
        from dra_driver.plugin.metrics import exposition

        health.serve_metrics(exposition(registry))
    try:
        driver = _gpu_driver(settings, gpu_host_stack, registry, plugin.client)
        driver_stack.callback(driver.close)
        plugin.attach(driver)
        plugin.start()
    except Exception as exc:
        # Said now, in the log's format, and to every claim call waiting meanwhile
        # (they would otherwise hold the exit until their wait ran out).
        logger.error("cannot start: %s", exc, exc_info=not isinstance(exc, DriverError | OSError))
        plugin.start_failed(str(exc))
        raise
    _trim_heap()
    logger.info(
        "kubelet plugin running",
        extra={
            "node": settings.plugin.node_name,
            "driver": settings.plugin.driver_name,
            "devices": len(driver.pool().devices),
            "emulated": settings.host.emulate or "",
            "pid": os.getpid(),
        },
    )
    interval = settings.rediscover_interval_s or None
    next_discovery = time.monotonic() + interval if interval else None
    while True:
        timeout = None if next_discovery is None else max(0.0, next_discovery - time.monotonic())
        got = wakeups.wait(timeout)
        stop = [s for s in _STOP if s in got]
        if stop:
            logger.info("stopping", extra={"signal": signal.Signals(stop[0]).name})
            return 0
        if fatal.reason:
            logger.error("stopping after a fatal failure: %s", fatal.reason)
            return 1
        due = next_discovery is not None and time.monotonic() >= next_discovery
        if signal.SIGHUP in got or due:
            if driver.refresh():
                plugin.republish()
            if interval:
                next_discovery = time.monotonic() + interval


def _connect(plugin: KubeletPlugin) -> None:
    try:
        plugin.client.connect()
    except DriverError:
        pass  # KubeletPlugin.start() connects again and stops the daemon with this error


def _gpu_driver(
    settings: DaemonSettings, stack: ExitStack, registry: CollectorRegistry, client: KubeClient
) -> GpuDriver:
    """The host (real or emulated), discovery, and the driver that finishes whatever a
    previous process left half done (and adopts the MPS daemons it left running); its
    metrics go into ``registry``."""
    import dataclasses

    from dra_driver.commands.discover import gpu_host, install_emulated_tools
    from dra_driver.gpu.cdi.hooks import HookPlacement
    from dra_driver.gpu.driver import GpuDriver
    from dra_driver.gpu.hardware.discovery import discover
    from dra_driver.gpu.hardware.nvml import Nvml
    from dra_driver.gpu.host.hostpaths import HostPaths
    from dra_driver.gpu.monitoring.metrics import GpuMetrics
    from dra_driver.gpu.sharing.tools import GpuTools

    host, node = stack.enter_context(gpu_host(settings.host))
    gpu = settings.gpu
    tools = GpuTools.for_host(host)
    tools = dataclasses.replace(
        tools,
        nvidia_smi=gpu.nvidia_smi or tools.nvidia_smi,
        mps_control=gpu.mps_control or tools.mps_control,
    )
    if node is not None:
        install_emulated_tools(node)

    gpu_metrics = GpuMetrics(registry)

    def discover_now() -> Inventory:
        if node is not None:
            node.sync()
        return discover(host, logger, nvml=Nvml(observer=gpu_metrics.nvml_call))

    try:
        gpu.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        gpu.cdi_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DaemonError(f"cannot start: create {exc.filename}: {exc.strerror}") from exc
    return GpuDriver(
        driver_name=settings.plugin.driver_name,
        discover=discover_now,
        host=host,
        cdi_dir=gpu.cdi_dir,
        state_dir=gpu.state_dir,
        tools=tools,
        runtime_host=(
            HostPaths(root=host.root, driver_root=gpu.host_driver_root)
            if gpu.host_driver_root is not None
            else None
        ),
        logger=logging.getLogger("dra_driver.gpu"),
        pool_name=settings.plugin.node_name,
        taint_degraded=gpu.taint_degraded,
        health_policy=gpu.health_policy,
        numa_attribute_form=gpu.numa_attribute_form,
        nvml_observer=gpu_metrics.nvml_call,
        health_events=gpu_metrics,
        usage_interval_s=gpu.usage_interval_s,
        registry=registry if settings.metrics else None,
        mig_mode=gpu.mig_mode,
        placement_attributes=gpu.placement_attributes,
        consumable=gpu.consumable,
        mps_slots=gpu.mps_slots,
        cdi_hook=HookPlacement(
            path=gpu.cdi_hook_path, local=gpu.cdi_hook_local_path, source=gpu.cdi_hook_source
        ),
        # The process exits next: an NVML event wait (up to 0.5 s) is not waited out.
        stop_wait_s=0.1,
        mps_runner=_mps_runner(settings, host, tools, client),
    )


def _mps_runner(
    settings: DaemonSettings, host: HostPaths, tools: GpuTools, client: KubeClient
) -> DaemonRunner | None:
    """``--mps-daemons pod``: daemon pods with the plugin's image, the driver root mounted
    where this process sees it (and an emulated node's files where they are)."""
    pods = settings.gpu.mps_daemons
    if pods is None:
        return None
    from dra_driver.mpspods import PodRunner
    from dra_driver.plugin.nodepods import HostMount

    runtime_root = settings.gpu.host_driver_root or host.driver_root
    mounts = [HostMount(str(runtime_root), str(host.driver_root), read_only=True)]
    if settings.host.emulate is not None:
        mounts.append(HostMount(str(host.root)))
    return PodRunner(
        client=client,
        namespace=pods.namespace,
        node_name=settings.plugin.node_name,
        driver_name=settings.plugin.driver_name,
        image=pods.image,
        mps_control=tools.mps_control,
        library_path=tools.env.get("LD_LIBRARY_PATH", ""),
        mounts=mounts,
        priority_class=pods.priority_class,
        proc=tools.proc,
        logger=logging.getLogger("dra_driver.mpspods"),
    )


def _trim_heap() -> None:
    """Give the heap that start-up parsing used (profiles, discovery, imports) back to the
    kernel: idle RSS is what every GPU node pays for the plugin."""
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


class DaemonError(DriverError):
    """The daemon cannot start."""
