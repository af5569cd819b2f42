"""The control plane's command lines: what etcd, kube-apiserver, kube-scheduler and
kube-controller-manager run with, and why each unusual flag is there. Pure functions
but for writing the scheduler's configuration file;
:class:`~dra_driver.devcluster.cluster.Cluster` starts the processes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from dra_driver.devcluster.binaries import Binaries
from dra_driver.devcluster.certs import ClusterCerts
from dra_driver.devcluster.schedconfig import SchedulerConfig

DRA_CONTROLLERS: tuple[str, ...] = (
    "resourceclaim-controller",
    "device-taint-eviction-controller",
    "garbage-collector-controller",
    # Pods get projected ServiceAccount tokens (ServiceAccount admission is on):
    # every namespace needs its "default" account and the kube-root-ca.crt map.
    "serviceaccount-controller",
    "root-ca-certificate-publisher-controller",
    # The chart's DaemonSet runs its plugin pod on real nodes.
    "daemonset-controller",
    # ResourceQuota admission refuses objects until this controller has filled in a
    # quota's status; batch Jobs (Kueue's gang admission) need their controller.
    "resourcequota-controller",
    "job-controller",
)
"""kube-controller-manager controller names (``--controllers``) that DRA relies on."""

SERVICE_CIDR = "10.0.0.0/24"


@dataclass(frozen=True)
class ClusterOptions:
    """Knobs that change what the components run with; defaults are upstream defaults."""

    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    runtime_config: Mapping[str, str] = field(default_factory=dict)
    controllers: tuple[str, ...] = DRA_CONTROLLERS
    start_timeout: float = 120.0
    verbosity: int = 2
    client_qps: int | None = None
    """``--kube-api-qps`` of kube-scheduler and kube-controller-manager; None keeps
    their defaults (50 and 20). Each DRA pod costs them a claim status write, a
    binding and an event, so the default caps a busy cluster (docs/scale.md)."""
    client_burst: int | None = None
    """``--kube-api-burst`` of both; None keeps their defaults (100 and 30)."""
    profiling: bool = False
    """Serve ``/debug/pprof`` on every component (heap profiles of a fleet run: what the
    control plane holds per node); the scheduler's and controller manager's without
    authentication, as their health endpoints are. Off by default, as upstream advises."""
    scheduler_config: SchedulerConfig | None = None
    """kube-scheduler's ``--config`` (profiles, score weights); None runs its defaults.
    The cluster writes :meth:`SchedulerConfig.effective`: the client settings above go
    into the file, since kube-scheduler ignores their flags with ``--config``."""

    def profiling_args(self, *, delegated: bool, allow: Sequence[str] = ()) -> list[str]:
        """``--profiling``, and for the delegated-auth components the paths served without
        authorization: pprof when profiling, plus ``allow``."""
        args = [f"--profiling={str(self.profiling).lower()}"]
        paths = [*(["/debug/pprof/*"] if self.profiling else []), *allow]
        if paths and delegated:
            always = ",".join(["/healthz", "/readyz", "/livez", *paths])
            args.append(f"--authorization-always-allow-paths={always}")
        return args

    def client_args(self) -> list[str]:
        """The client rate-limit flags both API clients of the control plane get."""
        args: list[str] = []
        if self.client_qps is not None:
            args.append(f"--kube-api-qps={self.client_qps}")
        if self.client_burst is not None:
            args.append(f"--kube-api-burst={self.client_burst}")
        return args

    def gate_args(self) -> list[str]:
        gates = ",".join(f"{k}={str(v).lower()}" for k, v in sorted(self.feature_gates.items()))
        return [f"--feature-gates={gates}"] if gates else []


def etcd_argv(binaries: Binaries, data_dir: Path, client_port: int, peer_port: int) -> list[str]:
    etcd_url = f"http://127.0.0.1:{client_port}"
    peer_url = f"http://127.0.0.1:{peer_port}"
    return [
        str(binaries.etcd),
        "--name=default",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={etcd_url}",
        f"--advertise-client-urls={etcd_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=default={peer_url}",
        "--unsafe-no-fsync=true",
    ]


def apiserver_argv(
    binaries: Binaries,
    options: ClusterOptions,
    certs: ClusterCerts,
    *,
    etcd_url: str,
    port: int,
    cert_dir: Path,
) -> list[str]:
    server = f"https://127.0.0.1:{port}"
    disabled_admission = ["TaintNodesByCondition"]
    if "serviceaccount-controller" not in options.controllers:
        disabled_admission.insert(0, "ServiceAccount")
    runtime_config = ",".join(f"{k}={v}" for k, v in sorted(options.runtime_config.items()))
    return [
        str(binaries.kube_apiserver),
        f"--etcd-servers={etcd_url}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={cert_dir}",
        f"--tls-cert-file={certs.serving_cert}",
        f"--tls-private-key-file={certs.serving_key}",
        f"--client-ca-file={certs.ca_cert}",
        f"--service-account-issuer={server}",
        f"--service-account-key-file={certs.sa_public_key}",
        f"--service-account-signing-key-file={certs.sa_private_key}",
        "--authorization-mode=Node,RBAC",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allow-privileged=true",
        # TaintNodesByCondition: it would put not-ready taints on new
        # Nodes that only the (absent) node-lifecycle controller removes.
        # ServiceAccount (projected tokens in pods) only when its controller
        # runs: without it no namespace gets a "default" account.
        f"--disable-admission-plugins={','.join(disabled_admission)}",
        # No lease reconciler: it refuses the loopback advertise address.
        "--endpoint-reconciler-type=none",
        *options.profiling_args(delegated=False),
        f"--v={options.verbosity}",
        *options.gate_args(),
        *([f"--runtime-config={runtime_config}"] if runtime_config else []),
    ]


def _serving(
    options: ClusterOptions, certs: ClusterCerts, kubeconfig: Path, config: Path | None = None
) -> list[str]:
    # With --config, kube-scheduler ignores --kubeconfig, the client and the profiling
    # flags: the file carries them (SchedulerConfig.effective). Its /configz is then
    # served as /healthz is, so that a run can show the configuration in force.
    client = (
        [f"--config={config}"]
        if config is not None
        else [f"--kubeconfig={kubeconfig}", *options.client_args()]
    )
    allow = ("/configz",) if config is not None else ()
    return [
        "--bind-address=127.0.0.1",
        f"--tls-cert-file={certs.serving_cert}",
        f"--tls-private-key-file={certs.serving_key}",
        *client,
        "--leader-elect=false",
        f"--v={options.verbosity}",
        *options.gate_args(),
        *options.profiling_args(delegated=True, allow=allow),
    ]


def scheduler_argv(
    binaries: Binaries,
    options: ClusterOptions,
    certs: ClusterCerts,
    kubeconfig: Path,
    port: int,
    config: Path | None = None,
) -> list[str]:
    """``config``: the written :meth:`SchedulerConfig.effective` of
    ``options.scheduler_config``, when there is one."""
    return [
        str(binaries.kube_scheduler),
        f"--secure-port={port}",
        *_serving(options, certs, kubeconfig, config),
    ]


def write_scheduler_config(options: ClusterOptions, workdir: Path, kubeconfig: Path) -> Path | None:
    """Write ``options.scheduler_config`` with the cluster's client settings for
    ``--config`` (owner-only: it names the admin kubeconfig); None without one."""
    if options.scheduler_config is None:
        return None
    path = workdir / "kube-scheduler-config.yaml"
    doc = options.scheduler_config.effective(
        kubeconfig, qps=options.client_qps, burst=options.client_burst, profiling=options.profiling
    )
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    path.chmod(0o600)
    return path


def controller_manager_argv(
    binaries: Binaries, options: ClusterOptions, certs: ClusterCerts, kubeconfig: Path, port: int
) -> list[str]:
    controllers: Sequence[str] = options.controllers
    return [
        str(binaries.kube_controller_manager),
        f"--secure-port={port}",
        *_serving(options, certs, kubeconfig),
        "--use-service-account-credentials=false",
        f"--root-ca-file={certs.ca_cert}",
        f"--controllers={','.join(controllers)}",
    ]
