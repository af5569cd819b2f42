"""Child processes of the control plane: start, wait until healthy, stop by PID.

Each component writes stdout and stderr to its own log file in the run's
directory, so a failure can be explained afterwards (:meth:`Component.log_tail`).
Children get ``PR_SET_PDEATHSIG`` so that a hard-killed test run cannot leak
an apiserver onto the shared machine, and they are stopped by their own PID
(SIGTERM, then SIGKILL), never by name.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


class ComponentError(RuntimeError):
    """A component failed to start or became unhealthy; the message has its log tail."""


def free_loopback_ports(count: int) -> list[int]:
    """Ports that are free on 127.0.0.1 right now (all held open until chosen, so distinct)."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _die_with_parent_hook() -> Callable[[], None]:
    """A pre-exec hook that makes the child get SIGKILL when its parent dies.

    libc is resolved here, in the parent, so the forked child only makes the
    one prctl call (no dlopen between fork and exec).
    """
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    return hook


def http_ok(url: str, context: ssl.SSLContext | None, timeout: float = 2.0) -> tuple[bool, str]:
    """GET ``url``; (True, body) on HTTP 200, else (False, reason)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as resp:  # noqa: S310
            body = resp.read(4096).decode("utf-8", "replace")
            return resp.status == 200, body
    except urllib.error.HTTPError as err:
        return False, f"HTTP {err.code}: {err.read(2048).decode('utf-8', 'replace')}"
    except (urllib.error.URLError, OSError) as err:
        return False, str(err)


def terminate(proc: subprocess.Popen[bytes], grace: float, what: str) -> None:
    """SIGTERM by PID, wait ``grace`` seconds, then SIGKILL: a process that ignores
    SIGTERM must not outlive the run."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        logger.warning("process ignored SIGTERM, killing", extra={"what": what, "pid": proc.pid})
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


class Component:
    """One control-plane process with its log file."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_dir: Path,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = dict(env) if env is not None else None
        self.log_path = log_dir / f"{name}.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> None:
        logger.debug("starting component", extra={"component": self.name, "argv": self.argv})
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                # Own session: a terminal Ctrl-C reaches only us; we stop the
                # children in order ourselves.
                start_new_session=True,
                preexec_fn=_die_with_parent_hook(),
            )

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def wait_healthy(self, check: Callable[[], tuple[bool, str]], deadline: float) -> float:
        """Poll ``check`` until it passes; returns the seconds waited.

        Fails fast (with the log tail) when the process exits instead.
        """
        start = time.monotonic()
        last = "not checked yet"
        while time.monotonic() < deadline:
            if not self.running():
                code = self._proc.returncode if self._proc else None
                raise ComponentError(
                    f"{self.name} exited with code {code} before becoming healthy; "
                    f"last check: {last}\n{self.log_tail()}"
                )
            ok, last = check()
            if ok:
                return time.monotonic() - start
            time.sleep(0.1)
        raise ComponentError(
            f"{self.name} not healthy after {time.monotonic() - start:.1f}s; "
            f"last check: {last}\n{self.log_tail()}"
        )

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM by PID, wait ``grace`` seconds, then SIGKILL."""
        if self._proc is not None:
            terminate(self._proc, grace, self.name)

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the log, headed by the component name and path."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(0, os.SEEK_END)
                size = log.tell()
                log.seek(max(0, size - 64 * 1024))
                text = log.read().decode("utf-8", "replace")
        except OSError as err:
            text = f"(no log: {err})"
        tail = "\n".join(text.splitlines()[-lines:])
        return f"----- {self.name} ({self.log_path}) -----\n{tail}"
