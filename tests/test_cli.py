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


def test_log_flags_are_accepted_after_the_subcommand_too() -> None:
    result = _run(
        "--log-format", "text", "discover", "--emulate", "t4", "-o", "json",
        "--log-format", "json", "--log-level", "debug",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stderr.splitlines()]
    assert records and all(r["time"].endswith("Z") for r in records)  # JSON: the later one won
    quiet = _run("discover", "--emulate", "t4", "--log-level", "error")
    assert quiet.returncode == 0 and quiet.stderr == ""


def _actions(parser: Any) -> list[tuple[str, Any]]:
    import argparse

    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += [(f"{name} {flag}", a) for flag, a in _actions(sub)]
        elif any(o.startswith("--") for o in action.option_strings):
            out.append((action.option_strings[-1], action))
    return out


def test_every_long_flag_has_one_env_variable_named_in_its_help() -> None:
    from dra_driver.cli import build_parser
    from dra_driver.envflags import env_name

    parser = build_parser(environ={})
    checked = 0
    for where, action in _actions(parser):
        long = next(o for o in action.option_strings if o.startswith("--"))
        if long in ("--help", "--version"):
            continue
        assert f"(env {env_name(long)})" in (action.help or ""), where
        assert env_name(long).startswith("DRA_") and env_name(long).count("DRA_") == 1
        checked += 1
    assert checked > 40


def test_env_variables_set_defaults_and_flags_win() -> None:
    from dra_driver.cli import build_parser
    from dra_driver.settings import daemon_settings

    environ = {
        "DRA_NODE_NAME": "node-7",  # satisfies the required flag
        "DRA_CDI_DIR": "/run/cdi-x",
        "DRA_TAINT_DEGRADED": "true",
        "DRA_HEALTH_PORT": "8080",
        "DRA_LOG_LEVEL": "debug",
        "DRA_ROLLING_UPDATE_UID": "",  # empty: unset, as a DaemonSet may render it
        "DRA_CDI_HOOK_SOURCE": "none",
        "DRA_DYNAMIC_MIG_ATTRIBUTES": "compact",
    }
    parser = build_parser(environ=environ)
    args = parser.parse_args(["kubelet-plugin"])
    gpu = daemon_settings(args).gpu
    assert gpu.placement_attributes == "compact"
    hook = Path("/var/lib/kubelet/plugins/gpu.nvidia.com/nvidia-cdi-hook")
    assert (gpu.cdi_hook_path, gpu.cdi_hook_local_path, gpu.cdi_hook_source) == (hook, hook, None)
    args = parser.parse_args(["kubelet-plugin", "--cdi-hook-source=/opt/hook",
                              "--cdi-hook-path=/usr/bin/nvidia-cdi-hook"])  # fmt: skip
    gpu = daemon_settings(args).gpu
    assert (gpu.cdi_hook_path, gpu.cdi_hook_source) == (
        Path("/usr/bin/nvidia-cdi-hook"), Path("/opt/hook"),
    )  # fmt: skip
    args = parser.parse_args(["kubelet-plugin"])
    assert (args.node_name, str(args.cdi_dir), args.taint_degraded) == (
        "node-7",
        "/run/cdi-x",
        True,
    )
    assert (args.health_port, args.log_level, args.rolling_update_uid) == (8080, "debug", None)
    args = parser.parse_args(["kubelet-plugin", "--cdi-dir=/etc/cdi", "--health-port=-1"])
    assert (str(args.cdi_dir), args.health_port) == ("/etc/cdi", -1)


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"DRA_TAINT_DEGRADED": "maybe"}, "DRA_TAINT_DEGRADED='maybe': expected one of 1, true"),
        ({"DRA_HEALTH_PORT": "http"}, "DRA_HEALTH_PORT='http': 'http' is not a port"),
        ({"DRA_LOG_FORMAT": "xml"}, "DRA_LOG_FORMAT='xml': invalid choice; allowed: text, json"),
    ],
)
def test_a_bad_env_value_is_named(environ: dict[str, str], message: str) -> None:
    env = {**os.environ, **environ}
    result = _run("kubelet-plugin", "--node-name=n", "--help", env=env)
    assert result.returncode == 2
    assert message in result.stderr


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--driver-name=gpu_nvidia.com"], "--driver-name (DRA_DRIVER_NAME) is 'gpu_nvidia.com'"),
        (["--health-interval=0"], "--health-interval (DRA_HEALTH_INTERVAL) is 0: allowed 1 to 300"),
        (["--cleanup-interval=0"], "--cleanup-interval (DRA_CLEANUP_INTERVAL) is 0: allowed 10"),
        (["--rediscover-interval=1"], "is 1: allowed 0 (off) or 5 to 86400 seconds"),
        (["--cleanup-interval=nan"], "--cleanup-interval (DRA_CLEANUP_INTERVAL) is nan"),
        (["--rolling-update-uid=../x"], "--rolling-update-uid (DRA_ROLLING_UPDATE_UID) is '../x'"),
        (["--node-name=Node_1"], "--node-name (DRA_NODE_NAME) is 'Node_1'"),
        (
            ["--mps-daemons=pod", "--mps-daemon-image=i"],
            "--namespace (DRA_NAMESPACE) is None: --mps-daemons pod needs this plugin's namespace",
        ),
        (
            ["--mps-daemons=pod", "--namespace=dra-driver"],
            "--mps-daemon-image (DRA_MPS_DAEMON_IMAGE) is empty: --mps-daemons pod needs the image",
        ),
        (
            [
                "--mps-daemons=pod",
                "--namespace=dra-driver",
                "--mps-daemon-image=i",
                "--mps-daemon-priority-class=Node_Critical",
            ],
            "--mps-daemon-priority-class (DRA_MPS_DAEMON_PRIORITY_CLASS) is 'Node_Critical'",
        ),
    ],
)
def test_invalid_settings_are_one_clear_line_and_exit_2(
    flags: list[str], message: str, tmp_path: Path
) -> None:
    result = _run("kubelet-plugin", "--node-name=n", *flags, "--state-dir", str(tmp_path / "s"))
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("dra-driver kubelet-plugin: ")
    assert message in result.stderr
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr
    assert not (tmp_path / "s").exists()  # nothing was started or written


TOOLING = ("dra_driver.commands.simulate", "dra_driver.commands.explain",
           "dra_driver.allocation", "dra_driver.cel", "celpy", "cel_expr_python")  # fmt: skip


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["kubelet-plugin", "--help"], id="help"),
        # Fails in settings validation, after the command's run() began.
        pytest.param(
            [
                "--log-level",
                "error",
                "kubelet-plugin",
                "--node-name=n",
                "--driver-name=Not_A_Name",
                "--health-port=-1",
            ],
            id="run",
        ),
    ],
)
def test_the_kubelet_plugin_command_loads_no_other_command(argv: list[str]) -> None:
    """The daemon loads only what it runs: the simulate/explain tooling (CEL, the
    allocator) stays out of the kubelet plugin's process."""
    code = (
        "import sys\n"
        "from dra_driver import cli\n"
        "try:\n"
        f"    cli.main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    loaded = done.stdout.split()
    assert "dra_driver.commands.kubelet_plugin" in loaded, done.stderr
    assert [m for m in loaded if m.startswith(TOOLING)] == []
    assert [m for m in loaded if m.startswith("dra_driver.commands.")] == [
        "dra_driver.commands.discover", "dra_driver.commands.kubelet_plugin",
        "dra_driver.commands.observability", "dra_driver.commands.pluginflags",
        "dra_driver.commands.slices",
    ]  # fmt: skip


@pytest.mark.parametrize(("command", "finalized"), [("kubelet-plugin", False), ("slices", True)])
def test_only_the_kubelet_plugin_skips_interpreter_finalization(
    command: str, finalized: bool
) -> None:
    """The plugin's process ends once its command returns (finalizing the interpreter
    freed the kubernetes client's models for over a second after SIGTERM); other commands
    exit normally, so their atexit handlers run."""
    script = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('finalized', flush=True))\n"
        f"sys.argv = ['dra-driver', {command!r}, '--node-name=n', '--emulate=no-such-profile']\n"
        "from dra_driver.cli import entry\n"
        "entry()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "no-such-profile" in done.stderr
    assert ("finalized" in done.stdout) is finalized


def test_the_mps_daemon_command_stays_small(tmp_path: Path) -> None:
    """The entry point of every MPS daemon pod: no API client, gRPC, NVML or metrics
    library is loaded, and a daemon that exits ends the command with its exit code."""
    code = (
        "import sys; from dra_driver import cli; "
        f"rc = cli.main(['mps-daemon', '--pipe-dir={tmp_path}', '--log-dir={tmp_path}', "
        f"'--mps-control=/bin/false', '--ready-file={tmp_path}/ready']); "
        "print(rc, sorted(m for m in ('kubernetes', 'grpc', 'pynvml', 'prometheus_client', "
        "'dra_driver.plugin.app', 'dra_driver.gpu.driver') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.stdout.split(" ", 1) == ["1", "[]\n"], done.stderr
    assert "the MPS control daemon exited" in done.stderr
    assert not (tmp_path / "ready").exists()
