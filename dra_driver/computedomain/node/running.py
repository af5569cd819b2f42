"""The compute-domain kubelet plugin's composition root: plugin layer, host facts,
checkpoint, backend, the node's clique label; then wait for SIGTERM/SIGINT (stop),
SIGHUP (re-read the host: a clique registered late is published and labelled) or a
fatal background failure (exit 1).

The host (real or emulated, NVML usable) is given by the command edge
(:mod:`dra_driver.commands.compute_domain_plugin`), which alone reaches the emulator.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from dra_driver.computedomain.names import GPU_CLIQUE_LABEL
from dra_driver.computedomain.node.backend import ComputeDomainBackend
from dra_driver.computedomain.node.checkpoint import CheckpointStore
from dra_driver.computedomain.node.cliquelabel import CliqueNodeLabel
from dra_driver.computedomain.node.hostinfo import read_host
from dra_driver.computedomain.node.kubeapi import DaemonPods, NodeLabel
from dra_driver.daemon import Fatal, Wakeups
from dra_driver.errors import DriverError
from dra_driver.gpu.hardware.nvml import Nvml, NvmlError
from dra_driver.gpu.host.hostpaths import HostPaths
from dra_driver.plugin.settings import PluginSettings

logger = logging.getLogger(__name__)
_STOP = (signal.SIGTERM, signal.SIGINT)


@dataclass(frozen=True)
class ComputeDomainPluginSettings:
    plugin: PluginSettings
    """Driver name ``compute-domain.nvidia.com``: its own sockets and slices."""
    namespace: str
    """The driver's namespace, where the domains' daemon pods run."""
    cdi_dir: Path
    state_dir: Path
    """Checkpoint and the domains' host directories; a host path seen at the same place."""
    runtime_driver_root: Path
    """The driver root as the container runtime sees it (for ``nvidia-imex``'s bin dir)."""
    extra_mounts: Sequence[str] = ()
    """Host paths given to daemons at the same place (an emulated node's root)."""
    ready_wait_s: float = 2.0
    """How long a channel prepare waits for the daemon pod before failing retryably."""
    health_port: int = -1
    """``/healthz`` and ``/readyz``; -1: off."""
    clique_node_label: bool = True
    """Keep ``nvidia.com/gpu.clique`` on the node (off where GPU Feature Discovery does)."""


class StartError(DriverError):
    """The compute-domain plugin cannot start."""


def run(settings: ComputeDomainPluginSettings, *, host: HostPaths,
        environ: Mapping[str, str]) -> int:  # fmt: skip
    """Until SIGTERM/SIGINT (0) or a fatal background failure (1)."""
    from dra_driver.plugin.app import KubeletPlugin

    wakeups = Wakeups()
    wakeups.install()
    try:
        with ExitStack() as stack:
            fatal = Fatal(wakeups)
            plugin = KubeletPlugin(settings=settings.plugin, backend=None,
                                   logger=logging.getLogger("dra_driver.plugin"),
                                   environ=environ, on_fatal=fatal,
                                   waiting_for="reading the IMEX host")  # fmt: skip
            stack.callback(plugin.stop)
            plugin.serve()
            if settings.health_port >= 0:
                from dra_driver.plugin.healthz import HealthServer

                health = HealthServer(readiness=plugin.readiness, port=settings.health_port,
                                      logger=logging.getLogger("dra_driver.plugin"))  # fmt: skip
                health.start()
                stack.callback(health.stop)
            nvml = Nvml()
            nvml.init()
            stack.callback(nvml.shutdown)
            store = CheckpointStore(
                state_dir=settings.state_dir,
                boot_id_file=host.proc("sys", "kernel", "random", "boot_id"),
            )
            stack.callback(store.close)
            node = settings.plugin.node_name
            backend = ComputeDomainBackend(
                driver_name=settings.plugin.driver_name, node_name=node,
                host=read_host(host, nvml), cdi_dir=settings.cdi_dir,
                state_dir=settings.state_dir, store=store,
                label=NodeLabel(plugin.client, node),
                daemons=DaemonPods(plugin.client, settings.namespace, node),
                logger=logging.getLogger("dra_driver.computedomain"),
                runtime_driver_root=settings.runtime_driver_root,
                extra_mounts=settings.extra_mounts, ready_wait_s=settings.ready_wait_s,
            )  # fmt: skip
            backend.recover()
            clique_label = (CliqueNodeLabel(NodeLabel(plugin.client, node, GPU_CLIQUE_LABEL),
                                            settings.state_dir)
                            if settings.clique_node_label else None)  # fmt: skip
            if clique_label is not None:
                clique_label.sync(backend.host.clique_id)
            plugin.attach(backend)
            plugin.start()
            logger.info("compute-domain plugin running", extra={
                "node": node, "clique": backend.host.clique_id,
                "devices": len(backend.pool().devices)})  # fmt: skip
            while True:
                got = wakeups.wait(None)
                if any(s in got for s in _STOP):
                    return 0
                if fatal.reason:
                    logger.error("stopping after a fatal failure: %s", fatal.reason)
                    return 1
                if signal.SIGHUP in got:
                    backend.host = read_host(host, nvml)
                    plugin.republish()
                    if clique_label is not None:
                        _resync(clique_label, backend.host.clique_id)
    except StartError:
        raise
    except (DriverError, NvmlError, OSError) as exc:
        raise StartError(f"cannot start: {exc}") from exc
    finally:
        wakeups.uninstall()


def _resync(label: CliqueNodeLabel, clique_id: str) -> None:
    """After a re-read: a failed label write is logged, the plugin serves on (the next
    SIGHUP or restart tries again)."""
    try:
        label.sync(clique_id)
    except DriverError as exc:
        logger.error("cannot update the node's clique label: %s", exc,
                     extra={"clique": clique_id})  # fmt: skip
