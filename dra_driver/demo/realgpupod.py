"""Our plugin on a real node as the chart's DaemonSet pod, from the locally built image
(:class:`RealGpuNodePod`); :mod:`dra_driver.demo.realgpu` has the host-process way and
what both share."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from dra_driver.demo import chart
from dra_driver.demo.realgpu import RealGpuNode
from dra_driver.devcluster import wait_until
from dra_driver.devcluster.api import ApiError, JsonObject
from dra_driver.devcluster.node import parse_cri_log


class RealGpuNodePod(RealGpuNode):
    """The chart's DaemonSet itself: its pod, from the locally built image, run by
    the node's kubelet (hostPath mounts, probes, rolling update and all).

    A release of its own (``dra-<run>``: ServiceAccount, RBAC, admission policy;
    DeviceClasses are cluster-wide and left to the shared install), pinned to this
    node, in a namespace of its own or in ``namespace``: nodes that must find each
    other's pods (a ComputeDomain's daemons) share one, as a cluster's nodes share
    the driver's. The plugin reaches the API server in-cluster, at the
    ``kubernetes`` Service address, with its projected, pod-bound token.
    """

    def __init__(self, *, image: str, namespace: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        repository, tag = image.rsplit(":", 1)
        self.release = f"dra-{self.node.run_id}"
        self.namespace = namespace or self.release
        self.values.update(
            {
                "image.repository": repository,
                "image.tag": tag,
                "image.pullPolicy": "Never",
                "emulatedHostRoot": str(self.host_root),
                "healthPort": "51515",  # the pod's own network namespace
                "deviceClasses.enabled": "false",
                "tolerations[0].operator": "Exists",
                r"nodeSelector.kubernetes\.io/hostname": self.name,
            }
        )
        self.health_port = 51515

    def render(self) -> list[dict[str, Any]]:
        return chart.render(
            self.helm, self.chart_dir, self.values, namespace=self.namespace, release=self.release
        )

    @property
    def daemonset_path(self) -> str:
        name = chart.daemonset(self.render())["metadata"]["name"]
        return f"/apis/apps/v1/namespaces/{self.namespace}/daemonsets/{name}"

    def start(self, timeout: float = 120.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.cluster.create_namespace(self.namespace)
        self.cluster.apply(self.render())
        self.wait_ready(timeout=timeout)
        self.wait_published(timeout=timeout)

    def plugin_pods(self) -> list[JsonObject]:
        return self._pods("kubelet-plugin")

    def daemon_pods(self) -> list[JsonObject]:
        """The MPS daemon pods the plugin runs on this node (``mpsDaemons: pod``)."""
        return self._pods("mps-daemon")

    def _pods(self, component: str) -> list[JsonObject]:
        listed = self.cluster.rest.get(
            f"/api/v1/namespaces/{self.namespace}/pods",
            {
                "fieldSelector": f"spec.nodeName={self.name}",
                "labelSelector": f"app.kubernetes.io/component={component}",
            },
        )
        return sorted(listed["items"], key=lambda p: p["metadata"]["creationTimestamp"])

    @staticmethod
    def pod_ready(pod: JsonObject) -> bool:
        conditions = pod.get("status", {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def wait_ready(self, timeout: float = 120.0) -> None:
        """The DaemonSet's pod Ready: its readiness probe (/readyz) passed."""
        wait_until(lambda: any(self.pod_ready(p) for p in self.plugin_pods()), timeout=timeout,
                   what=f"the chart's plugin pod Ready on {self.name}",
                   describe=self.describe_plugin)  # fmt: skip

    def describe_plugin(self) -> str:
        pods = self.plugin_pods()
        if not pods:
            return "no plugin pod yet"
        last = pods[-1]
        return (
            self.describe_pod(self.namespace, last["metadata"]["name"])
            + "\n"
            + (self.plugin_log_tail())
        )

    @property
    def pod_uid(self) -> str:
        return str(self.plugin_pods()[-1]["metadata"]["uid"])

    @pod_uid.setter
    def pod_uid(self, value: str) -> None:
        pass

    def plugin_log_text(self) -> str:
        """Everything every plugin container on this node wrote (all restarts)."""
        texts = []
        for directory in sorted(self.node.paths.pod_logs.glob(f"{self.namespace}_*")):
            for log in sorted((directory / "plugin").glob("*.log")):
                texts.append(parse_cri_log(log.read_text(errors="replace")))
        return "".join(texts)

    def plugin_log_tail(self, lines: int = 25) -> str:
        tail = "\n".join(self.plugin_log_text().splitlines()[-lines:])
        return f"----- plugin pod logs ({self.namespace}) -----\n{tail}"

    def plugin_log_records(self, log: Path | None = None) -> list[dict[str, Any]]:
        records = []
        for line in self.plugin_log_text().splitlines():
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                if isinstance(rec, dict):
                    records.append(rec)
        return records

    def plugin_running(self) -> bool:
        return any(self.pod_ready(p) for p in self.plugin_pods())

    def kill_plugin(self) -> None:
        """SIGKILL the GPU plugin container's process, as an OOM kill would; the kubelet
        restarts the container in the same pod (the compute-domain plugin's beside it
        keeps running)."""
        pod = self.plugin_pods()[-1]
        tasks = self.node.ctr("tasks", "ls").stdout.splitlines()[1:]
        containers = {
            c["containerID"].split("//")[1]: c
            for c in pod["status"].get("containerStatuses") or []
            if c["name"] == "plugin"
        }
        for line in tasks:
            task, pid, state = line.split()[:3]
            if task in containers and state == "RUNNING":
                os.kill(int(pid), signal.SIGKILL)
                return
        raise RuntimeError(f"no running plugin container found in {tasks}")

    def restart_count(self) -> int:
        pod = self.plugin_pods()[-1]
        return sum(c.get("restartCount", 0) for c in pod["status"].get("containerStatuses") or []
                   if c["name"] == "plugin")  # fmt: skip

    def roll(self) -> None:
        """What ``helm upgrade`` with a changed pod template does: the DaemonSet
        controller replaces the pod (surge: the new one first)."""
        stamp = str(time.time())
        self.cluster.rest.merge_patch(
            self.daemonset_path,
            {
                "spec": {
                    "template": {"metadata": {"annotations": {"dra-driver.test/rolled": stamp}}}
                }
            },
        )

    def stop(self) -> None:
        """Uninstall the release: the DaemonSet's pod goes, then MPS daemon pods a test
        left (they outlive the plugin by design), then the namespace."""
        with contextlib.suppress(ApiError):
            self.cluster.rest.delete(self.daemonset_path)
        with contextlib.suppress(TimeoutError, ApiError):
            wait_until(lambda: not self.plugin_pods(), timeout=60, what="plugin pod gone")
        for pod in self.daemon_pods():
            with contextlib.suppress(ApiError):
                self.cluster.rest.delete(
                    f"/api/v1/namespaces/{self.namespace}/pods/{pod['metadata']['name']}"
                )
        with contextlib.suppress(TimeoutError, ApiError):
            wait_until(lambda: not self.daemon_pods(), timeout=60, what="daemon pods gone")
