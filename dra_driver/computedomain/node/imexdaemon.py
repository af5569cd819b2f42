"""A ComputeDomain's IMEX daemon on one node (``dra-driver compute-domain-daemon``).

Runs in the domain's daemon pod, whose claim's CDI spec gave it the domain's host
directory at ``/etc/nvidia-imex``, ``DOMAIN_UID``, ``CLIQUE_ID`` and ``IMEX_BIN_DIR``
(:mod:`.cdispecs`); the controller's DaemonSet gives ``NODE_NAME``, ``POD_NAME``,
``POD_NAMESPACE`` and ``POD_IP``. It

1. labels its own pod :data:`~dra_driver.computedomain.names.CLIQUE_LABEL` ``=<clique>``
   (its only API write: the controller reads daemons from their pods);
2. writes the IMEX config (:func:`config_text`) and the nodes file: the IPs of its
   clique's daemons in ``index`` order, from the ``ComputeDomainClique`` object
   ``<domain uid>.<clique id>`` that the controller alone writes (:func:`peer_ips`);
3. starts ``nvidia-imex -c <config>`` in the foreground, as its child, with the peers
   the clique lists at that moment;
4. watches that object: when the peers change, rewrites the nodes file (atomically)
   and sends ``nvidia-imex`` SIGUSR1 to re-read it, once it catches SIGUSR1 (the
   signal's default action kills a process that has not set its handler yet; a peer
   that joined just as the daemon started did that, found by the two-node e2e test);
5. exits 1 when ``nvidia-imex`` exits (the kubelet restarts the container), 0 on SIGTERM
   (after stopping ``nvidia-imex``).

Readiness is ``compute-domain-daemon check``: ``nvidia-imex-ctl -q`` answering READY.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_driver.computedomain.names import API_GROUP, API_VERSION, CLIQUE_LABEL, CLIQUE_PLURAL
from dra_driver.daemon import Wakeups
from dra_driver.errors import DriverError
from dra_driver.plugin.kubeclient import KubeClient, KubeError, NotFoundError

logger = logging.getLogger(__name__)
CONFIG_FILE = "config.cfg"
NODES_FILE = "nodes_config.cfg"
SERVER_PORT = 50000
_STOP = (signal.SIGTERM, signal.SIGINT)


class DaemonError(DriverError):
    """The IMEX daemon cannot run."""


@dataclass(frozen=True)
class ImexDaemonSettings:
    node_name: str
    pod_name: str
    namespace: str
    pod_ip: str
    domain_uid: str
    clique_id: str
    imex_dir: Path
    """The domain's host directory as the container sees it (config, nodes file, log)."""
    imex_bin_dir: Path
    """Where ``nvidia-imex`` and ``nvidia-imex-ctl`` are."""
    resync_s: float = 300.0
    """A watch is re-opened at least this often (the server ends it)."""
    reload_grace_s: float = 10.0
    """SIGUSR1 waits until ``nvidia-imex`` catches it, at most this long after its start
    (then it is sent anyway: a binary that never catches it is restarted by it)."""

    @property
    def clique_name(self) -> str:
        return f"{self.domain_uid}.{self.clique_id}"

    @property
    def config_file(self) -> Path:
        return self.imex_dir / CONFIG_FILE

    @property
    def nodes_file(self) -> Path:
        return self.imex_dir / NODES_FILE


def config_text(settings: ImexDaemonSettings) -> str:
    """The IMEX daemon's config: foreground, our nodes file, a log in the domain's dir."""
    return (
        "# Written by dra-driver compute-domain-daemon; rewritten at every start.\n"
        "DAEMONIZE=0\n"
        f"SERVER_PORT={SERVER_PORT}\n"
        f"IMEX_NODE_CONFIG_FILE={settings.nodes_file}\n"
        f"LOG_LOCAL_FILE_NAME={settings.imex_dir / 'nvidia-imex.log'}\n"
        "LOG_LEVEL=4\n"
    )


def peer_ips(clique: dict[str, Any] | None, own_ip: str) -> list[str]:
    """The clique's daemon IPs in ``index`` order; just ours while the controller has not
    listed us yet (``nvidia-imex`` then starts alone and learns its peers by SIGUSR1)."""
    daemons = (clique or {}).get("daemons") or []
    listed = sorted(
        (int(d.get("index", 0)), str(d["ipAddress"]))
        for d in daemons if isinstance(d, dict) and d.get("ipAddress")
    )  # fmt: skip
    ips = [ip for _, ip in listed]
    return ips if own_ip in ips else [*ips, own_ip] if own_ip else ips


def catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (``SigCgt`` of
    ``/proc/<pid>/status``); False when it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def write_file(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.chmod(0o644)
    tmp.replace(path)


class CliqueWatch:
    """The clique object's peers, pushed to ``on_peers`` from a background thread."""

    def __init__(self, client: KubeClient, settings: ImexDaemonSettings,
                 on_peers: Callable[[list[str]], None]) -> None:  # fmt: skip
        self._client = client
        self._s = settings
        self._on_peers = on_peers
        self._stopped = threading.Event()
        self._path = (f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{settings.namespace}/"
                      f"{CLIQUE_PLURAL}")  # fmt: skip

    def fetch(self) -> dict[str, Any]:
        """The clique object as a list answer (its items: none or the object)."""
        return self._client.request("GET", self._path, params={
            "fieldSelector": f"metadata.name={self._s.clique_name}"})  # fmt: skip

    def peers_now(self) -> list[str]:
        """The clique's peers at this moment; just ours if it cannot be read."""
        try:
            items = self.fetch().get("items") or []
        except (KubeError, ValueError) as exc:
            logger.warning("reading the clique failed: %s", exc)
            items = []
        return peer_ips(items[0] if items else None, self._s.pod_ip)

    def run(self) -> None:
        while not self._stopped.is_set():
            try:
                listed = self.fetch()
                items = listed.get("items") or []
                self._on_peers(peer_ips(items[0] if items else None, self._s.pod_ip))
                rv = str((listed.get("metadata") or {}).get("resourceVersion", ""))
                watch = self._client.watch(self._path, {"fieldSelector":
                                           f"metadata.name={self._s.clique_name}"}, rv,
                                           timeout_s=int(self._s.resync_s))  # fmt: skip
                for kind, obj in watch:
                    if self._stopped.is_set():
                        break
                    if kind in ("ADDED", "MODIFIED"):
                        self._on_peers(peer_ips(obj, self._s.pod_ip))
                    elif kind == "DELETED":
                        self._on_peers(peer_ips(None, self._s.pod_ip))
                    elif kind == "ERROR":
                        break  # resourceVersion too old: list again
            except (KubeError, ValueError) as exc:
                logger.warning("watching the clique failed: %s", exc)
                self._stopped.wait(2.0)

    def stop(self) -> None:
        self._stopped.set()


def label_pod(client: KubeClient, settings: ImexDaemonSettings) -> None:
    """Our pod gets ``CLIQUE_LABEL`` (retried until it works or the pod is gone)."""
    path = f"/api/v1/namespaces/{settings.namespace}/pods/{settings.pod_name}"
    body = {"metadata": {"labels": {CLIQUE_LABEL: settings.clique_id}}}
    for attempt in range(30):
        try:
            client.request("PATCH", path, body=body, content_type="application/merge-patch+json")
            return
        except NotFoundError as exc:
            raise DaemonError(f"pod {settings.namespace}/{settings.pod_name} is gone") from exc
        except KubeError as exc:
            logger.warning("labelling our pod failed (attempt %d): %s", attempt + 1, exc)
            time.sleep(min(2.0, 0.1 * 2**attempt))
    raise DaemonError(f"cannot label pod {settings.pod_name} with {CLIQUE_LABEL}")


def run(settings: ImexDaemonSettings, client: KubeClient) -> int:
    """Until SIGTERM/SIGINT (0) or ``nvidia-imex`` exits (1)."""
    wakeups = Wakeups()
    wakeups.install()
    lock = threading.Lock()
    pending: list[list[str]] = []

    def on_peers(ips: list[str]) -> None:
        with lock:
            pending.append(ips)
        wakeups.poke()

    watch = CliqueWatch(client, settings, on_peers)
    child: subprocess.Popen[bytes] | None = None
    try:
        label_pod(client, settings)
        settings.imex_dir.mkdir(parents=True, exist_ok=True)
        write_file(settings.config_file, config_text(settings))
        current = watch.peers_now()
        write_file(settings.nodes_file, "\n".join(current) + "\n")
        imex = settings.imex_bin_dir / "nvidia-imex"
        child = subprocess.Popen([str(imex), "-c", str(settings.config_file)])
        started = time.monotonic()
        logger.info("nvidia-imex started", extra={"pid": child.pid, "domain": settings.domain_uid,
                                                  "clique": settings.clique_id,
                                                  "peers": ",".join(current)})  # fmt: skip
        threading.Thread(target=watch.run, name="clique-watch", daemon=True).start()
        reload_due = False
        while True:
            got = wakeups.wait(0.1 if reload_due else 1.0)
            if any(s in got for s in _STOP):
                return 0
            code = child.poll()
            if code is not None:
                logger.error("nvidia-imex exited with %d", code)
                return 1
            with lock:
                latest = pending[-1] if pending else None
                pending.clear()
            if latest is not None and latest != current:
                write_file(settings.nodes_file, "\n".join(latest) + "\n")
                current = latest
                reload_due = True
                logger.info("peers changed", extra={"peers": ",".join(latest)})
            if reload_due and (
                catches(child.pid, signal.SIGUSR1)
                or time.monotonic() - started > settings.reload_grace_s
            ):
                child.send_signal(signal.SIGUSR1)
                reload_due = False
    except OSError as exc:
        raise DaemonError(f"cannot run nvidia-imex: {exc}") from exc
    finally:
        watch.stop()
        if child is not None and child.poll() is None:
            child.terminate()
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
        wakeups.uninstall()


def check(imex_dir: Path, imex_bin_dir: Path, timeout_s: float = 10.0) -> tuple[bool, str]:
    """``nvidia-imex-ctl -q``: (READY?, what it said)."""
    ctl = imex_bin_dir / "nvidia-imex-ctl"
    try:
        done = subprocess.run(
            [str(ctl), "-q", "-c", str(imex_dir / CONFIG_FILE)],
            capture_output=True, text=True, timeout=timeout_s, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    said = (done.stdout.strip() or done.stderr.strip())[:200]
    return done.stdout.strip() == "READY", said
