"""A real Kubernetes node for the dev cluster: the kubelet and containerd built
from Go modules, running pods with Debian's runc on this machine.

Per run: a short work directory holding every component's state, an
anonymous network namespace (:mod:`nodenet`), a cgroup root, a kubelet client
certificate from the cluster's CA (``system:node:<name>``, so the Node
authorizer applies), and PIDs of its own processes. Teardown removes pods
through CRI, stops processes by PID, undoes mounts below the work directory,
removes the run's cgroups and the entries it made in the few fixed host paths
(:mod:`hostclean`). The machine's sysctls are never written (:mod:`nodelaunch`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from dra_driver.devcluster import hostclean
from dra_driver.devcluster.binaries import NodeBinaries
from dra_driver.devcluster.certs import issue_client_cert
from dra_driver.devcluster.kubeconfig import write_kubeconfig
from dra_driver.devcluster.nodeconfig import (
    NodePaths,
    cni_config,
    containerd_config,
    kubelet_config,
    write_yaml,
)
from dra_driver.devcluster.nodelaunch import KUBELET_SYSCTLS
from dra_driver.devcluster.nodenet import (
    POD_SUBNET,
    SERVICE_IP,
    Forwarder,
    NodeNetwork,
    Route,
)
from dra_driver.devcluster.processes import Component, ComponentError
from dra_driver.devcluster.wait import wait_until

if TYPE_CHECKING:
    from dra_driver.devcluster.cluster import Cluster

logger = logging.getLogger(__name__)

PAUSE_IMAGE = "localhost/dra-node/pause:1"
BUSYBOX_IMAGE = "localhost/dra-node/busybox:1"
BUSYBOX_ALIASES = ("docker.io/library/busybox:1.36", "docker.io/library/busybox:latest")
"""Tags the examples use (``busybox:1.36``, ``busybox``), served by the local image."""


@dataclass(frozen=True)
class NodeImage:
    """An OCI archive to import into the node's containerd, and extra tags for it."""

    archive: Path
    ref: str
    aliases: Sequence[str] = ()


@dataclass(frozen=True)
class RealNodeOptions:
    name: str = ""
    """Node name (default: ``node-<random>``)."""
    extra_cdi_dirs: Sequence[Path] = ()
    images: Sequence[NodeImage] = ()
    verbosity: int = 2
    ready_timeout: float = 90.0
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    taints: Sequence[str] = ()
    """``--register-with-taints`` entries (``key=value:Effect``); ``{name}`` is the node name."""
    pod_subnet: str = POD_SUBNET
    """The node's pod range (its first address is the node IP); nodes whose pods must
    tell each other apart by IP need different ones."""


class RealNode:
    """One kubelet + containerd node joined to ``cluster``; a context manager."""

    def __init__(
        self,
        cluster: Cluster,
        binaries: NodeBinaries,
        workdir: Path,
        options: RealNodeOptions | None = None,
    ) -> None:
        self.cluster = cluster
        self.binaries = binaries
        self.options = options or RealNodeOptions()
        self.paths = NodePaths(workdir)
        self.run_id = secrets.token_hex(4)
        self.name = self.options.name or f"node-{self.run_id}"
        self.cgroup_root = f"dra-node-{self.run_id}"
        self.network_name = f"dra-{self.run_id}"
        self.network = NodeNetwork(self.paths.logs, self.options.pod_subnet)
        self._forwarder: Forwarder | None = None
        self._containerd: Component | None = None
        self._kubelet: Component | None = None
        self._host_dirs = hostclean.HostDirs()
        self._netns_inode = 0
        self.ready_seconds: float | None = None

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> float:
        """Bring the node up; returns seconds until the Node reported Ready."""
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> float:
        begin = time.monotonic()
        p = self.paths
        for d in (p.logs, p.etc / "cni", p.cdi_dir, p.pod_logs, p.kubelet_root, p.fake_sysctl):
            d.mkdir(parents=True, exist_ok=True)
        self._host_dirs = hostclean.HostDirs.snapshot()
        self.network.start()
        self._netns_inode = self.network.inode()
        api_port = int(self.cluster.server.rsplit(":", 1)[1])
        self._forwarder = Forwarder(
            self.network,
            [
                Route(("127.0.0.1", api_port), ("127.0.0.1", api_port)),
                Route((SERVICE_IP, 443), ("127.0.0.1", api_port)),
            ],
        )
        self._forwarder.start()
        hostclean.create_cgroup_root(self.cgroup_root)
        kubeconfig = self._kubelet_credentials()
        self._write_configs()
        self._start_containerd()
        self._import_images()
        self._prepare_kubelet_root()
        self._start_kubelet(kubeconfig)
        self.wait_ready(timeout=self.options.ready_timeout)
        self.ready_seconds = time.monotonic() - begin
        logger.info("node ready", extra={"node": self.name, "seconds": self.ready_seconds})
        return self.ready_seconds

    def _kubelet_credentials(self) -> Path:
        cert, key = issue_client_cert(
            self.cluster.certs, self.paths.pki, f"system:node:{self.name}", "system:nodes"
        )
        return write_kubeconfig(
            self.paths.pki / "kubelet.kubeconfig",
            server=self.cluster.server,
            ca_file=self.cluster.ca_file,
            user=f"system:node:{self.name}",
            cert_file=cert,
            key_file=key,
        )

    def _write_configs(self) -> None:
        p = self.paths
        (p.etc / "containerd.toml").write_text(
            containerd_config(
                p,
                cni_bin=self.binaries.cni_dir,
                runc=self.binaries.runc,
                sandbox_image=PAUSE_IMAGE,
                cdi_dirs=[p.cdi_dir, *self.options.extra_cdi_dirs],
            )
        )
        (p.etc / "cni" / "10-dra-node.conflist").write_text(
            json.dumps(cni_config(p, self.network_name, self.options.pod_subnet), indent=2)
        )
        write_yaml(
            p.etc / "kubelet.yaml",
            kubelet_config(
                p,
                ca_file=self.cluster.ca_file,
                cgroup_root=f"/{self.cgroup_root}",
                feature_gates=self.options.feature_gates,
            ),
        )

    def _start_containerd(self) -> None:
        env = {**os.environ, "PATH": f"{self.binaries.bin_dir}:{os.environ.get('PATH', '')}"}
        argv = self.network.enter_argv(
            [
                str(self.binaries.bin("containerd")),
                "--config",
                str(self.paths.etc / "containerd.toml"),
            ]
        )
        self._containerd = Component("containerd", argv, self.paths.logs, env=env)
        self._containerd.start()
        deadline = time.monotonic() + 30
        self._containerd.wait_healthy(lambda: self._ctr_ok("version"), deadline)

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``ctr`` against this node's containerd, in the CRI namespace."""
        argv = [str(self.binaries.bin("ctr")), "--address", str(self.paths.containerd_socket),
                "-n", "k8s.io", *args]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=300)
        if check and done.returncode != 0:
            raise ComponentError(f"ctr {' '.join(args)}: {done.stderr.strip()}")
        return done

    def _ctr_ok(self, *args: str) -> tuple[bool, str]:
        done = self.ctr(*args, check=False)
        return done.returncode == 0, done.stderr.strip()

    def _import_images(self) -> None:
        images = [
            NodeImage(self.binaries.image("pause"), PAUSE_IMAGE),
            NodeImage(self.binaries.image("busybox"), BUSYBOX_IMAGE, BUSYBOX_ALIASES),
            *self.options.images,
        ]
        for image in images:
            self.import_image(image)

    def import_image(self, image: NodeImage) -> None:
        self.ctr("images", "import", "--no-unpack", str(image.archive))
        for alias in image.aliases:
            self.ctr("images", "tag", "--force", image.ref, alias)

    def _prepare_kubelet_root(self) -> None:
        """The kubelet root as a shared mount: volumes the kubelet mounts in its own
        mount namespace must reach containerd's (the host's)."""
        root = str(self.paths.kubelet_root)
        if not hostclean.mounts_under(self.paths.kubelet_root):
            subprocess.run(["mount", "--bind", root, root], check=True)
        subprocess.run(["mount", "--make-rshared", root], check=True)
        for key in KUBELET_SYSCTLS:
            fake = self.paths.fake_sysctl / key.replace("/", ".")
            fake.write_text(Path("/proc/sys", key).read_text())

    def kubelet_argv(self, kubeconfig: Path) -> list[str]:
        binds = []
        for key in KUBELET_SYSCTLS:
            binds += ["--bind", f"{self.paths.fake_sysctl / key.replace('/', '.')}=/proc/sys/{key}"]
        kubelet = [
            str(self.binaries.bin("kubelet")),
            f"--config={self.paths.etc / 'kubelet.yaml'}",
            f"--kubeconfig={kubeconfig}",
            f"--root-dir={self.paths.kubelet_root}",
            f"--hostname-override={self.name}",
            # The kubelet refuses a loopback node IP; the bridge address is the
            # node's only other one (kubectl logs/exec would dial it and fail:
            # pod output is read from the CRI log files instead).
            f"--node-ip={self.network.gateway}",
            f"--v={self.options.verbosity}",
        ]
        if self.options.taints:
            taints = ",".join(t.replace("{name}", self.name) for t in self.options.taints)
            kubelet.append(f"--register-with-taints={taints}")
        return self.network.enter_argv(
            ["unshare", "--mount", "--propagation", "unchanged", "--",
             sys.executable, "-m", "dra_driver.devcluster.nodelaunch", *binds, "--", *kubelet]
        )  # fmt: skip

    def _start_kubelet(self, kubeconfig: Path) -> None:
        self._kubeconfig = kubeconfig
        self._kubelet = Component("kubelet", self.kubelet_argv(kubeconfig), self.paths.logs)
        self._kubelet.start()

    def restart_kubelet(self, *, kill: bool = True) -> None:
        """Stop the kubelet (SIGKILL, as a crash would, or SIGTERM) and start it again."""
        assert self._kubelet is not None
        if kill and self._kubelet.pid is not None and self._kubelet.running():
            os.kill(self._kubelet.pid, 9)
            with contextlib.suppress(Exception):
                self._kubelet.stop(grace=5)
        else:
            self._kubelet.stop()
        self._kubelet.start()

    def node_object(self) -> dict[str, Any] | None:
        from dra_driver.devcluster.api import ApiError

        try:
            return self.cluster.rest.get(f"/api/v1/nodes/{self.name}")
        except ApiError as err:
            if err.status == 404:
                return None
            raise

    def is_ready(self) -> bool:
        node = self.node_object()
        conditions = (node or {}).get("status", {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def wait_ready(self, timeout: float = 90.0) -> None:
        def ready() -> bool:
            for c in (self._kubelet, self._containerd):
                if c is not None and not c.running():
                    raise ComponentError(f"{c.name} exited\n{c.log_tail()}")
            return self.is_ready()

        wait_until(ready, timeout=timeout, what=f"node {self.name} Ready",
                   describe=self.log_tails)  # fmt: skip

    def check_running(self) -> None:
        dead = [c for c in (self._containerd, self._kubelet) if c is not None and not c.running()]
        if dead:
            raise ComponentError("\n".join(c.log_tail() for c in dead))

    def log_tails(self, lines: int = 30) -> str:
        return "\n".join(
            c.log_tail(lines) for c in (self._containerd, self._kubelet) if c is not None
        )

    @property
    def kubelet_log(self) -> Path:
        return self.paths.logs / "kubelet.log"

    def stop(self) -> None:
        """Everything down and gone; never raises, logs what it could not remove."""
        problems: list[str] = []
        if self._containerd is not None and self._containerd.running():
            done = subprocess.run(
                [str(self.binaries.bin("cri-reset")), f"unix://{self.paths.containerd_socket}"],
                capture_output=True, text=True, check=False, timeout=120,
            )  # fmt: skip
            if done.returncode != 0:
                problems.append(f"cri-reset: {done.stderr.strip()}")
        for component in (self._kubelet, self._containerd):
            if component is not None:
                component.stop(grace=15)
        if self._netns_inode:
            shim = self.binaries.bin("containerd-shim-runc-v2")
            for pid in hostclean.processes_in_netns(self._netns_inode, shim):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
        hostclean.kill_cgroup_processes(self.cgroup_root)
        if self._forwarder is not None:
            self._forwarder.stop()
        self.network.stop()
        if left := hostclean.unmount_all(self.paths.workdir):
            problems.append(f"mounts left: {left}")
        if left := hostclean.remove_cgroup_root(self.cgroup_root):
            problems.append(f"cgroups left: {left}")
        hostclean.remove_links_into(Path("/var/log/containers"), self.paths.pod_logs)
        hostclean.remove_matching(Path("/var/lib/cni/results"), [f"{self.network_name}-"])
        self._host_dirs.remove_empty()
        if problems:
            logger.warning("node teardown incomplete: %s", "; ".join(problems))

    def __enter__(self) -> RealNode:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- pods -----------------------------------------------------------------

    def pod_log(self, namespace: str, pod: str, container: str, restart: int = 0) -> str:
        """What a container wrote, from the CRI log file the runtime keeps."""
        uid = self.cluster.rest.get(f"/api/v1/namespaces/{namespace}/pods/{pod}")["metadata"]["uid"]
        path = self.paths.pod_logs / f"{namespace}_{pod}_{uid}" / container / f"{restart}.log"
        return parse_cri_log(path.read_text(errors="replace")) if path.exists() else ""

    def remove_workdir(self) -> None:
        """Delete the run directory (after :meth:`stop`; keep it to read logs)."""
        if not hostclean.mounts_under(self.paths.workdir):
            shutil.rmtree(self.paths.workdir, ignore_errors=True)


def parse_cri_log(text: str) -> str:
    """Join CRI log lines (``<time> <stream> <P|F> <message>``) into the output."""
    out: list[str] = []
    for line in text.splitlines():
        parts = line.split(" ", 3)
        if len(parts) < 3:
            continue
        message = parts[3] if len(parts) == 4 else ""
        out.append(message if parts[2] == "P" else message + "\n")
    return "".join(out)
