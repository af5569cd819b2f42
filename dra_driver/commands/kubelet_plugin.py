"""``dra-driver kubelet-plugin``: the node daemon (composition root of the GPU driver).

Builds :class:`~dra_driver.gpu.driver.GpuDriver` (discovery + devices + claim
preparation) on the real or an emulated host, hands it to the plugin layer's
:class:`~dra_driver.plugin.app.KubeletPlugin`, and keeps the published pool
current: re-discovery every ``--rediscover-interval`` seconds and on SIGHUP;
when the pool changed, the plugin republishes (a GPU that disappeared is gone
from the next slice generation). SIGTERM/SIGINT stop it cleanly; slices stay
for the next instance unless ``--uninstall-on-exit``.

Every flag has an environment twin (as in NVIDIA's plugin), so a DaemonSet can
configure it through ``env``.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from dra_driver.commands import observability
from dra_driver.commands.discover import add_host_arguments, gpu_host
from dra_driver.commands.slices import consumable_gpus

if TYPE_CHECKING:
    from dra_driver.gpu.inventory import Inventory
    from dra_driver.plugin.kubecreds import KubeConfig

NAME = "kubelet-plugin"
HELP = "run the DRA kubelet plugin for this node's GPUs"

logger = logging.getLogger(__name__)


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name) or default


def _path(name: str, default: str | None) -> Path | None:
    value = _env(name, default)
    return Path(value) if value else None


def _port(text: str) -> int:
    """argparse type: a TCP port, 0 (any free port) or -1 (off)."""
    try:
        port = int(text)
    except ValueError:
        port = -2
    if not -1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port: use 1-65535, 0 or -1")
    return port


def add_arguments(parser: argparse.ArgumentParser) -> None:
    node = _env("NODE_NAME")
    parser.add_argument(
        "--node-name",
        default=node,
        required=node is None,
        help="this node's name: pool name and slices' nodeName (env NODE_NAME)",
    )
    parser.add_argument(
        "--driver-name",
        default=_env("DRIVER_NAME", "gpu.nvidia.com"),
        help="DRA driver name (env DRIVER_NAME; default %(default)s)",
    )
    add_host_arguments(parser)
    parser.add_argument(
        "--cdi-dir",
        type=Path,
        default=_path("CDI_ROOT", "/var/run/cdi"),
        help="where claim CDI specs are written (env CDI_ROOT; default %(default)s)",
    )
    parser.add_argument(
        "--host-driver-root",
        type=Path,
        default=_path("HOST_DRIVER_ROOT", None),
        help="where the container runtime finds the driver root, when this process sees it "
        "elsewhere (in the chart's pod it is mounted at /driver-root): CDI specs name "
        "runtime paths (env HOST_DRIVER_ROOT; default: --driver-root)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=_path("STATE_DIR", None),
        help="checkpoint and MPS state (env STATE_DIR; default "
        "<kubelet-plugins-dir>/<driver-name>)",
    )
    parser.add_argument(
        "--kubelet-registry-dir",
        type=Path,
        default=_path("KUBELET_REGISTRAR_DIRECTORY_PATH", "/var/lib/kubelet/plugins_registry"),
        help="kubelet plugin registry dir (env KUBELET_REGISTRAR_DIRECTORY_PATH; "
        "default %(default)s)",
    )
    parser.add_argument(
        "--kubelet-plugins-dir",
        type=Path,
        default=_path("KUBELET_PLUGINS_DIRECTORY_PATH", "/var/lib/kubelet/plugins"),
        help="kubelet plugins dir (env KUBELET_PLUGINS_DIRECTORY_PATH; default %(default)s)",
    )
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        default=_path("KUBECONFIG", None),
        help="kubeconfig file, or several joined by ':' as in KUBECONFIG (the first file "
        "naming an entry wins) (env KUBECONFIG; default: in-cluster service account)",
    )
    parser.add_argument(
        "--context",
        default=_env("KUBE_CONTEXT"),
        help="kubeconfig context to use (env KUBE_CONTEXT; default: current-context)",
    )
    parser.add_argument(
        "--rediscover-interval",
        type=float,
        default=float(_env("REDISCOVER_INTERVAL", "300") or 300),
        help="seconds between GPU re-discoveries; 0 = only on SIGHUP (env "
        "REDISCOVER_INTERVAL; default %(default)s)",
    )
    parser.add_argument(
        "--taint-degraded",
        action="store_true",
        default=_env("TAINT_DEGRADED", "") in ("1", "true"),
        help="publish degraded GPUs with a NoSchedule taint (needs the "
        "DRADeviceTaints gate) instead of leaving them out (env TAINT_DEGRADED)",
    )
    parser.add_argument(
        "--mig-mode",
        choices=("static", "dynamic"),
        default=_env("MIG_MODE", "static"),
        help="static: GPUs in MIG mode publish the MIG devices that exist; dynamic: every "
        "MIG profile and placement through shared counters, the instance created at prepare "
        "and destroyed at unprepare (GPUs with MIG off stay whole; MIG mode is never "
        "changed) (env MIG_MODE; default %(default)s)",
    )
    parser.add_argument(
        "--consumable-gpus",
        type=consumable_gpus,
        default=_env("CONSUMABLE_GPUS", "none"),
        help="full GPUs published for sharing by many claims (consumable capacity: memory and "
        "computeShare): none, all, or product names and GPU UUIDs separated by commas "
        "(env CONSUMABLE_GPUS; default none)",
    )
    parser.add_argument(
        "--rolling-update-uid",
        default=_env("POD_UID"),
        help="pod UID: UID-suffixed sockets so two plugin pods can overlap "
        "during an update (env POD_UID; default: off)",
    )
    parser.add_argument(
        "--health-interval",
        type=float,
        default=float(_env("HEALTH_INTERVAL", "10") or 10),
        help="seconds between device-health updates to the kubelet (default %(default)s)",
    )
    parser.add_argument(
        "--health-port",
        type=_port,
        default=_env("HEALTH_PORT", "-1"),  # a str default goes through type= too
        help="TCP port of the HTTP /healthz and /readyz endpoint for the pod's probes; "
        "0 picks a free port, -1 serves none (env HEALTH_PORT; default: none)",
    )
    parser.add_argument(
        "--cleanup-interval",
        type=float,
        default=float(_env("CLEANUP_INTERVAL", "600") or 600),
        help="seconds between stale-claim cleanups (default %(default)s)",
    )
    parser.add_argument(
        "--nvidia-smi",
        type=Path,
        default=_path("NVIDIA_SMI", None),
        help="nvidia-smi to run (env NVIDIA_SMI; default: found under the driver root)",
    )
    parser.add_argument(
        "--mps-control",
        type=Path,
        default=_path("NVIDIA_MPS_CONTROL", None),
        help="nvidia-cuda-mps-control to run (env NVIDIA_MPS_CONTROL; default: found "
        "under the driver root)",
    )
    parser.add_argument(
        "--uninstall-on-exit",
        action="store_true",
        help="delete this node's slices on exit (clean uninstall)",
    )
    observability.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from prometheus_client import CollectorRegistry

    from dra_driver.gpu.discovery import DiscoveryError, discover
    from dra_driver.gpu.driver import GpuDriver
    from dra_driver.gpu.emulation import ProfileError
    from dra_driver.gpu.hostpaths import HostPaths
    from dra_driver.gpu.metrics import GpuMetrics
    from dra_driver.gpu.nvml import Nvml
    from dra_driver.gpu.sharing import GpuTools
    from dra_driver.plugin.app import KubeletPlugin, PluginSettings
    from dra_driver.plugin.healthz import HealthServer
    from dra_driver.plugin.kubeclient import KubeError
    from dra_driver.plugin.metrics import exposition

    stop = threading.Event()
    rediscover = threading.Event()

    def on_stop(signum: int, _frame: FrameType | None) -> None:
        logger.info("stopping", extra={"signal": signal.Signals(signum).name})
        stop.set()
        rediscover.set()

    def on_hup(_signum: int, _frame: FrameType | None) -> None:
        rediscover.set()

    try:
        with gpu_host(args) as (host, node):
            tools = GpuTools.for_host(host)
            tools = dataclasses.replace(
                tools,
                nvidia_smi=args.nvidia_smi or tools.nvidia_smi,
                mps_control=args.mps_control or tools.mps_control,
            )
            if node is not None:
                _install_emulated_tools(node.bin_dir, node.host.root / "emulation" / "tools.jsonl")

            registry = CollectorRegistry()
            gpu_metrics = GpuMetrics(registry)

            def discover_now() -> Inventory:
                if node is not None:
                    node.sync()
                return discover(host, logger, nvml=Nvml(observer=gpu_metrics.nvml_call))

            state_dir = args.state_dir or args.kubelet_plugins_dir / args.driver_name
            state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            args.cdi_dir.mkdir(parents=True, exist_ok=True)
            driver = GpuDriver(
                driver_name=args.driver_name,
                discover=discover_now,
                host=host,
                cdi_dir=args.cdi_dir,
                state_dir=state_dir,
                tools=tools,
                runtime_host=(
                    HostPaths(root=host.root, driver_root=args.host_driver_root)
                    if args.host_driver_root is not None
                    else None
                ),
                logger=logging.getLogger("dra_driver.gpu"),
                pool_name=args.node_name,
                taint_degraded=args.taint_degraded,
                health_policy=observability.health_policy(args),
                numa_attribute_form=args.numa_attribute_form,
                nvml_observer=gpu_metrics.nvml_call,
                health_events=gpu_metrics,
                usage_interval_s=args.usage_interval,
                registry=registry,
                mig_mode=args.mig_mode,
                consumable=args.consumable_gpus,
            )
            settings = PluginSettings(
                driver_name=args.driver_name,
                node_name=args.node_name,
                registry_dir=args.kubelet_registry_dir,
                plugins_dir=args.kubelet_plugins_dir,
                rolling_update_uid=args.rolling_update_uid,
                health_interval_s=args.health_interval,
                cleanup_interval_s=args.cleanup_interval,
                kubeconfig=args.kubeconfig,
                claim_status=args.claim_status,
            )
            plugin = KubeletPlugin(
                settings=settings,
                backend=driver,
                logger=logging.getLogger("dra_driver.plugin"),
                registry=registry,
                # In-cluster credentials (the chart's pod) need KUBERNETES_SERVICE_HOST.
                environ=os.environ,
                kube_config=_kube_config(args),
            )
            signal.signal(signal.SIGTERM, on_stop)
            signal.signal(signal.SIGINT, on_stop)
            signal.signal(signal.SIGHUP, on_hup)
            health: HealthServer | None = None
            try:
                if args.health_port >= 0:
                    # Before the sockets, so the startup probe answers (503) at once.
                    health = HealthServer(
                        readiness=plugin.readiness,
                        port=args.health_port,
                        logger=logging.getLogger("dra_driver.plugin"),
                        metrics=exposition(registry) if args.metrics else None,
                    )
                    health.start()
                plugin.start()
            except (KubeError, OSError) as exc:
                plugin.stop()
                if health is not None:
                    health.stop()
                print(f"dra-driver kubelet-plugin: cannot start: {exc}", file=sys.stderr)
                return 1
            logger.info(
                "kubelet plugin running",
                extra={
                    "node": args.node_name,
                    "driver": args.driver_name,
                    "devices": len(driver.pool().devices),
                    "emulated": args.emulate or "",
                },
            )
            try:
                interval = args.rediscover_interval if args.rediscover_interval > 0 else None
                while not stop.is_set():
                    rediscover.wait(interval)
                    rediscover.clear()
                    if stop.is_set():
                        break
                    if driver.refresh():
                        plugin.republish()
            finally:
                plugin.stop(uninstall=args.uninstall_on_exit)
                if health is not None:
                    health.stop()
    except (DiscoveryError, ProfileError, FileExistsError, KubeError) as exc:
        print(f"dra-driver kubelet-plugin: {exc}", file=sys.stderr)
        return 1
    return 0


def _kube_config(args: argparse.Namespace) -> KubeConfig | None:
    """The kubeconfig context named by --context; None leaves the choice to the plugin."""
    from dra_driver.plugin.kubecreds import KubeConfigError, load_kubeconfig

    if args.context is None:
        return None
    if args.kubeconfig is None:
        raise KubeConfigError("--context needs --kubeconfig (or KUBECONFIG)")
    return load_kubeconfig(args.kubeconfig, args.context)


def _install_emulated_tools(bin_dir: Path, record: Path) -> None:
    """Emulated nvidia-smi / MPS control in the emulated driver root, unless already there."""
    from dra_driver.gpu.emulation import gputools

    smi = bin_dir / gputools.NVIDIA_SMI
    if smi.exists() and "gputools" in smi.read_text(errors="replace"):
        return
    record.parent.mkdir(parents=True, exist_ok=True)
    gputools.install(bin_dir, record)
