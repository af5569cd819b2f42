"""What the plugin layer is told (:class:`PluginSettings`) and what it reports about
itself (:class:`Readiness`); both importable from :mod:`dra_driver.plugin.app` too."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dra_driver.plugin.backend import DeviceHealth
from dra_driver.plugin.publishing import PublishStatus


@dataclass(frozen=True)
class PluginSettings:
    """Everything the plugin layer needs to know; built once by the CLI."""

    driver_name: str
    """DNS subdomain <= 63 chars, e.g. ``gpu.example.com``; names sockets and slices."""
    node_name: str
    """This node; also the pool name and the slices' ``spec.nodeName``."""
    registry_dir: Path = Path("/var/lib/kubelet/plugins_registry")
    """Where the kubelet's plugin watcher looks (``<kubelet root>/plugins_registry``)."""
    plugins_dir: Path = Path("/var/lib/kubelet/plugins")
    """Parent of our private ``<driver>/`` dir holding the DRA socket and lock file."""
    rolling_update_uid: str | None = None
    """Pod UID: enables UID-suffixed sockets and the cross-process file lock, so two
    plugin pods can overlap during a DaemonSet surge update. None: plain names."""
    socket_group: int | None = None
    """Group ID for 0660 sockets; None keeps them 0600 (root only)."""
    health_interval_s: float = 10.0
    """Full device-health list is streamed at least this often (kubelet marks a device
    Unknown after 30 s without refresh)."""
    cleanup_interval_s: float = 600.0
    """How often prepared claims are checked against the API server; also once at start."""
    resync_interval_s: float = 30.0
    """How often the pool is re-read for a change nobody announced, which is then
    published; the slices themselves are checked by the watch and its relists."""
    kubeconfig: Path | None = None
    """Kubeconfig file(s), ':'-joined; None uses the in-cluster service account."""
    kube_context: str | None = None
    """Context of ``kubeconfig``; None is its current-context."""
    serve_health: bool = True
    """Serve and advertise the DRAResourceHealth services."""
    serialize_claims: bool = False
    """Force one backend call at a time even if the backend supports parallel claims."""
    grpc_workers: int = 8
    """gRPC handler threads; each open health stream holds one. Eight, not 16: the calls
    share one GIL, and 16 threads fighting for it across two cores made 16 concurrent
    prepares take 80 ms (p50) where 8 took 57 and the Go reference plugin 37-40
    (docs/benchmarks.md); 8 still serve a burst against a slow API server in two rounds
    of GETs and let 8 slow prepares (an MPS daemon pod's start) run side by side."""
    api_timeout_s: float = 10.0
    """Per-request API server timeout."""
    claim_status: bool = True
    """Write our devices into each prepared claim's ``status.devices`` (KEP-4817); needs
    RBAC on ``resourceclaims/status`` and ``resourceclaims/driver`` (deploy/rbac)."""
    claim_refresh_interval_s: float = 60.0
    """How often the pods of prepared claims are re-read (usage labels) and changed claim
    status entries re-applied (also right after every health change)."""


@dataclass(frozen=True)
class Readiness:
    """Snapshot for a health endpoint; ``ready`` is the overall verdict."""

    serving: bool
    registered: bool
    registration_error: str
    publish: PublishStatus = field(default_factory=PublishStatus)
    devices: tuple[DeviceHealth, ...] = ()
    """Device health as streamed to the kubelet (read fresh; a change is pushed to the
    streams first). A broken device does not make the plugin unready (the plugin still
    serves the others); it is listed."""
    fatal: str = ""
    """Why a background thread died; the plugin is then not alive (``/healthz``)."""
    backend_problems: tuple[str, ...] = ()
    """What the backend reports as keeping it from preparing claims (e.g. a corrupt
    checkpoint); the plugin is not ready while there are any."""

    @property
    def alive(self) -> bool:
        """Liveness: serving and no background thread dead."""
        return self.serving and not self.fatal

    @property
    def ready(self) -> bool:
        return (
            self.alive
            and self.registered
            and self.publish.in_sync
            and not self.publish.dropped_fields
            and not self.backend_problems
        )

    @property
    def problems(self) -> list[str]:
        out = [f"background thread failed: {self.fatal}"] if self.fatal else []
        out += list(self.backend_problems)
        if not self.serving:
            out.append("gRPC sockets are not serving")
        if not self.registered:
            out.append(f"not registered with the kubelet: {self.registration_error or 'pending'}")
        if not self.publish.in_sync:
            out.append(f"slices not published: {self.publish.last_error or 'pending'}")
        if self.publish.dropped_fields:
            out.append("API server dropped fields: " + ", ".join(self.publish.dropped_fields))
        return out
