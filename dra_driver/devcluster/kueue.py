"""Kueue on the dev cluster: its controller manager with its own CRDs and admission
webhooks, so GPU Jobs can be queued and admitted as gangs against our DeviceClasses.

The manager, the CRDs and the webhook configurations all come from one pinned Kueue
release (``scripts/build-kueue.sh`` builds ``tests/go/kueue`` and copies the CRDs and
webhook manifests of that module version next to the binary). Kueue runs as a host
process on loopback, as the admin, with a Configuration written here:

* its webhook server listens on ``127.0.0.1`` with a serving certificate from the
  run's CA (:func:`~dra_driver.devcluster.certs.issue_serving_cert`), and the webhook
  configurations call it by URL with that CA as ``caBundle`` (no Service: nothing
  here routes Service addresses for the API server);
* Kueue's own certificate management is off, and with it off Kueue reads its metrics
  certificate from the fixed path ``/etc/kueue/metrics/certs``: the process gets a
  private mount namespace where ``/etc`` is an overlay holding that certificate, so
  the host's ``/etc`` is never written;
* only the webhooks of Kueue's own kinds and of ``batch/v1`` Jobs (the one integration
  enabled) are installed, the Job ones limited to namespaces with
  ``namespace_selector``, and they are deleted again at :meth:`Kueue.stop`: a webhook
  whose server is gone fails every request it covers.
"""

from __future__ import annotations

import base64
import os
import shlex
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from dra_driver.devcluster.api import ApiError, JsonObject
from dra_driver.devcluster.certs import issue_serving_cert
from dra_driver.devcluster.processes import Component, free_loopback_ports, http_ok
from dra_driver.devcluster.wait import wait_until

if TYPE_CHECKING:
    from dra_driver.devcluster.cluster import Cluster

KUEUE_API = "/apis/kueue.x-k8s.io/v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
"""The label that puts a Job in a LocalQueue."""

_OWN_GROUPS = {"kueue.x-k8s.io"}
_JOB_GROUPS = {"batch"}
_METRICS_CERTS = "kueue/metrics/certs"
"""Below /etc: where Kueue reads its metrics certificate when it manages none itself."""


class KueueError(RuntimeError):
    """Kueue could not be built, installed or started (the message says why)."""


@dataclass(frozen=True)
class KueueBuild:
    """What scripts/build-kueue.sh produced: the manager, CRDs and webhook manifests."""

    binary: Path
    crds: tuple[Path, ...]
    webhooks: Path

    @classmethod
    def find(cls, repo: Path) -> KueueBuild:
        """Build (or reuse the cached build of) the pinned Kueue release."""
        done = subprocess.run([str(repo / "scripts" / "build-kueue.sh")], cwd=repo,
                              capture_output=True, text=True, check=False)  # fmt: skip
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            raise KueueError(f"scripts/build-kueue.sh failed ({done.returncode}):\n{done.stderr}")
        root = Path(lines[-1])
        return cls(root / "bin" / "kueue", tuple(sorted((root / "crds").glob("*.yaml"))),
                   root / "webhook.yaml")  # fmt: skip


def webhook_configurations(
    manifests: Sequence[Mapping[str, Any]],
    *,
    url: str,
    ca_bundle: bytes,
    prefix: str,
    namespace_selector: Mapping[str, Any],
) -> list[JsonObject]:
    """Kueue's webhook configurations, kept to its own kinds and batch Jobs, pointed at
    ``url`` (a loopback address) instead of its Service."""
    out: list[JsonObject] = []
    for manifest in manifests:
        kept = []
        for hook in manifest.get("webhooks") or []:
            groups = {g for rule in hook.get("rules") or [] for g in rule.get("apiGroups") or []}
            if not groups or not groups <= _OWN_GROUPS | _JOB_GROUPS:
                continue
            hook = dict(hook)
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": url + path,
                                    "caBundle": base64.b64encode(ca_bundle).decode()}  # fmt: skip
            if groups <= _JOB_GROUPS:
                hook["namespaceSelector"] = dict(namespace_selector)
            kept.append(hook)
        if kept:
            meta = {"name": f"{prefix}-{manifest['metadata']['name']}"}
            out.append({"apiVersion": manifest["apiVersion"], "kind": manifest["kind"],
                        "metadata": meta, "webhooks": kept})  # fmt: skip
    return out


class Kueue:
    """Kueue's controller manager for one dev cluster (start, then stop)."""

    def __init__(
        self,
        *,
        cluster: Cluster,
        build: KueueBuild,
        workdir: Path,
        device_class_mappings: Sequence[Mapping[str, Any]] = (),
        namespace_selector: Mapping[str, Any] | None = None,
        feature_gates: Mapping[str, bool] | None = None,
    ) -> None:
        """``device_class_mappings``: Kueue's ``resources.deviceClassMappings`` (DRA
        device classes counted as a quota resource); ``namespace_selector``: where the
        Job webhooks apply (all namespaces by default)."""
        self.cluster = cluster
        self.build = build
        self.workdir = workdir
        self.mappings = [dict(m) for m in device_class_mappings]
        self.namespace_selector = dict(namespace_selector or {})
        # The visibility API server would need its own APIService; nothing here uses it.
        self.feature_gates = {"VisibilityOnDemand": False, **(feature_gates or {})}
        self.prefix = f"kueue-{os.getpid()}-{workdir.name}"[:50].rstrip("-").lower()
        self._webhooks: list[JsonObject] = []
        self._component: Component | None = None
        self.health_port = 0

    def start(self, timeout: float = 120.0) -> None:
        """Install the CRDs, start the manager, wait until ready, install the webhooks."""
        deadline = time.monotonic() + timeout
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.install_crds(deadline)
        self.cluster.create_namespace("kueue-system")
        webhook_port, self.health_port, metrics_port = free_loopback_ports(3)
        config = self._write_config(webhook_port, metrics_port)
        gates = ",".join(f"{k}={str(v).lower()}" for k, v in sorted(self.feature_gates.items()))
        env = {**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig)}
        self._component = Component("kueue", self._argv(config, gates), self.workdir, env=env)
        self._component.start()
        self._component.wait_healthy(
            lambda: http_ok(f"http://127.0.0.1:{self.health_port}/readyz", None), deadline
        )
        manifests = [d for d in yaml.safe_load_all(self.build.webhooks.read_text()) if d]
        self._webhooks = webhook_configurations(
            manifests, url=f"https://127.0.0.1:{webhook_port}",
            ca_bundle=self.cluster.ca_file.read_bytes(), prefix=self.prefix,
            namespace_selector=self.namespace_selector,
        )  # fmt: skip
        self.cluster.apply(self._webhooks)

    def install_crds(self, deadline: float) -> None:
        """Kueue's CRDs from its release, applied and Established."""
        names = []
        for path in self.build.crds:
            for crd in yaml.safe_load_all(path.read_text()):
                if crd:
                    names.append(self.cluster.apply(crd)["metadata"]["name"])

        def established() -> bool:
            for name in names:
                crd = self.cluster.rest.get(
                    f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
                )
                conditions = (crd.get("status") or {}).get("conditions") or []
                if not any(c["type"] == "Established" and c["status"] == "True"
                           for c in conditions):  # fmt: skip
                    return False
            return True

        wait_until(established, timeout=max(1.0, deadline - time.monotonic()),
                   what="Kueue's CRDs established")  # fmt: skip

    def _write_config(self, webhook_port: int, metrics_port: int) -> Path:
        certs = self.workdir / "webhook-certs"
        cert, key = issue_serving_cert(self.cluster.certs, certs, "kueue-webhook")
        cert.rename(certs / "tls.crt")
        key.rename(certs / "tls.key")
        metrics = self.workdir / "etc-upper" / _METRICS_CERTS
        cert, key = issue_serving_cert(self.cluster.certs, metrics, "kueue-metrics")
        cert.rename(metrics / "tls.crt")
        key.rename(metrics / "tls.key")
        config: dict[str, Any] = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": "kueue-system",
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health_port}"},
            "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
            "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(certs)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "integrations": {"frameworks": ["batch/job"]},
        }
        if self.mappings:
            config["resources"] = {"deviceClassMappings": self.mappings}
        path = self.workdir / "kueue-config.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def _argv(self, config: Path, gates: str) -> list[str]:
        """The manager in a private mount namespace whose /etc is an overlay holding
        the metrics certificate (the host's /etc stays untouched)."""
        upper, work = self.workdir / "etc-upper", self.workdir / "etc-work"
        work.mkdir(exist_ok=True)
        mount = (f"mount -t overlay overlay -o lowerdir=/etc,upperdir={shlex.quote(str(upper))},"
                 f"workdir={shlex.quote(str(work))} /etc")  # fmt: skip
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                f'{mount} && exec "$@"', "kueue", str(self.build.binary),
                f"--config={config}", f"--feature-gates={gates}", "--zap-log-level=2"]  # fmt: skip

    def running(self) -> bool:
        return self._component is not None and self._component.running()

    def log_tail(self, lines: int = 40) -> str:
        return self._component.log_tail(lines) if self._component else "(kueue not started)"

    def stop(self) -> None:
        """Delete the webhook configurations first, then stop the manager by PID."""
        for hook in self._webhooks:
            path = self.cluster.rest.object_path(hook)
            try:
                self.cluster.rest.delete(path)
            except ApiError as err:
                if err.status != 404:
                    raise
        self._webhooks = []
        if self._component is not None:
            self._component.stop()
