"""The daemon's settings: grouped, frozen, and validated here, in one place.

``dra-driver kubelet-plugin`` parses flags (and their ``DRA_*`` twins) into an
``argparse.Namespace``; :func:`daemon_settings` turns that into
:class:`DaemonSettings` or raises :class:`SettingsError` naming the flag, its
variable, the bad value and what is allowed. Nothing downstream re-reads a
flag or the environment: the composition root (:mod:`dra_driver.daemon`)
hands each group to the component it configures.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dra_driver.envflags import env_name
from dra_driver.errors import DriverError
from dra_driver.plugin.k8snames import is_dns_label, is_dns_subdomain

if TYPE_CHECKING:
    from dra_driver.gpu.hardware.consumable import ConsumableGpus, MpsSlots
    from dra_driver.gpu.hardware.devices import NumaAttributeForm
    from dra_driver.gpu.hardware.partitions import MigMode, PlacementAttributes
    from dra_driver.gpu.monitoring.healthpolicy import HealthPolicy
    from dra_driver.plugin.settings import PluginSettings


class SettingsError(DriverError):
    """A flag or environment value is invalid; nothing was started."""

    exit_code = 2


@dataclass(frozen=True)
class HostSettings:
    """Where the host's GPUs and driver are (``discover``, ``slices``, ``kubelet-plugin``)."""

    emulate: str | None
    """Built-in profile name or profile YAML: emulated GPUs, no NVML needed."""
    host_root: Path
    """Where the host's /sys, /proc and /dev are."""
    driver_root: Path | None
    """The NVIDIA driver installation; None: found by itself."""


@dataclass(frozen=True)
class GpuSettings:
    """How claims are prepared on this node's GPUs."""

    cdi_dir: Path
    state_dir: Path
    """Checkpoint, MPS daemons and lock files (0700)."""
    host_driver_root: Path | None
    """The driver root as the container runtime sees it, if not ``driver_root``."""
    nvidia_smi: Path | None
    mps_control: Path | None
    taint_degraded: bool
    mig_mode: MigMode
    """static: the MIG devices that exist; dynamic: created at prepare."""
    placement_attributes: PlacementAttributes
    """What dynamic MIG devices carry: full (NVIDIA's set and ours) or compact."""
    numa_attribute_form: NumaAttributeForm
    health_policy: HealthPolicy | None
    """None: no health monitoring (devices are healthy unless degraded)."""
    usage_interval_s: float
    """Seconds between per-claim usage samples (with metrics); 0: off."""
    consumable: ConsumableGpus
    """Full GPUs published for sharing by many claims (consumable capacity)."""
    mps_slots: MpsSlots
    """GPUs split into N equal MPS slots, enforced by one daemon per GPU before r615."""
    cdi_hook_path: Path
    """Where the container runtime runs NVIDIA's ``nvidia-cdi-hook`` (CDI specs name it)."""
    cdi_hook_local_path: Path
    """Where this process installs and checks that file (the same unless mounted elsewhere)."""
    cdi_hook_source: Path | None
    """What is installed at ``cdi_hook_path`` at start (a bare name: on ``PATH``); None:
    an administrator's own copy is already there."""
    mps_daemons: MpsDaemonsSettings | None = None
    """None: MPS daemons are this process's children; else one pod per daemon."""


@dataclass(frozen=True)
class MpsDaemonsSettings:
    """``--mps-daemons pod``: each MPS control daemon in a pod of its own (:mod:`dra_driver.
    mpspods`), so it outlives the plugin's container."""

    namespace: str
    """The plugin's namespace: the pods go there (RBAC: a Role on pods)."""
    image: str
    """The plugin's own image (it runs ``dra-driver mps-daemon``)."""
    priority_class: str = ""


@dataclass(frozen=True)
class DaemonSettings:
    host: HostSettings
    gpu: GpuSettings
    plugin: PluginSettings
    health_port: int
    """-1: no HTTP endpoint; 0: any free port."""
    rediscover_interval_s: float
    """0: only on SIGHUP."""
    uninstall_on_exit: bool
    metrics: bool
    """Serve Prometheus ``/metrics`` on the health port."""


def _flag(option: str) -> str:
    return f"--{option} ({env_name(option)})"


def check_node_name(node: str) -> None:
    """Refuse a ``--node-name`` that is no Kubernetes node name: it becomes a pool name,
    a label value and a path in requests, so both kubelet plugins check it the same way."""
    if not is_dns_subdomain(node):
        raise SettingsError(
            f"{_flag('node-name')} is {node!r}: expected a Kubernetes node name "
            "(lower-case DNS subdomain, at most 253 characters)"
        )


def check_rolling_update_uid(uid: str | None) -> None:
    """Refuse a ``--rolling-update-uid`` that is no pod UID: it becomes part of socket
    file names, so both kubelet plugins check it the same way."""
    if uid is not None and not is_dns_label(uid):
        raise SettingsError(
            f"{_flag('rolling-update-uid')} is {uid!r}: expected a pod UID (lower-case letters, "
            "digits and '-')"
        )


def check_namespace(namespace: str, why: str) -> None:
    """Refuse a ``--namespace`` that is no namespace name (a DNS label)."""
    if not is_dns_label(namespace):
        raise SettingsError(
            f"{_flag('namespace')} is {namespace!r}: {why} (a DNS label: lower-case "
            "letters, digits, '-', at most 63)"
        )


def _interval(option: str, value: float, low: float, high: float, *, off: bool = False) -> float:
    if off and value == 0:
        return 0.0
    if not math.isfinite(value) or not low <= value <= high:
        also = "0 (off) or " if off else ""
        raise SettingsError(
            f"{_flag(option)} is {value:g}: allowed {also}{low:g} to {high:g} seconds"
        )
    return value


def _cdi_hook_path(args: argparse.Namespace, driver: str) -> Path:
    path: Path = args.cdi_hook_path or args.kubelet_plugins_dir / driver / "nvidia-cdi-hook"
    if not path.is_absolute():
        raise SettingsError(f"{_flag('cdi-hook-path')} is {str(path)!r}: use an absolute path")
    return path


def _cdi_hook_source(args: argparse.Namespace) -> Path | None:
    source: str = args.cdi_hook_source
    if not source:
        raise SettingsError(
            f"{_flag('cdi-hook-source')} is empty: use a path, a name on PATH, or 'none'"
        )
    return None if source == "none" else Path(source)


def _mps_daemons(args: argparse.Namespace) -> MpsDaemonsSettings | None:
    if args.mps_daemons == "process":
        return None
    namespace, image = args.namespace, args.mps_daemon_image
    if not namespace or not is_dns_label(namespace):
        raise SettingsError(
            f"{_flag('namespace')} is {namespace!r}: --mps-daemons pod needs this plugin's "
            "namespace (a DNS label: lower-case letters, digits, '-', at most 63), where "
            "the daemon pods go"
        )
    if not image:
        raise SettingsError(
            f"{_flag('mps-daemon-image')} is empty: --mps-daemons pod needs the image the "
            "daemon pods run (the plugin's own)"
        )
    priority = args.mps_daemon_priority_class
    if priority and not is_dns_subdomain(priority):
        raise SettingsError(
            f"{_flag('mps-daemon-priority-class')} is {priority!r}: expected a PriorityClass "
            "name (lower-case DNS subdomain)"
        )
    return MpsDaemonsSettings(namespace=namespace, image=image, priority_class=priority)


def host_settings(args: argparse.Namespace) -> HostSettings:
    return HostSettings(
        emulate=args.emulate, host_root=args.host_root, driver_root=args.driver_root
    )


def daemon_settings(args: argparse.Namespace) -> DaemonSettings:
    """Validated settings of ``kubelet-plugin``; raises :class:`SettingsError`."""
    from dra_driver.commands.observability import health_policy
    from dra_driver.plugin.settings import PluginSettings

    driver, node = args.driver_name, args.node_name
    if not node:
        raise SettingsError(f"{_flag('node-name')} is required: this node's name")
    if not is_dns_subdomain(driver, 63) or "." not in driver:
        raise SettingsError(
            f"{_flag('driver-name')} is {driver!r}: expected a DNS subdomain of at most 63 "
            "characters with at least one dot, e.g. gpu.nvidia.com"
        )
    check_node_name(node)
    uid = args.rolling_update_uid
    check_rolling_update_uid(uid)
    if not -1 <= args.health_port <= 65535:
        raise SettingsError(f"{_flag('health-port')} is {args.health_port}: use 1-65535, 0 or -1")
    if args.kubeconfig is not None and not any(
        Path(f).is_file() for f in str(args.kubeconfig).split(":") if f
    ):
        raise SettingsError(
            f"{_flag('kubeconfig')} is {str(args.kubeconfig)!r}: no such file (several are "
            "joined by ':'; at least one must exist)"
        )
    if args.context is not None and args.kubeconfig is None:
        raise SettingsError(
            f"{_flag('context')} needs {_flag('kubeconfig')}: a context of which file?"
        )
    plugin = PluginSettings(
        driver_name=driver,
        node_name=node,
        registry_dir=args.kubelet_registry_dir,
        plugins_dir=args.kubelet_plugins_dir,
        rolling_update_uid=uid,
        health_interval_s=_interval("health-interval", args.health_interval, 1, 300),
        cleanup_interval_s=_interval("cleanup-interval", args.cleanup_interval, 10, 86400),
        kubeconfig=args.kubeconfig,
        kube_context=args.context,
        claim_status=args.claim_status,
    )
    gpu = GpuSettings(
        mps_daemons=_mps_daemons(args),
        cdi_dir=args.cdi_dir,
        state_dir=args.state_dir or args.kubelet_plugins_dir / driver,
        host_driver_root=args.host_driver_root,
        nvidia_smi=args.nvidia_smi,
        mps_control=args.mps_control,
        taint_degraded=args.taint_degraded,
        mig_mode=args.mig_mode,
        placement_attributes=args.dynamic_mig_attributes,
        numa_attribute_form=args.numa_attribute_form,
        health_policy=health_policy(args),
        usage_interval_s=_interval("usage-interval", args.usage_interval, 0.1, 3600, off=True),
        consumable=args.consumable_gpus,
        mps_slots=args.mps_slots,
        cdi_hook_path=_cdi_hook_path(args, driver),
        cdi_hook_local_path=args.cdi_hook_local_path or _cdi_hook_path(args, driver),
        cdi_hook_source=_cdi_hook_source(args),
    )
    return DaemonSettings(
        host=host_settings(args),
        gpu=gpu,
        plugin=plugin,
        health_port=args.health_port,
        rediscover_interval_s=_interval(
            "rediscover-interval", args.rediscover_interval, 5, 86400, off=True
        ),
        uninstall_on_exit=args.uninstall_on_exit,
        metrics=args.metrics,
    )
