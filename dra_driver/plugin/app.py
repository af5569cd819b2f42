"""Public entry point of the kubelet-plugin layer (stable API for drivers and the CLI).

Usage::

    settings = PluginSettings(driver_name="gpu.example.com", node_name=node)
    plugin = KubeletPlugin(settings=settings, backend=my_backend, logger=log)
    plugin.serve()            # optional: sockets up before the backend is ready
                              # (then built with backend=None and, before start,
    plugin.attach(backend)    # given it: claim calls wait for it meanwhile)
    plugin.add_metrics(registry)     # optional, once, before or after start(): a
                                     # prometheus_client.CollectorRegistry
    plugin.start()            # serving, slices being published, background work
    ...
    plugin.republish()        # after the backend's pool() changed
    plugin.notify_health_changed()   # after device health changed (optional)
    plugin.readiness()        # -> Readiness, for a /readyz endpoint
    plugin.stop()             # restart/upgrade: slices stay for the next instance
    plugin.stop(uninstall=True)      # clean uninstall: slices are deleted too

What :class:`KubeletPlugin` builds (every component in its constructor, no globals):
a :class:`~dra_driver.plugin.kubeclient.KubeClient` (kubeconfig file or the
in-cluster service account; connected in :meth:`KubeletPlugin.start`, after the
sockets serve), one gRPC server that serves the registration
service and DRA node service v1 + v1beta1 and health v1 + v1alpha1 on two
sockets (see :mod:`dra_driver.plugin.sockets`), the
:class:`~dra_driver.plugin.publishing.SlicePublisher` and the
:class:`~dra_driver.plugin.cleanup.StaleClaimCleaner`.

The backend implements :class:`~dra_driver.plugin.backend.DeviceBackend`;
optionally :class:`~dra_driver.plugin.backend.HealthReporter` (else every
published device is reported Healthy),
:class:`~dra_driver.plugin.backend.ParallelClaims` and
:class:`~dra_driver.plugin.backend.BackgroundWork` (started once publishing
runs; its changes republish at once).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import grpc

from dra_driver.plugin._proto import pluginregistration_pb2_grpc
from dra_driver.plugin.backend import (
    BackgroundWork,
    DeviceBackend,
    DeviceHealth,
    HealthReporter,
    StatusReporter,
)
from dra_driver.plugin.claimbook import ClaimActivity, ClaimKeeper, ClaimUsage, PreparedClaimBook
from dra_driver.plugin.claimstatus import ClaimStatusWriter, DeviceStatusReporter
from dra_driver.plugin.cleanup import StaleClaimCleaner
from dra_driver.plugin.health import HealthHub, add_health_services
from dra_driver.plugin.kubeclient import KubeClient
from dra_driver.plugin.preparing import ClaimService, add_node_services, start_every_thread
from dra_driver.plugin.publishing import SlicePublisher
from dra_driver.plugin.registration import (
    RegistrationServicer,
    RegistrationState,
    supported_versions,
)
from dra_driver.plugin.settings import PluginSettings, Readiness
from dra_driver.plugin.slices import validate_names
from dra_driver.plugin.sockets import (
    FileLock,
    SocketPaths,
    remove_stale_socket,
    secure_and_place,
    socket_paths,
    staging_dir,
)

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from dra_driver.plugin.metrics import PluginMetrics


class KubeletPlugin:
    def __init__(
        self,
        *,
        settings: PluginSettings,
        backend: DeviceBackend | None,
        logger: logging.Logger,
        environ: Mapping[str, str] | None = None,
        client: KubeClient | None = None,
        registry: CollectorRegistry | None = None,
        on_fatal: Callable[[str], None] | None = None,
        waiting_for: str = "the backend",
    ) -> None:
        """Builds every component (nothing runs until :meth:`serve` / :meth:`start`).

        ``environ`` is only read for in-cluster config; ``client`` overrides both (its
        :meth:`~dra_driver.plugin.kubeclient.KubeClient.connect` runs in :meth:`start`).
        ``registry``: where the plugin's metrics go (see :mod:`dra_driver.plugin.metrics`);
        None keeps none, or gives them later (:meth:`add_metrics`). ``on_fatal`` is
        called (from the failing thread) when a background thread dies; :meth:`readiness`
        reports it too, so ``/healthz`` fails. ``backend`` None: given by :meth:`attach`
        before :meth:`start`; meanwhile claim calls wait for it and readiness names
        ``waiting_for``."""
        validate_names(settings.driver_name, settings.node_name)
        s = self.settings = settings
        self.metrics: PluginMetrics | None = None
        self._backend: DeviceBackend | None = None
        self._waiting_for = waiting_for
        self._log = logger
        self._environ = dict(environ or {})
        self._on_fatal = on_fatal
        self._fatal = ""
        self._serving = False
        self._started = False
        self.paths: SocketPaths = socket_paths(
            driver=settings.driver_name,
            registry_dir=settings.registry_dir,
            plugins_dir=settings.plugins_dir,
            rolling_update_uid=settings.rolling_update_uid,
        )
        self._registration = RegistrationState()
        client = self._client = client or self._make_client()
        book = self.claims = PreparedClaimBook(
            driver_name=s.driver_name,
            pool_name=s.node_name,
            get_claim=client.get_resource_claim,
            logger=logger,
        )
        """Claims prepared on this node with their devices and pods."""
        status = None
        if s.claim_status:
            status = ClaimStatusWriter(
                driver_name=s.driver_name,
                apply=lambda ns, name, body: client.apply_resource_claim_status(
                    ns, name, body, field_manager=s.driver_name
                ),
                reporter=None,
                logger=logger,
                node_name=s.node_name,
            )
        self._status = status
        self._keeper = ClaimKeeper(
            book=book,
            prepared=lambda: self._need().prepared_claims(),
            status=status,
            interval_s=s.claim_refresh_interval_s,
            logger=logger,
        )
        self._events = ClaimActivity(
            logger=logger, status=status, book=book, changed=self._keeper.trigger
        )
        self._service = ClaimService(
            driver_name=s.driver_name,
            pool_name=s.node_name,
            backend=None,
            get_claim=client.get_resource_claim,
            lock_file=FileLock(self.paths.lock) if s.rolling_update_uid else None,
            logger=logger,
            parallel=False if s.serialize_claims else None,
            events=self._events,
            waiting_for=waiting_for,
        )
        self._hub = HealthHub(
            source=self._device_health, interval_s=s.health_interval_s, logger=logger
        )
        self._workers = ThreadPoolExecutor(max_workers=s.grpc_workers, thread_name_prefix="grpc")
        self._server = self._grpc_server(self._workers)
        self._publisher = SlicePublisher(
            client=client,
            driver_name=s.driver_name,
            node_name=s.node_name,
            pool_source=lambda: self._need().pool(),
            logger=logger,
            resync_interval_s=s.resync_interval_s,
            on_fatal=self._fail,
        )
        self._cleaner = StaleClaimCleaner(
            prepared=lambda: self._need().prepared_claims(),
            get_claim=client.get_resource_claim,
            service=self._service,
            interval_s=s.cleanup_interval_s,
            logger=logger,
        )
        if registry is not None:
            self.add_metrics(registry)
        if backend is not None:
            self.attach(backend)

    def attach(self, backend: DeviceBackend) -> None:
        """The backend, once, before :meth:`start` (claim calls waiting for it go on)."""
        if self._backend is not None:
            raise ValueError("the plugin already has a backend")
        self._backend = backend
        if self._status is not None and isinstance(backend, DeviceStatusReporter):
            self._status.reporter = backend
        self._service.attach(backend)

    def start_failed(self, reason: str) -> None:
        """The backend cannot be built: claim calls waiting for it fail now, naming why."""
        self._service.start_failed(reason)

    def _need(self) -> DeviceBackend:
        if self._backend is None:
            raise ValueError("no backend: attach() one before start()")
        return self._backend

    # -- wiring ----------------------------------------------------------------

    def _make_client(self) -> KubeClient:
        """Not connected yet (that imports the library: after :meth:`serve`). Its pool
        holds a connection for every gRPC worker (each may GET a claim at once) and for
        the background threads (publisher, watch, claim keeper, cleaner)."""
        s = self.settings
        timeout, size = s.api_timeout_s, s.grpc_workers + 4
        if s.kubeconfig is not None:
            return KubeClient.from_kubeconfig(
                str(s.kubeconfig), s.kube_context, timeout_s=timeout, pool_size=size
            )
        return KubeClient.in_cluster(self._environ, timeout_s=timeout, pool_size=size)

    @property
    def client(self) -> KubeClient:
        return self._client

    def _device_health(self) -> list[DeviceHealth]:
        if self._backend is None:
            return []
        if isinstance(self._backend, HealthReporter):
            return self._backend.device_health()
        pool = self.settings.node_name
        return [DeviceHealth(pool, d.name, "Healthy") for d in self._backend.pool().devices]

    def _grpc_server(self, workers: ThreadPoolExecutor) -> Any:
        s = self.settings
        server = grpc.server(workers)
        add_node_services(server, self._service)
        if s.serve_health:
            add_health_services(server, self._hub)
        pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(
            RegistrationServicer(
                driver_name=s.driver_name,
                endpoint=str(self.paths.dra),
                versions=supported_versions(health=s.serve_health),
                state=self._registration,
                logger=self._log,
            ),
            server,
        )
        return server

    def _fail(self, reason: str) -> None:
        """A background thread died: not alive any more (``/healthz``), and tell the owner."""
        if not self._fatal:
            self._fatal = reason
        if self._on_fatal is not None:
            self._on_fatal(reason)

    def serve(self) -> None:
        """Bind both sockets and answer the kubelet; raises if they cannot be set up.

        The backend is not called here, so a driver that is still discovering its
        devices can already be found by the kubelet (see :meth:`start`)."""
        if self._serving:
            return
        s = self.settings
        self.paths.plugin_dir.mkdir(parents=True, exist_ok=True, mode=0o750)
        s.registry_dir.mkdir(parents=True, exist_ok=True)
        for path in (self.paths.registration, self.paths.dra):
            if remove_stale_socket(path):
                self._log.info("removed stale socket %s", path)
        # Bind both sockets in private staging dirs, then move them into place:
        # the DRA socket first, so the kubelet never finds a registration socket
        # whose endpoint does not exist yet.
        with staging_dir(self.paths.plugin_dir) as dra_tmp, staging_dir(s.registry_dir) as reg_tmp:
            self._server.add_insecure_port(f"unix:{dra_tmp / 'dra.sock'}")
            self._server.add_insecure_port(f"unix:{reg_tmp / 'reg.sock'}")
            start_every_thread(self._workers, s.grpc_workers)
            self._server.start()
            self._serving = True
            secure_and_place(dra_tmp / "dra.sock", self.paths.dra, group=s.socket_group)
            secure_and_place(reg_tmp / "reg.sock", self.paths.registration, group=s.socket_group)
        self._log.info(
            "serving DRA plugin %s: registration %s, endpoint %s",
            s.driver_name,
            self.paths.registration,
            self.paths.dra,
        )

    def add_metrics(self, registry: CollectorRegistry) -> None:
        """Count into ``registry`` from now on (see :mod:`dra_driver.plugin.metrics`); once.

        For a caller that serves first: outcomes before this call are not counted; the
        state gauges (prepared claims, device health) are read at scrape time anyway."""
        from dra_driver.plugin.metrics import PluginMetrics

        if self.metrics is not None:
            raise ValueError("the plugin already has metrics")
        metrics = self.metrics = PluginMetrics(registry)
        self._events.metrics = metrics.operations
        self._publisher.metrics = metrics.publish
        if self._started:
            self._watch_state(metrics)

    def _watch_state(self, metrics: PluginMetrics) -> None:
        book = self.claims
        metrics.watch_state(
            health=self._hub.current,
            pool=lambda: self._need().pool(),
            prepared_claims=lambda: sum(1 for _ in self._need().prepared_claims()),
            prepared_devices=lambda: sum(len(c.devices) for c in book.claims()),
        )

    def start(self) -> None:
        """:meth:`serve` (if not yet), then publish slices, clean up stale claims, keep
        the prepared claims' status and start the backend's background work."""
        backend = self._need()
        self.serve()
        self._client.connect()  # if not done yet: bad credentials fail the start here
        self._started = True
        if self.metrics is not None:
            self._watch_state(self.metrics)
        self._publisher.start()
        self._cleaner.start()
        self._keeper.start()
        if isinstance(backend, ClaimUsage):
            backend.watch_claims(self.claims.claims)
        if isinstance(backend, BackgroundWork):
            backend.start_background(self.republish)
        self.notify_health_changed()

    def stop(self, *, uninstall: bool = False, grace_s: float = 5.0) -> None:
        """Deregister and stop. Slices are kept (the next instance takes them over)
        unless ``uninstall`` is true. Safe to call whether or not :meth:`start` ran."""
        remove_stale_socket(self.paths.registration)  # deregisters from the kubelet
        backend = self._backend
        if backend is not None and isinstance(backend, BackgroundWork):
            backend.stop_background()
        self._cleaner.stop()
        self._keeper.stop()
        self._hub.close()
        if self._serving:
            self._server.stop(grace_s).wait()
            self._serving = False
        remove_stale_socket(self.paths.dra)
        self._publisher.stop()
        if uninstall:
            self._publisher.delete_all()
        self._service.close()
        self._client.close()
        self._log.info("stopped DRA plugin %s (uninstall=%s)", self.settings.driver_name, uninstall)

    def republish(self) -> None:
        """The backend's pool changed: re-publish slices, refresh health now, and bring
        the prepared claims' status conditions up to date."""
        self._publisher.trigger()
        self.notify_health_changed()
        self._keeper.trigger()

    def notify_health_changed(self) -> None:
        self._hub.notify_changed()

    def readiness(self) -> Readiness:
        status = self._registration.status
        if self._backend is None:
            problems = [f"starting: {self._waiting_for}"]
        elif isinstance(self._backend, StatusReporter):
            problems = self._backend.problems()
        else:
            problems = []
        return Readiness(
            serving=self._serving,
            registered=bool(status and status.registered),
            registration_error=status.error if status else "",
            publish=self._publisher.status,
            devices=tuple(self._hub.current()),
            fatal=self._fatal,
            backend_problems=tuple(problems),
        )

    @property
    def publisher(self) -> SlicePublisher:
        return self._publisher

    @property
    def cleaner(self) -> StaleClaimCleaner:
        return self._cleaner
