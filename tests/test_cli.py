"""The ``dra-driver`` console script: version, help, structured logs, dev-cluster up."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dra_driver import __version__
from dra_driver.devcluster import ToolClient, api_client, find_binaries

# The installed console script, next to the interpreter running the tests.
SCRIPT = Path(sys.executable).parent / "dra-driver"


def _run(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, timeout=60, check=False, **kwargs
    )


def test_version_matches_package() -> None:
    result = _run("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"dra-driver {__version__}"


def test_help_lists_commands_and_global_options() -> None:
    result = _run("--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: dra-driver")
    for text in ("--log-format", "--log-level", "--version", "dev-cluster"):
        assert text in result.stdout


def test_rejects_unknown_log_format() -> None:
    result = _run("--log-format", "xml", "dev-cluster", "up")
    assert result.returncode == 2
    assert "invalid choice: 'xml'" in result.stderr


def test_json_log_lines_for_a_failing_command(tmp_path: Path) -> None:
    """Errors are structured too: one JSON object per line with the fields collectors use."""
    result = _run("--log-format", "json", "dev-cluster", "up", "--bin-dir", str(tmp_path))
    assert result.returncode == 2
    lines = [json.loads(line) for line in result.stderr.splitlines()]
    assert len(lines) == 1
    record = lines[0]
    assert record["level"] == "error"
    assert record["logger"] == "dra_driver.commands.devcluster"
    assert record["msg"] == "control-plane binaries unavailable"
    assert str(tmp_path) in record["error"] and "kube-apiserver" in record["error"]
    assert record["time"].endswith("Z")


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if text.encode() in cmdline:
            pids.append(int(proc.name))
    return pids


@pytest.mark.cluster
def test_dev_cluster_up_serves_until_sigterm(tmp_path: Path) -> None:
    bin_dir = find_binaries().etcd.parent
    workdir = tmp_path / "dev"
    env = {**os.environ, "DRA_K8S_BIN_DIR": str(bin_dir)}
    argv = [str(SCRIPT), "--log-format", "json", "dev-cluster", "up", "--workdir", str(workdir)]
    proc = subprocess.Popen(
        [*argv, "--node", "alpha", "--node", "beta"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        printed: dict[str, str] = {}
        deadline = time.monotonic() + 90
        for line in proc.stdout:
            key, _, value = line.partition(": ")
            printed[key] = value.strip()
            if line.startswith("Ctrl-C") or time.monotonic() > deadline:
                break
        assert Path(printed["kubeconfig"]) == workdir / "admin.kubeconfig"
        pki = workdir / "pki"
        client = ToolClient(
            api_client(
                printed["server"],
                pki / "ca.crt",
                cert_file=pki / "admin.crt",
                key_file=pki / "admin.key",
            )
        )
        nodes = client.get("/api/v1/nodes")["items"]
        assert sorted(n["metadata"]["name"] for n in nodes) == ["alpha", "beta"]
        assert len(_processes_mentioning(f"{workdir}/")) == 4  # etcd + 3 kube-* components

        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    records = [json.loads(line) for line in stderr.splitlines()]
    by_msg = {r["msg"]: r for r in records}
    ready = by_msg["control plane ready"]
    assert ready["logger"] == "dra_driver.devcluster.cluster"
    assert ready["level"] == "info"
    assert ready["server"] == printed["server"]
    assert 0 < ready["seconds"] < 90
    assert by_msg["stopping control plane"]["signal"] == "SIGTERM"
    assert by_msg["control plane stopped"]["logs"] == str(workdir / "logs")
    assert _processes_mentioning(f"{workdir}/") == []
