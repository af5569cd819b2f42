"""One emulated GPU node on the real control plane: our kubelet plugin as a
subprocess under its own ServiceAccount token, and the kubelet's own DRA code
(the Go kubelet harness) driving it. Shared by ``dra-driver demo`` and the
end-to-end tests; developer tooling only.

The plugin gets exactly what the Helm chart gives it in a cluster: the RBAC
and admission policy of ``deploy/manifests`` (rendered from the chart) and a
token bound to its Node, so a missing permission fails here too.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dra_driver.demo.kubeletharness import HarnessError, KubeletHarness, PrepareResult
from dra_driver.demo.runtime import ContainerRun, ContainerRuntime
from dra_driver.devcluster import Cluster, wait_until
from dra_driver.devcluster.api import JsonObject
from dra_driver.devcluster.kubeconfig import write_kubeconfig
from dra_driver.devcluster.processes import terminate

logger = logging.getLogger(__name__)

DRIVER = "gpu.nvidia.com"
PLUGIN_NAMESPACE = "dra-driver"
PLUGIN_SERVICE_ACCOUNT = "dra-driver-kubelet-plugin"
RESOURCE_API = "/apis/resource.k8s.io/v1"
DEDICATED_TAINT = "dra-driver.test/dedicated"
"""NoSchedule taint on nodes started with ``dedicated=True``: only pods placed
with :func:`pin_to_node` (which tolerates it) land there, so pods of other
tests sharing the control plane never take this node's devices."""


def install_driver_objects(cluster: Cluster, manifests: Path) -> list[str]:
    """Apply the rendered chart except the DaemonSet (no kubelet runs pods here:
    the plugin runs as a local process instead). Returns ``kind/name`` applied."""
    applied = []
    for obj in yaml.safe_load_all(manifests.read_text()):
        if not obj or obj["kind"] == "DaemonSet":
            continue
        cluster.apply(obj)
        applied.append(f"{obj['kind']}/{obj['metadata']['name']}")
    return applied


def node_bound_kubeconfig(cluster: Cluster, node: Mapping[str, Any], directory: Path) -> Path:
    """The plugin's ServiceAccount token bound to its Node, like a DaemonSet pod's
    projected token: it carries the node-name the admission policy checks."""
    name = node["metadata"]["name"]
    answer = cluster.rest.create(
        f"/api/v1/namespaces/{PLUGIN_NAMESPACE}/serviceaccounts/{PLUGIN_SERVICE_ACCOUNT}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": 24 * 3600,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": name,
                    "uid": node["metadata"]["uid"],
                },
            },
        },
    )
    directory.mkdir(parents=True, exist_ok=True)
    return write_kubeconfig(
        directory / f"plugin-{name}.kubeconfig",
        server=cluster.server,
        ca_file=cluster.ca_file,
        user=f"system:serviceaccount:{PLUGIN_NAMESPACE}:{PLUGIN_SERVICE_ACCOUNT}",
        token=answer["status"]["token"],
    )


@dataclass
class PodRun:
    """A pod taken through the kubelet path: prepared, containers run."""

    namespace: str
    name: str
    node: str
    prepared: PrepareResult
    containers: dict[str, ContainerRun] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    health: dict[str, Any] = field(default_factory=dict)
    """Per container: ``allocatedResourcesStatus`` the kubelet code put in the pod status."""


class GpuNode:
    """A Node object, an emulated GPU host tree, our plugin and a kubelet harness."""

    def __init__(
        self,
        *,
        cluster: Cluster,
        name: str,
        profile: str,
        workdir: Path,
        harness_binary: Path,
        driver: str = DRIVER,
        labels: Mapping[str, str] | None = None,
        plugin_args: Sequence[str] = (),
        python: str = sys.executable,
        dedicated: bool = False,
    ) -> None:
        self.cluster = cluster
        self.name = name
        self.profile = profile
        self.driver = driver
        self.workdir = workdir
        self.labels = dict(labels or {})
        self.plugin_args = list(plugin_args)
        self.python = python
        self.dedicated = dedicated
        self.host_root = workdir / "host"
        self.kubelet_root = workdir / "kubelet"
        self.cdi_dir = workdir / "cdi"
        # Not under kubelet/plugins/<driver> as on a node: an MPS daemon's sockets live
        # in <state>/mps/<id>/pipe and must stay under 108 bytes from deep work dirs.
        self.state_dir = workdir / "state"
        self.plugin_log = workdir / "plugin.log"
        self.harness = KubeletHarness(
            binary=harness_binary,
            kubeconfig=cluster.kubeconfig,
            node_name=name,
            root_dir=self.kubelet_root,
            log_path=workdir / "kubelet-harness.log",
        )
        self.node: JsonObject = {}
        self.kubeconfig: Path | None = None
        self._plugin: subprocess.Popen[bytes] | None = None

    # -- lifecycle -------------------------------------------------------------

    def start(self, timeout: float = 90.0) -> None:
        """Node, token, kubelet harness, plugin; returns once registered and published."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.node = self.cluster.create_node(self.name, labels=self.labels)
        if self.dedicated:
            taint = {"key": DEDICATED_TAINT, "value": self.name, "effect": "NoSchedule"}
            self.node = self.cluster.rest.merge_patch(
                f"/api/v1/nodes/{self.name}", {"spec": {"taints": [taint]}}
            )
        self.kubeconfig = node_bound_kubeconfig(self.cluster, self.node, self.workdir)
        self.harness.start()
        self.start_plugin()
        self.wait_registered(timeout=timeout)
        self.wait_published(timeout=timeout)

    def wait_registered(self, *, after_seq: int = 0, timeout: float = 60.0) -> int:
        """Wait for the kubelet code to register our plugin; fail fast if the plugin dies."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.plugin_running():
                raise RuntimeError(f"plugin on {self.name} exited; {self.plugin_log_tail()}")
            try:
                return self.harness.wait_registered(self.driver, after_seq=after_seq, timeout=1.0)
            except HarnessError:
                if time.monotonic() >= deadline:
                    raise

    def plugin_argv(self) -> list[str]:
        assert self.kubeconfig is not None
        return [
            self.python, "-m", "dra_driver", "--log-format=json", "--log-level=debug",
            "kubelet-plugin",
            f"--node-name={self.name}",
            f"--driver-name={self.driver}",
            f"--emulate={self.profile}",
            f"--host-root={self.host_root}",
            f"--cdi-dir={self.cdi_dir}",
            f"--kubelet-registry-dir={self.harness.registry_dir}",
            f"--kubelet-plugins-dir={self.harness.plugins_dir}",
            f"--state-dir={self.state_dir}",
            f"--kubeconfig={self.kubeconfig}",
            "--rediscover-interval=0",
            *self.plugin_args,
        ]  # fmt: skip

    def start_plugin(self) -> int:
        """Start our plugin process; returns its PID."""
        if self.plugin_running():
            raise RuntimeError(f"plugin on {self.name} already running")
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("DRA_NODE_NAME", "DRA_ROLLING_UPDATE_UID")
        }
        with self.plugin_log.open("ab") as log:
            self._plugin = subprocess.Popen(
                self.plugin_argv(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        logger.info("plugin started", extra={"node": self.name, "pid": self._plugin.pid})
        return self._plugin.pid

    def plugin_running(self) -> bool:
        return self._plugin is not None and self._plugin.poll() is None

    @property
    def plugin_pid(self) -> int | None:
        return self._plugin.pid if self._plugin else None

    def kill_plugin(self, *, with_tools: bool = False) -> None:
        """SIGKILL the plugin, as a crash or OOM kill would; ``with_tools``: the GPU tools
        it is running too (its process group; MPS daemons have their own session)."""
        proc = self._plugin
        if proc is not None and proc.poll() is None:
            if with_tools:
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()

    def stop_plugin(self, grace: float = 15.0) -> None:
        if self._plugin is not None:
            terminate(self._plugin, grace, "kubelet plugin")

    def stop(self) -> None:
        """Unprepare what is still prepared (MPS daemons, mounts, CDI specs would
        outlive us otherwise), then stop the plugin and the harness."""
        if self.plugin_running() and self.harness.running():
            with contextlib.suppress(HarnessError):
                for namespace, pod in self.harness.prepared_pods():
                    try:
                        self.harness.unprepare(namespace, pod, finalize=False)
                    except HarnessError as err:
                        logger.warning("cleanup: unprepare of %s/%s failed: %s",
                                       namespace, pod, err)  # fmt: skip
        self.stop_plugin()
        self.harness.stop()

    # -- observations ----------------------------------------------------------

    def slices(self) -> list[JsonObject]:
        listed = self.cluster.rest.get(
            f"{RESOURCE_API}/resourceslices",
            {"fieldSelector": f"spec.nodeName={self.name},spec.driver={self.driver}"},
        )
        items: list[JsonObject] = listed.get("items") or []
        return items

    def published_devices(self) -> list[str] | None:
        """Device names of the complete newest pool generation, or None if incomplete."""
        slices = self.slices()
        if not slices:
            return None
        gen = max(s["spec"]["pool"]["generation"] for s in slices)
        current = [s for s in slices if s["spec"]["pool"]["generation"] == gen]
        if len(current) != current[0]["spec"]["pool"]["resourceSliceCount"]:
            return None
        names = [d["name"] for s in current for d in s["spec"].get("devices") or []]
        return names or None

    def wait_published(self, timeout: float = 60.0) -> list[str]:
        def check() -> list[str] | None:
            if not self.plugin_running():
                raise RuntimeError(f"plugin on {self.name} exited; {self.plugin_log_tail()}")
            return self.published_devices()

        return wait_until(
            check, timeout=timeout, what=f"a complete pool of {self.driver} on {self.name}",
            describe=self.plugin_log_tail,
        )  # fmt: skip

    def plugin_log_tail(self, lines: int = 25) -> str:
        try:
            text = self.plugin_log.read_text(errors="replace")
        except OSError as err:
            return f"(no plugin log: {err})"
        tail = "\n".join(text.splitlines()[-lines:])
        return f"----- plugin on {self.name} ({self.plugin_log}) -----\n{tail}"

    def plugin_log_records(self) -> list[dict[str, Any]]:
        """The plugin's JSON log lines (non-JSON lines are skipped)."""
        records = []
        for line in self.plugin_log.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                if isinstance(rec, dict):
                    records.append(rec)
        return records

    def cdi_specs(self) -> dict[str, dict[str, Any]]:
        """CDI spec files currently in the node's CDI dir, by file name."""
        if not self.cdi_dir.is_dir():
            return {}
        return {p.name: json.loads(p.read_text()) for p in sorted(self.cdi_dir.glob("*.json"))}

    # -- the kubelet's pod path --------------------------------------------------

    def wait_bound(self, namespace: str, pod: str, timeout: float = 60.0) -> JsonObject:
        path = f"/api/v1/namespaces/{namespace}/pods/{pod}"

        def bound() -> JsonObject | None:
            obj = self.cluster.rest.get(path)
            return obj if obj["spec"].get("nodeName") else None

        def describe() -> str:
            obj = self.cluster.rest.get(path)
            return json.dumps(obj.get("status", {}).get("conditions"))

        found = wait_until(bound, timeout=timeout, what=f"pod {namespace}/{pod} bound",
                           describe=describe)  # fmt: skip
        if found["spec"]["nodeName"] != self.name:
            raise RuntimeError(f"pod {namespace}/{pod} bound to {found['spec']['nodeName']}")
        return found

    def run_pod(self, namespace: str, pod: str, runtime: ContainerRuntime | None) -> PodRun:
        """What a kubelet does for a pod bound here: prepare its claims, start its
        containers with the CDI devices (when a runtime is given), report Running."""
        t0 = time.monotonic()
        obj = self.wait_bound(namespace, pod)
        t1 = time.monotonic()
        prepared = self.harness.prepare(namespace, pod)
        t2 = time.monotonic()
        result = PodRun(namespace, pod, self.name, prepared)
        if runtime is not None:
            for container in obj["spec"]["containers"]:
                argv = [*(container.get("command") or []), *(container.get("args") or [])]
                info = prepared.containers.get(container["name"])
                ids = info.cdi_devices if info else ()
                result.containers[container["name"]] = runtime.run(
                    cdi_dirs=[self.cdi_dir], cdi_ids=ids, argv=argv or ["/bin/true"],
                )  # fmt: skip
        t3 = time.monotonic()
        status = self.harness.set_running(namespace, pod)
        result.health = dict(status.get("allocated_resources_status") or {})
        result.timings = {"bind_s": t1 - t0, "prepare_s": t2 - t1, "containers_s": t3 - t2}
        return result

    def delete_pod(self, namespace: str, pod: str) -> dict[str, Any]:
        """Delete like a user, then finish like the kubelet: unprepare and final delete."""
        self.cluster.rest.delete(f"/api/v1/namespaces/{namespace}/pods/{pod}")
        return self.harness.unprepare(namespace, pod)


def pin_to_node(objs: Sequence[Mapping[str, Any]], node: str) -> list[dict[str, Any]]:
    """Copies of ``objs`` whose Pods may only be scheduled to ``node`` (the test
    cluster is shared: other nodes may publish the same driver's devices)."""
    out = []
    for obj in objs:
        copy = json.loads(json.dumps(obj))
        if copy.get("kind") == "Pod":
            spec = copy.setdefault("spec", {})
            spec["nodeSelector"] = {**spec.get("nodeSelector", {}), "kubernetes.io/hostname": node}
            toleration = {"key": DEDICATED_TAINT, "operator": "Equal", "value": node,
                          "effect": "NoSchedule"}  # fmt: skip
            spec["tolerations"] = [*spec.get("tolerations", []), toleration]
        out.append(copy)
    return out


def load_examples(path: Path, namespace: str) -> list[dict[str, Any]]:
    """The objects of one example file, placed in ``namespace``."""
    objs = []
    for obj in yaml.safe_load_all(path.read_text()):
        if obj:
            obj.setdefault("metadata", {})["namespace"] = namespace
            objs.append(obj)
    return objs
