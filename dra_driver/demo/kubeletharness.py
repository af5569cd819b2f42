"""Python side of the Go kubelet harness (tests/go/kubelet).

The harness links the kubelet's own plugin manager and DRA manager; this
module starts it as a child process and speaks its line protocol: one JSON
request per line on stdin, one JSON reply per line on stdout. Used by the
full-stack tests and by ``dra-driver demo``. Test/demo tooling only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import signal
import subprocess
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

HARNESS_ENV = "DRA_KUBELET_HARNESS"
"""Path of a prebuilt harness binary; else scripts/build-kubelet-harness.sh builds it."""


class HarnessError(RuntimeError):
    """The harness failed to start, died, timed out or answered ``ok: false``."""

    def __init__(self, message: str, reply: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.reply: dict[str, Any] = dict(reply or {})


def find_harness(repo: Path, env: Mapping[str, str] | None = None) -> Path:
    """The harness binary: ``$DRA_KUBELET_HARNESS`` or built (and cached) by the script."""
    env = os.environ if env is None else env
    if env.get(HARNESS_ENV):
        path = Path(env[HARNESS_ENV])
        if not os.access(path, os.X_OK):
            raise HarnessError(f"{HARNESS_ENV}={path} is not an executable file")
        return path
    script = repo / "scripts" / "build-kubelet-harness.sh"
    if not script.is_file():
        raise HarnessError(f"set {HARNESS_ENV}: no {script} to build the kubelet harness with")
    result = subprocess.run(
        [str(script)], cwd=repo, stdout=subprocess.PIPE, stderr=None, text=True, check=False
    )
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise HarnessError(f"{script} failed with exit code {result.returncode}")
    return Path(lines[-1])


@dataclass(frozen=True)
class PreparedContainer:
    """What the kubelet would hand to the container runtime for one container."""

    cdi_devices: tuple[str, ...]
    claims: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class PrepareResult:
    pod_uid: str
    containers: dict[str, PreparedContainer] = field(default_factory=dict)
    elapsed_ms: float = 0.0


class KubeletHarness:
    """One harness process playing the kubelet of ``node_name``.

    ``root_dir`` is the kubelet root: the plugin manager watches
    ``root_dir/plugins_registry`` and the DRA checkpoint lives in
    ``root_dir/dra-state``, which survives :meth:`restart` as on a real node.
    """

    def __init__(
        self,
        *,
        binary: Path,
        kubeconfig: Path,
        node_name: str,
        root_dir: Path,
        log_path: Path,
        verbosity: int = 4,
    ) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig
        self.node_name = node_name
        self.root_dir = root_dir
        self.log_path = log_path
        self.verbosity = verbosity
        self.registry_dir = root_dir / "plugins_registry"
        self.plugins_dir = root_dir / "plugins"
        self.state_dir = root_dir / "dra-state"
        self._proc: subprocess.Popen[str] | None = None
        self._replies: queue.Queue[str | None] = queue.Queue()
        self._lock = threading.Lock()
        self._next_id = 0
        self._reader: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 30.0) -> dict[str, Any]:
        """Start the process and wait for its ``ready`` line."""
        if self.running():
            raise HarnessError("harness already running")
        self.root_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = [
            str(self.binary),
            f"--kubeconfig={self.kubeconfig}",
            f"--node-name={self.node_name}",
            f"--root-dir={self.root_dir}",
            f"--v={self.verbosity}",
        ]
        self._replies = queue.Queue()
        with self.log_path.open("a") as log:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                bufsize=1,
                start_new_session=True,
            )
        self._reader = threading.Thread(
            target=self._read, args=(self._proc, self._replies), daemon=True, name="harness-out"
        )
        self._reader.start()
        ready = self._receive(timeout, "ready line")
        if not ready.get("ready"):
            raise HarnessError(f"unexpected first line from harness: {ready}", ready)
        logger.info("kubelet harness started", extra={"pid": self.pid, "node": self.node_name})
        return ready

    @staticmethod
    def _read(proc: subprocess.Popen[str], out: queue.Queue[str | None]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.put(line)
        out.put(None)

    def _receive(self, timeout: float, what: str) -> dict[str, Any]:
        try:
            line = self._replies.get(timeout=timeout)
        except queue.Empty:
            raise HarnessError(
                f"no {what} from the kubelet harness within {timeout:.0f}s; {self.log_tail()}"
            ) from None
        if line is None:
            raise HarnessError(
                f"kubelet harness exited while waiting for {what}; {self.log_tail()}"
            )
        decoded: dict[str, Any] = json.loads(line)
        return decoded

    def call(
        self, op: str, *, timeout: float = 90.0, check: bool = True, **fields: Any
    ) -> dict[str, Any]:
        """Send one request and return its reply; ``check`` raises on ``ok: false``."""
        with self._lock:
            proc = self._proc
            if proc is None or proc.poll() is not None or proc.stdin is None:
                raise HarnessError(f"kubelet harness is not running; {self.log_tail()}")
            self._next_id += 1
            request = {"id": self._next_id, "op": op, **fields}
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
            reply = self._receive(timeout, f"reply to {op}")
        if reply.get("id") != request["id"]:
            raise HarnessError(f"reply out of order: sent {request}, got {reply}", reply)
        if check and not reply.get("ok"):
            raise HarnessError(f"kubelet harness {op} failed: {reply.get('error')}", reply)
        return reply

    # -- the kubelet operations ------------------------------------------------

    def wait_registered(self, driver: str, *, after_seq: int = 0, timeout: float = 30.0) -> int:
        """Block until the plugin manager registered ``driver``; returns the event's seq."""
        reply = self.call(
            "wait_registered",
            driver=driver,
            after_seq=after_seq,
            timeout_s=timeout,
            timeout=timeout + 10,
        )
        seq: int = reply["event"]["seq"]
        return seq

    def registrations(self) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = self.call("registrations")["events"]
        return events

    def last_seq(self) -> int:
        events = self.registrations()
        return max((int(e["seq"]) for e in events), default=0)

    def prepare(self, namespace: str, pod: str, *, check: bool = True) -> PrepareResult:
        """The kubelet's PrepareResources + GetResources for every container."""
        reply = self.call("prepare", namespace=namespace, pod=pod, check=check)
        if not reply.get("ok"):
            raise HarnessError(str(reply.get("error")), reply)
        containers = {
            name: PreparedContainer(
                cdi_devices=tuple(info.get("cdi_devices") or ()),
                claims=tuple(info.get("claims") or ()),
            )
            for name, info in (reply.get("containers") or {}).items()
        }
        return PrepareResult(reply["pod_uid"], containers, float(reply.get("elapsed_ms", 0.0)))

    def unprepare(self, namespace: str, pod: str, *, finalize: bool = True) -> dict[str, Any]:
        """The kubelet's UnprepareResources, then the final delete of a terminating pod."""
        return self.call("unprepare", namespace=namespace, pod=pod, finalize=finalize)

    def prepared_pods(self) -> list[tuple[str, str]]:
        """(namespace, name) of pods prepared here and not unprepared yet."""
        keys: list[str] = self.call("prepared")["pods"]
        return [(k.split("/", 1)[0], k.split("/", 1)[1]) for k in keys]

    def set_running(self, namespace: str, pod: str) -> dict[str, Any]:
        return self.call("set_running", namespace=namespace, pod=pod)

    # -- lifecycle -------------------------------------------------------------

    def stop(self, grace: float = 10.0) -> None:
        """Ask the harness to exit; SIGTERM, then SIGKILL, by PID."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is not None:
            self._close_pipes(proc)
            return
        with contextlib.suppress(HarnessError, OSError, ValueError):
            self.call("shutdown", timeout=grace)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        self._close_pipes(proc)

    def _close_pipes(self, proc: subprocess.Popen[str]) -> None:
        """Close our ends once the process is gone (the reader sees EOF first)."""
        if self._reader is not None:
            self._reader.join(timeout=5)
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()

    def kill(self) -> None:
        """SIGKILL, as when a kubelet crashes."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        if proc is not None:
            self._close_pipes(proc)

    def restart(self, *, kill: bool = False, timeout: float = 30.0) -> dict[str, Any]:
        """Stop (or SIGKILL) and start again with the same root dir and checkpoint."""
        if kill:
            self.kill()
        else:
            self.stop()
        return self.start(timeout=timeout)

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as err:
            return f"(no harness log: {err})"
        tail = "\n".join(text.splitlines()[-lines:])
        return f"----- kubelet harness ({self.log_path}) -----\n{tail}"

    def __enter__(self) -> KubeletHarness:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
