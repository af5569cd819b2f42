"""Prometheus and promtool for the alert and dashboard tests, built from
tests/go/prometheus by scripts/build-prometheus.sh (never mocked), and a
Prometheus server run on loopback against static targets."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from dra_driver.devcluster.processes import Component, free_loopback_ports, http_ok
from tests.e2e.helm import ROOT


def build_prometheus() -> Path:
    """The bin directory with ``prometheus`` and ``promtool`` (built once, cached)."""
    done = subprocess.run([str(ROOT / "scripts" / "build-prometheus.sh")], cwd=ROOT,
                          capture_output=True, text=True, check=False)  # fmt: skip
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(
            f"scripts/build-prometheus.sh failed ({done.returncode}):\n{done.stderr}"
        )
    return Path(lines[-1])


def rule_groups(objs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The rendered PrometheusRule's groups as a plain Prometheus rule file."""
    (rule,) = [o for o in objs if o["kind"] == "PrometheusRule"]
    return {"groups": rule["spec"]["groups"]}


class PrometheusServer:
    """One ``prometheus`` scraping static loopback targets, its TSDB in ``workdir``."""

    def __init__(
        self,
        binary: Path,
        workdir: Path,
        targets: Sequence[tuple[str, Mapping[str, str]]],
        *,
        job: str = "dra-driver-metrics",
        interval: str = "1s",
    ) -> None:
        (self.port,) = free_loopback_ports(1)
        self.url = f"http://127.0.0.1:{self.port}"
        workdir.mkdir(parents=True, exist_ok=True)
        config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "scrape_configs": [{
                "job_name": job,
                "static_configs": [{"targets": [t], "labels": dict(labels)}
                                   for t, labels in targets],
            }],
        }  # fmt: skip
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self._component = Component("prometheus", [
            str(binary), f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn",
        ], workdir)  # fmt: skip

    def start(self, timeout: float = 60.0) -> None:
        self._component.start()
        self._component.wait_healthy(
            lambda: http_ok(f"{self.url}/-/ready", None), time.monotonic() + timeout
        )

    def stop(self) -> None:
        self._component.stop()

    def log_tail(self) -> str:
        return self._component.log_tail()

    def api(self, path: str, params: Mapping[str, str] | Sequence[tuple[str, str]]) -> Any:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=30) as resp:
            answer = json.loads(resp.read())
        assert answer["status"] == "success", answer
        return answer["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result (vector entries with ``metric`` and ``value``)."""
        data = self.api("query", {"query": expr})
        assert data["resultType"] == "vector", data
        return list(data["result"])

    def label_values(self, label: str, match: str) -> list[str]:
        return list(self.api(f"label/{label}/values", [("match[]", match)]))
