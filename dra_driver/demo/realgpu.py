"""Our plugin on a real node: the chart's DaemonSet container with emulated GPUs,
next to a real kubelet and containerd (:class:`~dra_driver.devcluster.node.RealNode`).

The plugin runs with exactly the chart's arguments and environment, rendered by
Helm with the node's paths (kubelet root, CDI dir, driver root). Two ways:

* ``pod``: the DaemonSet itself, its pod run by the kubelet from the locally
  built image (:mod:`dra_driver.demo.pluginimage`);
* ``host``: the same container command as a host process, with the token its
  pod would get (bound to the Node). Only ``--driver-root=/driver-root``, a
  mount point in the pod, is replaced by the host path it would mount, and MPS
  daemons are the process's children (``--mps-daemons process``: no pod to run
  them from).

Pods are taken through the real path: scheduler, kubelet DRA manager, our
plugin, containerd's CDI injection, runc. Their output comes from the CRI log
files (the kubelet API listens only inside the node's network namespace).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_driver.demo import chart
from dra_driver.demo.stack import DRIVER, RESOURCE_API, node_bound_kubeconfig
from dra_driver.devcluster import Cluster, wait_until
from dra_driver.devcluster.api import ApiError, JsonObject
from dra_driver.devcluster.node import RealNode
from dra_driver.devcluster.processes import terminate
from dra_driver.emulation.hosttree import DRIVER_ROOT

POD_DRIVER_ROOT = "/driver-root"
DONE_MARKER = "--done--"
"""Test pods print this after their output and then sleep, so a claim stays
prepared until the test deletes the pod (a pod that exits is unprepared)."""


@dataclass
class ContainerOutput:
    stdout: str
    returncode: int | None
    """Exit code, or None while the container still runs (after :data:`DONE_MARKER`)."""


@dataclass
class RealPodRun:
    namespace: str
    name: str
    uid: str
    containers: dict[str, ContainerOutput] = field(default_factory=dict)
    seconds_to_running: float = 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RealGpuNode:
    """A :class:`RealNode` serving emulated GPUs through our plugin, as the chart runs it."""

    def __init__(
        self,
        *,
        cluster: Cluster,
        node: RealNode,
        profile: str,
        workdir: Path,
        helm: Path,
        chart_dir: Path,
        driver: str = DRIVER,
        values: Mapping[str, str] | None = None,
        python: str = sys.executable,
    ) -> None:
        self.cluster = cluster
        self.node = node
        self.name = node.name
        self.profile = profile
        self.workdir = workdir
        self.driver = driver
        self.helm = helm
        self.chart_dir = chart_dir
        self.python = python
        self.host_root = workdir / "host"
        self.cdi_dir = node.paths.cdi_dir
        self.state_dir = node.paths.kubelet_root / "plugins" / driver
        self.health_port = free_port()
        self.values = {
            "driverName": driver,
            "kubeletRootDir": str(node.paths.kubelet_root),
            "cdiDir": str(self.cdi_dir),
            "driverRoot": str(self.host_root / DRIVER_ROOT),
            "emulate": profile,
            "rediscoverIntervalSeconds": "0",
            "healthPort": str(self.health_port),
            "logging.format": "json",
            "logging.level": "debug",
            **(values or {}),
        }
        self.plugin_log = workdir / "plugin.log"
        self.kubeconfig: Path | None = None
        self._plugin: subprocess.Popen[bytes] | None = None
        self._container: dict[str, Any] = {}

    # -- the plugin, as the chart's container -----------------------------------

    def render(self) -> list[dict[str, Any]]:
        return chart.render(self.helm, self.chart_dir, self.values)

    def start(self, timeout: float = 90.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        node = self.node.node_object()
        assert node is not None
        self.kubeconfig = node_bound_kubeconfig(self.cluster, node, self.workdir)
        ds = chart.daemonset(self.render())
        # The GPU plugin's container; the pod's compute-domain-plugin container is another
        # driver's (docs/compute-domains.md), not started here.
        (self._container,) = [
            c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "plugin"
        ]
        self.start_plugin()
        self.wait_ready(timeout=timeout)
        self.wait_published(timeout=timeout)

    def plugin_argv(self) -> list[str]:
        host_driver_root = str(self.host_root / DRIVER_ROOT)
        args = [
            f"--driver-root={host_driver_root}" if a == f"--driver-root={POD_DRIVER_ROOT}" else a
            for a in self._container["args"]
        ]
        return [self.python, "-m", "dra_driver", *args]

    def plugin_env(self, pod_uid: str) -> dict[str, str]:
        fields = {"spec.nodeName": self.name, "metadata.uid": pod_uid,
                  "metadata.namespace": "dra-driver"}  # fmt: skip
        assert self.kubeconfig is not None
        return {
            **{k: v for k, v in os.environ.items() if not k.startswith("DRA_")},
            **chart.resolve_env(self._container, fields),
            "DRA_KUBECONFIG": str(self.kubeconfig),
            "DRA_HOST_ROOT": str(self.host_root),  # the emulated node's /dev, /sys, driver
            # A host process has no pod: its MPS daemons are its own (setsid'd) children.
            "DRA_MPS_DAEMONS": "process",
        }

    def start_plugin(self, pod_uid: str | None = None, log: Path | None = None) -> int:
        if self.plugin_running():
            raise RuntimeError(f"plugin on {self.name} already running")
        self.pod_uid = pod_uid or str(uuid.uuid4())
        with (log or self.plugin_log).open("ab") as out:
            self._plugin = subprocess.Popen(
                self.plugin_argv(), env=self.plugin_env(self.pod_uid),
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        return self._plugin.pid

    def plugin_running(self) -> bool:
        return self._plugin is not None and self._plugin.poll() is None

    @property
    def plugin_pid(self) -> int | None:
        return self._plugin.pid if self._plugin else None

    def kill_plugin(self) -> None:
        """SIGKILL, as an OOM kill or a crash would."""
        if self._plugin is not None and self._plugin.poll() is None:
            os.kill(self._plugin.pid, signal.SIGKILL)
            self._plugin.wait()

    def stop_plugin(self, grace: float = 15.0) -> None:
        if self._plugin is not None:
            terminate(self._plugin, grace, "kubelet plugin")

    def probe(self, path: str) -> int:
        """What the chart's httpGet probe on the health port sees (HTTP status, 0 = down)."""
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.health_port}{path}", timeout=5
            ) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as err:
            return int(err.code)
        except OSError:
            return 0

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Readiness as the chart's probe sees it: registered with the kubelet, published."""

        def ready() -> bool:
            if not self.plugin_running():
                raise RuntimeError(f"plugin on {self.name} exited; {self.plugin_log_tail()}")
            return self.probe("/readyz") == 200

        wait_until(ready, timeout=timeout, what=f"plugin on {self.name} ready (/readyz)",
                   describe=self.plugin_log_tail)  # fmt: skip

    def registrations(self, log: Path | None = None) -> int:
        """How often the real kubelet confirmed a registration (NotifyRegistrationStatus)."""
        return sum(
            1
            for r in self.plugin_log_records(log)
            if r.get("msg") == "kubelet registered the plugin"
        )

    def stop(self) -> None:
        """Delete what is still prepared through the kubelet, then stop the plugin."""
        self.stop_plugin()

    # -- observations -----------------------------------------------------------

    def plugin_log_tail(self, lines: int = 25) -> str:
        try:
            text = self.plugin_log.read_text(errors="replace")
        except OSError as err:
            return f"(no plugin log: {err})"
        return f"----- plugin ({self.plugin_log}) -----\n" + "\n".join(text.splitlines()[-lines:])

    def plugin_log_records(self, log: Path | None = None) -> list[dict[str, Any]]:
        records = []
        path = log or self.plugin_log
        if not path.exists():
            return []
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                if isinstance(rec, dict):
                    records.append(rec)
        return records

    def slices(self) -> list[JsonObject]:
        listed = self.cluster.rest.get(
            f"{RESOURCE_API}/resourceslices",
            {"fieldSelector": f"spec.nodeName={self.name},spec.driver={self.driver}"},
        )
        return list(listed.get("items") or [])

    def published_devices(self) -> list[str] | None:
        slices = self.slices()
        if not slices:
            return None
        gen = max(s["spec"]["pool"]["generation"] for s in slices)
        current = [s for s in slices if s["spec"]["pool"]["generation"] == gen]
        if len(current) != current[0]["spec"]["pool"]["resourceSliceCount"]:
            return None
        return [d["name"] for s in current for d in s["spec"].get("devices") or []] or None

    def wait_published(self, timeout: float = 60.0) -> list[str]:
        return wait_until(self.published_devices, timeout=timeout,
                          what=f"a complete pool of {self.driver} on {self.name}",
                          describe=self.plugin_log_tail)  # fmt: skip

    def cdi_specs(self) -> dict[str, dict[str, Any]]:
        """This driver's claim CDI specs in the node's CDI dir, by file name."""
        prefix = "k8s." + self.driver
        return {
            p.name: json.loads(p.read_text()) for p in sorted(self.cdi_dir.glob(f"{prefix}-*.json"))
        }

    # -- pods ---------------------------------------------------------------------

    def pod(self, namespace: str, name: str) -> JsonObject:
        return self.cluster.rest.get(f"/api/v1/namespaces/{namespace}/pods/{name}")

    def run_pod(self, namespace: str, name: str, timeout: float = 90.0) -> RealPodRun:
        """Wait until every container printed :data:`DONE_MARKER` or exited; return
        what they printed. Fails early with the pod's events when it cannot start."""
        t0 = time.monotonic()

        def outputs() -> dict[str, ContainerOutput] | None:
            obj = self.pod(namespace, name)
            statuses = {s["name"]: s for s in obj["status"].get("containerStatuses") or []}
            result = {}
            for c in obj["spec"]["containers"]:
                state = statuses.get(c["name"], {}).get("state", {})
                text = self.node.pod_log(namespace, name, c["name"])
                if "terminated" in state:
                    result[c["name"]] = ContainerOutput(text, state["terminated"]["exitCode"])
                elif "running" in state and DONE_MARKER in text.splitlines():
                    result[c["name"]] = ContainerOutput(text.split(DONE_MARKER)[0], None)
                else:
                    return None
            return result

        found = wait_until(outputs, timeout=timeout, what=f"pod {namespace}/{name} ran",
                           describe=lambda: self.describe_pod(namespace, name))  # fmt: skip
        obj = self.pod(namespace, name)
        return RealPodRun(namespace, name, obj["metadata"]["uid"], found, time.monotonic() - t0)

    def describe_pod(self, namespace: str, name: str) -> str:
        try:
            status = self.pod(namespace, name).get("status", {})
        except ApiError as err:
            return str(err)
        events = self.cluster.rest.get(
            f"/api/v1/namespaces/{namespace}/events",
            {"fieldSelector": f"involvedObject.name={name}"},
        )["items"]
        lines = [f"{e['reason']}: {e.get('message', '')}" for e in events[-6:]]
        return json.dumps(status.get("containerStatuses") or status)[:800] + "\n" + "\n".join(lines)

    def events(self, namespace: str, name: str, reason: str) -> list[JsonObject]:
        listed = self.cluster.rest.get(
            f"/api/v1/namespaces/{namespace}/events",
            {"fieldSelector": f"involvedObject.name={name},reason={reason}"},
        )
        return list(listed["items"])

    def delete_pod(self, namespace: str, name: str, timeout: float = 60.0) -> None:
        """Delete and wait until the kubelet has finished it (claims unprepared)."""
        with contextlib.suppress(ApiError):
            self.cluster.rest.delete(f"/api/v1/namespaces/{namespace}/pods/{name}")

        def gone() -> bool:
            try:
                self.pod(namespace, name)
            except ApiError as err:
                if err.status == 404:
                    return True
                raise
            return False

        wait_until(gone, timeout=timeout, what=f"pod {namespace}/{name} deleted by the kubelet",
                   describe=lambda: self.describe_pod(namespace, name))  # fmt: skip


def keep_running(objs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Copies whose containers print :data:`DONE_MARKER` after their command and then
    sleep, so the pod (and its prepared claims) stays until deleted."""
    out = []
    for obj in objs:
        copy = json.loads(json.dumps(obj))
        if copy.get("kind") == "Pod":
            for c in copy["spec"]["containers"]:
                command = c.get("command") or []
                if command[:2] == ["sh", "-c"] and len(command) == 3:
                    c["command"] = [
                        "sh",
                        "-c",
                        f"{command[2]}; echo {DONE_MARKER}; exec sleep 3600",
                    ]
            copy["spec"]["terminationGracePeriodSeconds"] = 1
        out.append(copy)
    return out
