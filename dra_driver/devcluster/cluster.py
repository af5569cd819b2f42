"""A real, throwaway Kubernetes control plane on loopback, for tests and demos.

etcd, kube-apiserver, kube-scheduler and kube-controller-manager run as child
processes on free 127.0.0.1 ports with per-run certificates. There are no
kubelets: :meth:`Cluster.create_node` makes Ready Node objects by hand, which
is all the scheduler needs to allocate ResourceClaims and bind pods. The
controller-manager runs only the controllers DRA needs and never the
node-lifecycle controller (it would taint the heartbeat-less nodes).
"""

from __future__ import annotations

import datetime
import logging
import shutil
import ssl
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, overload

from dra_driver.devcluster.api import ApiError, JsonObject, ToolClient, api_client
from dra_driver.devcluster.binaries import Binaries
from dra_driver.devcluster.certs import ClusterCerts, generate_certs
from dra_driver.devcluster.controlplane import (
    ClusterOptions,
    apiserver_argv,
    controller_manager_argv,
    etcd_argv,
    scheduler_argv,
    write_scheduler_config,
)
from dra_driver.devcluster.kubeconfig import write_kubeconfig
from dra_driver.devcluster.processes import Component, ComponentError, free_loopback_ports, http_ok

if TYPE_CHECKING:
    import kubernetes.client

logger = logging.getLogger(__name__)

FIELD_MANAGER = "dra-driver-devcluster"


@dataclass(frozen=True)
class StartupTimes:
    """Seconds from launching each process until it reported healthy."""

    etcd: float
    apiserver: float
    scheduler: float
    controller_manager: float
    total: float


class Cluster:
    """One control plane. Use as a context manager, or call :meth:`start`/:meth:`stop`.

    Public attributes other code relies on: ``kubeconfig`` (admin), ``server``,
    ``ca_file``, ``workdir``, ``rest`` (a :class:`ToolClient` as admin, over the
    ``kubernetes`` library).
    """

    def __init__(
        self, binaries: Binaries, workdir: Path, options: ClusterOptions | None = None
    ) -> None:
        self.binaries = binaries
        self.workdir = workdir
        self.options = options or ClusterOptions()
        self.log_dir = workdir / "logs"
        self.kubeconfig = workdir / "admin.kubeconfig"
        self._certs: ClusterCerts | None = None
        self._rest: ToolClient | None = None
        self._ssl: ssl.SSLContext | None = None
        self._ports: dict[str, int] = {}
        self._components: list[Component] = []
        self.server = ""
        self.startup_times: StartupTimes | None = None

    # -- lifecycle ---------------------------------------------------------

    @property
    def certs(self) -> ClusterCerts:
        if self._certs is None:
            raise RuntimeError("cluster not started")
        return self._certs

    @property
    def ca_file(self) -> Path:
        return self.certs.ca_cert

    @property
    def rest(self) -> ToolClient:
        if self._rest is None:
            raise RuntimeError("cluster not started")
        return self._rest

    @property
    def components(self) -> Sequence[Component]:
        return tuple(self._components)

    def start(self) -> StartupTimes:
        """Start all components and wait until each is healthy; stops all on failure."""
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> StartupTimes:
        begin = time.monotonic()
        deadline = begin + self.options.start_timeout
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(exist_ok=True)
        certs = self._certs = generate_certs(self.workdir / "pki")
        etcd_client, etcd_peer, api_port, sched_port, kcm_port = free_loopback_ports(5)
        self._ports = {
            "kube-apiserver": api_port,
            "kube-scheduler": sched_port,
            "kube-controller-manager": kcm_port,
        }
        self.server = f"https://127.0.0.1:{api_port}"
        etcd_url = f"http://127.0.0.1:{etcd_client}"
        etcd = self._component(
            "etcd", etcd_argv(self.binaries, self.workdir / "etcd-data", etcd_client, etcd_peer)
        )
        etcd_s = etcd.wait_healthy(lambda: self._etcd_healthy(etcd_url), deadline)
        apiserver = self._component(
            "kube-apiserver",
            apiserver_argv(
                self.binaries, self.options, certs, etcd_url=etcd_url, port=api_port,
                cert_dir=self.workdir / "apiserver-certs",
            ),
        )  # fmt: skip
        self._rest = ToolClient(
            api_client(
                self.server, certs.ca_cert, cert_file=certs.admin_cert, key_file=certs.admin_key
            )
        )
        self._ssl = ssl.create_default_context(cafile=str(certs.ca_cert))
        self._ssl.load_cert_chain(str(certs.admin_cert), str(certs.admin_key))
        api_s = apiserver.wait_healthy(lambda: self._apiserver_ready(), deadline)
        write_kubeconfig(
            self.kubeconfig,
            server=self.server,
            ca_file=certs.ca_cert,
            user="admin",
            cert_file=certs.admin_cert,
            key_file=certs.admin_key,
        )

        scheduler = self._component(
            "kube-scheduler",
            scheduler_argv(
                self.binaries, self.options, certs, self.kubeconfig, sched_port,
                write_scheduler_config(self.options, self.workdir, self.kubeconfig),
            ),
        )  # fmt: skip
        kcm = self._component(
            "kube-controller-manager",
            controller_manager_argv(self.binaries, self.options, certs, self.kubeconfig, kcm_port),
        )
        sched_s = scheduler.wait_healthy(lambda: self._https_ok(sched_port, "/readyz"), deadline)
        kcm_s = kcm.wait_healthy(lambda: self._https_ok(kcm_port, "/healthz"), deadline)
        if "serviceaccount-controller" in self.options.controllers:
            self.wait_default_service_account("default", max(1.0, deadline - time.monotonic()))
        self.startup_times = StartupTimes(
            etcd=etcd_s,
            apiserver=api_s,
            scheduler=sched_s,
            controller_manager=kcm_s,
            total=time.monotonic() - begin,
        )
        logger.info(
            "control plane ready",
            extra={"server": self.server, "seconds": round(self.startup_times.total, 2)},
        )
        return self.startup_times

    def _component(self, name: str, argv: list[str]) -> Component:
        component = Component(name, argv, self.log_dir)
        self._components.append(component)
        component.start()
        return component

    @staticmethod
    def _etcd_healthy(url: str) -> tuple[bool, str]:
        ok, body = http_ok(f"{url}/health", None)
        return ok and '"true"' in body, body

    def _apiserver_ready(self) -> tuple[bool, str]:
        return http_ok(f"{self.server}/readyz", self._ssl)

    def _https_ok(self, port: int, path: str) -> tuple[bool, str]:
        return http_ok(f"https://127.0.0.1:{port}{path}", self._ssl)

    def fetch(self, component: str, path: str, timeout: float = 60.0) -> bytes:
        """GET ``path`` on a running component's secure port as the cluster's admin: the
        raw body of what is not an API object (``/metrics``, ``/debug/pprof/...``)."""
        url = f"https://127.0.0.1:{self._ports[component]}{path}"
        with urllib.request.urlopen(url, timeout=timeout, context=self._ssl) as resp:
            return bytes(resp.read())

    def heap_profile(self, component: str, timeout: float = 60.0) -> bytes:
        """``/debug/pprof/heap`` of a running component (``ClusterOptions(profiling=True)``):
        the gzipped pprof protobuf ``go tool pprof`` reads, after a forced GC."""
        return self.fetch(component, "/debug/pprof/heap?gc=1", timeout)

    def stop(self) -> None:
        """Stop every component (newest first) by PID; drop etcd data, keep logs."""
        for component in reversed(self._components):
            component.stop()
        self._components.clear()
        shutil.rmtree(self.workdir / "etcd-data", ignore_errors=True)

    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def check_running(self) -> None:
        """Raise with the log tail if any component died since start."""
        dead = [c for c in self._components if not c.running()]
        if dead:
            raise ComponentError(
                "control-plane component(s) died: "
                + ", ".join(c.name for c in dead)
                + "\n"
                + "\n".join(c.log_tail() for c in dead)
            )

    def log_tails(self, lines: int = 40) -> str:
        """The end of every component's log, for failure reports."""
        return "\n".join(c.log_tail(lines) for c in self._components)

    # -- helpers for tests -------------------------------------------------

    @overload
    def apply(self, objs: Mapping[str, Any]) -> JsonObject: ...

    @overload
    def apply(self, objs: Sequence[Mapping[str, Any]]) -> list[JsonObject]: ...

    def apply(
        self, objs: Mapping[str, Any] | Sequence[Mapping[str, Any]]
    ) -> JsonObject | list[JsonObject]:
        """Server-side apply plain-dict objects as admin, in order; returns the stored objects.

        After a Namespace, waits for its ``default`` ServiceAccount: ServiceAccount
        admission refuses pods in it until the controller has made one.
        """
        if isinstance(objs, Mapping):
            return self._apply_one(objs)
        return [self._apply_one(obj) for obj in objs]

    def _apply_one(self, obj: Mapping[str, Any]) -> JsonObject:
        stored = self.rest.apply(obj, FIELD_MANAGER)
        namespace = obj.get("kind") == "Namespace" and obj.get("apiVersion") == "v1"
        if namespace and "serviceaccount-controller" in self.options.controllers:
            self.wait_default_service_account(stored["metadata"]["name"])
        return stored

    def create_namespace(self, name: str) -> JsonObject:
        """Create (or keep) a namespace whose pods can be admitted."""
        return self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    def wait_default_service_account(self, namespace: str, timeout: float = 30.0) -> None:
        def exists() -> bool:
            try:
                self.rest.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
            except ApiError as err:
                if err.status == 404:
                    return False
                raise
            return True

        deadline = time.monotonic() + timeout
        while not exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"namespace {namespace} got no default ServiceAccount")
            time.sleep(0.1)

    def create_node(
        self,
        name: str,
        labels: Mapping[str, str] | None = None,
        capacity: Mapping[str, str] | None = None,
    ) -> JsonObject:
        """A Ready, untainted Node with capacity, so the scheduler binds pods to it.

        No kubelet backs it: pods bound here stay Pending, which is all the
        scheduling tier needs.
        """
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        resources = dict(capacity or {"cpu": "16", "memory": "64Gi", "pods": "110"})
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {"kubernetes.io/hostname": name, **(labels or {})},
            },
            "spec": {},
            "status": {
                "capacity": resources,
                "allocatable": resources,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "HandMade",
                        "message": "created by dra_driver.devcluster; no kubelet",
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": now,
                    }
                ],
            },
        }
        created = self.rest.create("/api/v1/nodes", node)
        if created.get("spec", {}).get("taints"):
            raise RuntimeError(f"node {name} got taints on creation: {created['spec']['taints']}")
        if not created.get("status", {}).get("conditions"):
            # Defensive: should the apiserver ever drop status on create.
            created = self.rest.merge_patch(
                f"/api/v1/nodes/{name}/status", {"status": node["status"]}
            )
        return created

    def service_account_kubeconfig(
        self, namespace: str, name: str, expiration_seconds: int = 24 * 3600
    ) -> Path:
        """Kubeconfig that acts as ServiceAccount ``namespace/name`` (created if missing).

        The token comes from the TokenRequest API, exactly as a projected
        token in a real pod would, so RBAC is enforced as in production.
        """
        self.create_namespace(namespace)
        self.apply(
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": name, "namespace": namespace},
            }
        )
        answer = self.rest.create(
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": expiration_seconds},
            },
        )
        token = answer.get("status", {}).get("token")
        if not isinstance(token, str) or not token:
            raise ApiError("POST", "serviceaccounts/token", 200, f"no token in answer: {answer}")
        directory = self.workdir / "kubeconfigs"
        directory.mkdir(exist_ok=True)
        return write_kubeconfig(
            directory / f"sa-{namespace}-{name}.kubeconfig",
            server=self.server,
            ca_file=self.ca_file,
            user=f"system:serviceaccount:{namespace}:{name}",
            token=token,
        )

    def api_client(self, kubeconfig: Path | None = None) -> kubernetes.client.ApiClient:
        """A typed ``kubernetes`` client (admin unless another kubeconfig is given)."""
        import kubernetes.config  # heavy; only tests and tools need it

        client: kubernetes.client.ApiClient = kubernetes.config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig or self.kubeconfig)
        )
        return client
