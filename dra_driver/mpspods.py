"""MPS control daemons as pods (``--mps-daemons pod``): the
:class:`~dra_driver.gpu.sharing.mpsrunners.DaemonRunner` the daemon's composition root gives
the GPU layer, which never imports this (nor Kubernetes).

Why pods: the kubelet, not the plugin's container, owns a daemon's lifetime. When the
plugin container is SIGKILLed, restarted, or its pod replaced by a rolling update, runc
kills every process in that container's cgroup; a daemon in a pod of its own keeps
running, so the CUDA clients in users' pods keep their MPS server and their limits. An
administrator sees each daemon (``kubectl get pods -l
app.kubernetes.io/component=mps-daemon``, ``kubectl logs``). The other way, moving a
process out of the plugin container's cgroup, fights the node's cgroup manager.

Each daemon is one pod (:mod:`dra_driver.plugin.nodepods`) in the plugin's namespace,
pinned to this node, running ``dra-driver mps-daemon`` (:mod:`dra_driver.commands.
mps_daemon`) from the plugin's own image, privileged, in the host's PID namespace (the
plugin finds the daemon's processes in ``/proc`` by their pipe dir, as for its own
children), with these host paths: the daemon's dir at the same path (pipe, log), its
shared-memory tmpfs as ``/dev/shm``, the driver root where the plugin sees it, and an
emulated node's root when emulating. It applies the default limits itself each time it
starts, so a container the kubelet restarts serves with them again.

:meth:`PodRunner.start` replaces an existing pod of the daemon, creates it and waits
until the daemon serves: its ready file written and its processes found. Stop deletes
the pod (only that pod: UID precondition) and waits until the daemon's processes and
the pod are gone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from dra_driver.gpu.sharing.mpsrunners import DaemonSpec, daemon_pids
from dra_driver.gpu.sharing.tools import ToolError
from dra_driver.plugin.kubeclient import KubeClient, KubeError, Obj
from dra_driver.plugin.nodepods import HostMount, NodePod, NodePods, describe

COMPONENT = {"app.kubernetes.io/component": "mps-daemon"}
READY_FILE = "ready"
"""In the daemon's dir: written by the pod's entry point once it serves."""


class PodRunner:
    """One pod per MPS control daemon; thread-safe (no state of its own)."""

    name = "pod"

    def __init__(
        self,
        *,
        client: KubeClient,
        namespace: str,
        node_name: str,
        driver_name: str,
        image: str,
        mps_control: Path,
        library_path: str = "",
        mounts: Sequence[HostMount] = (),
        priority_class: str = "",
        proc: Path = Path("/proc"),
        logger: logging.Logger,
        start_timeout_s: float = 30.0,
        stop_timeout_s: float = 60.0,
    ) -> None:
        """``mounts``: host paths the daemon needs besides its own dir (the driver root
        where the plugin sees it). ``library_path``: ``LD_LIBRARY_PATH`` of the MPS tool
        only (the driver's libraries; never the entry point's own Python)."""
        self._label = f"{driver_name}/mps-daemon"
        self._pods = NodePods(
            client=client,
            namespace=namespace,
            node_name=node_name,
            prefix="mps-daemon",
            labels={**COMPONENT, "app.kubernetes.io/managed-by": driver_name},
        )
        self._image = image
        self._mps_control = mps_control
        self._library_path = library_path
        self._mounts = tuple(mounts)
        self._priority_class = priority_class
        self._proc = proc
        self._log = logger
        self._start_timeout_s = start_timeout_s
        self._stop_timeout_s = stop_timeout_s

    @property
    def pods(self) -> NodePods:
        return self._pods

    def pod(self, spec: DaemonSpec) -> NodePod:
        args = [
            "mps-daemon",
            f"--pipe-dir={spec.pipe_dir}",
            f"--log-dir={spec.log_dir}",
            f"--mps-control={self._mps_control}",
            f"--ready-file={spec.base / READY_FILE}",
            f"--visible-devices={spec.env.get('CUDA_VISIBLE_DEVICES', '')}",
            f"--setup={';'.join(spec.setup)}",
        ]
        if self._library_path:
            args.append(f"--library-path={self._library_path}")
        mounts = [HostMount(str(spec.base))]
        if spec.shm_dir is not None:
            mounts.append(HostMount(str(spec.shm_dir), "/dev/shm"))
        return NodePod(
            job=spec.daemon_id,
            image=self._image,
            args=args,
            labels={self._label: spec.daemon_id},
            mounts=[*mounts, *self._mounts],
            priority_class=self._priority_class,
            grace_s=30,
        )

    def start(self, spec: DaemonSpec) -> None:
        name = self._pods.name(spec.daemon_id)
        with _errors(name):
            existing = self._pods.get(spec.daemon_id)
            if existing is not None:  # a retried prepare: a fresh daemon with these limits
                self._stop(spec, existing)
            ready = spec.base / READY_FILE
            ready.unlink(missing_ok=True)
            self._pods.create(self.pod(spec))
        self._log.info(
            "MPS daemon pod created",
            extra={"pod": f"{self._pods.namespace}/{name}", "daemon": spec.daemon_id},
        )
        deadline = time.monotonic() + self._start_timeout_s
        while not (ready.exists() and daemon_pids(self._proc, spec.pipe_dir)):
            if time.monotonic() > deadline:
                with _errors(name):
                    pod = self._pods.get(spec.daemon_id)
                hint = ""
                if ready.exists():  # it says it serves, but this process cannot see it
                    hint = (
                        f"; its ready file is there but no daemon process is in {self._proc}: "
                        "the plugin needs the host's PID namespace (hostPID)"
                    )
                raise ToolError(
                    f"MPS daemon pod {self._pods.namespace}/{name} not serving after "
                    f"{self._start_timeout_s:g} s: {describe(pod)}{hint}"
                )
            time.sleep(0.02)

    def set_limits(self, spec: DaemonSpec) -> None:
        """Nothing: the pod sent them (``--setup``) before it wrote its ready file."""

    def stop(self, spec: DaemonSpec) -> None:
        with _errors(self._pods.name(spec.daemon_id)):
            pod = self._pods.get(spec.daemon_id)
            if pod is not None:
                self._stop(spec, pod)

    def _stop(self, spec: DaemonSpec, pod: Obj) -> None:
        name = self._pods.name(spec.daemon_id)
        self._pods.delete(spec.daemon_id, uid=pod["metadata"]["uid"])
        deadline = time.monotonic() + self._stop_timeout_s
        while daemon_pids(self._proc, spec.pipe_dir):
            if time.monotonic() > deadline:
                return  # the caller quits and SIGKILLs what is left
            time.sleep(0.02)
        while (left := self._pods.get(spec.daemon_id)) is not None:
            if left["metadata"]["uid"] != pod["metadata"]["uid"]:
                break  # another one created since (not ours to wait for)
            if time.monotonic() > deadline:
                raise ToolError(
                    f"MPS daemon pod {self._pods.namespace}/{name} still there "
                    f"{self._stop_timeout_s:g} s after its deletion: {describe(left)}"
                )
            time.sleep(0.05)
        self._log.info(
            "MPS daemon pod deleted",
            extra={"pod": f"{self._pods.namespace}/{name}", "daemon": spec.daemon_id},
        )

    def present(self) -> set[str]:
        with _errors("list"):
            pods = self._pods.list()
        return {str(p["metadata"].get("labels", {}).get(self._label, "")) for p in pods} - {""}

    def stop_all(self) -> None:
        """After a reboot: every daemon pod of this node goes (no wait: the kubelet may
        still be starting them again; their daemons find no dirs and fail meanwhile)."""
        with _errors("list"):
            for pod in self._pods.list():
                label = pod["metadata"].get("labels", {}).get(self._label, "")
                if label:
                    self._pods.delete(str(label), uid=pod["metadata"]["uid"])
                    self._log.info(
                        "MPS daemon pod of the previous boot deleted",
                        extra={"pod": pod["metadata"]["name"]},
                    )


@contextmanager
def _errors(name: str) -> Iterator[None]:
    """Kubernetes errors become the GPU layer's ToolError, naming the pod."""
    try:
        yield
    except KubeError as exc:
        raise ToolError(f"MPS daemon pod {name}: {exc}") from exc
