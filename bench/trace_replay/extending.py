"""The replay's scoring extender: ``dra-driver scoring-extender`` as a host process
next to the dev control plane, and the scheduler configuration that calls it (the
shipped ``deploy/scheduler/scoring-extender.yaml``'s ``extenders`` entry, its
``urlPrefix`` pointed at the process)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from dra_driver.devcluster.schedconfig import (
    API_VERSION,
    KIND,
    SchedulerConfig,
    parse_scheduler_config,
)

EXTENDER_FILE = (
    Path(__file__).resolve().parents[2] / "deploy" / "scheduler" / "scoring-extender.yaml"
)
REPO = Path(__file__).resolve().parents[2]


def with_extender(
    config: SchedulerConfig | None, port: int, weight: int | None = None
) -> SchedulerConfig:
    """``config`` (or kube-scheduler's defaults) plus the shipped extender entry calling
    ``127.0.0.1:port`` (``weight``: the file's unless given)."""
    shipped = yaml.safe_load(EXTENDER_FILE.read_text(encoding="utf-8"))
    (entry,) = shipped["extenders"]
    entry = dict(entry, urlPrefix=f"http://127.0.0.1:{port}")
    if weight is not None:
        entry["weight"] = weight
    doc: dict[str, Any] = (copy.deepcopy(dict(config.document)) if config
                           else {"apiVersion": API_VERSION, "kind": KIND})  # fmt: skip
    doc["extenders"] = [*(doc.get("extenders") or []), entry]
    source = f"{config.source if config else 'defaults'} + {EXTENDER_FILE.name}"
    return parse_scheduler_config(yaml.safe_dump(doc), source)


class ExtenderProcess:
    """``dra-driver scoring-extender`` on ``127.0.0.1:port`` with ``kubeconfig``."""

    def __init__(self, port: int, kubeconfig: Path, log: Path) -> None:
        self.port = port
        self._argv = [sys.executable, "-m", "dra_driver", "--log-level", "warning",
                      "scoring-extender", "--bind-address", f"127.0.0.1:{port}",
                      "--kubeconfig", str(kubeconfig)]  # fmt: skip
        self._log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60.0) -> None:
        """Start and wait until it has listed every kind (``/healthz`` 200)."""
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))  # fmt: skip
        with self._log.open("ab") as out:
            self.proc = subprocess.Popen(self._argv, stdout=out, stderr=out, env=env)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"scoring extender exited {self.proc.returncode}: {self._log}")
            try:
                url = f"http://127.0.0.1:{self.port}/healthz"
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200 and json.loads(resp.read()).get("ok"):
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"scoring extender not healthy within {timeout_s:.0f} s: {self._log}")

    def kill(self) -> None:
        """Gone at once (SIGKILL), as a crashed extender is."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
