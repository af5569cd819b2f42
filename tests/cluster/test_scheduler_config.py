"""The kube-scheduler configuration file the dev control plane and the trace replay
take (``--scheduler-config``): its checks, what the control plane writes for
``--config``, and the profiles shipped under deploy/scheduler/. No binaries needed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from bench.trace_replay.__main__ import main as replay_main
from dra_driver.devcluster import Binaries, ClusterOptions
from dra_driver.devcluster.certs import generate_certs
from dra_driver.devcluster.controlplane import (
    controller_manager_argv,
    scheduler_argv,
    write_scheduler_config,
)
from dra_driver.devcluster.schedconfig import (
    SchedulerConfigError,
    parse_scheduler_config,
    read_scheduler_config,
)

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted((REPO / "deploy" / "scheduler").glob("*.yaml"))
TRIALS = sorted((REPO / "bench" / "trace_replay" / "scheduler-profiles").glob("*.yaml"))
HEAD = "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("- a list\n", "want a KubeSchedulerConfiguration mapping"),
        ("apiVersion: kubescheduler.config.k8s.io/v1beta3\nkind: KubeSchedulerConfiguration\n",
         "apiVersion: want kubescheduler.config.k8s.io/v1"),
        ("apiVersion: kubescheduler.config.k8s.io/v1\nkind: Pod\n", "kind: want"),
        (HEAD + "profiles: {a: 1}\n", "profiles: want a list"),
        (HEAD + "profiles: [3]\n", "profiles[0]: want a mapping"),
        (HEAD + "profiles: [{schedulerName: ''}]\n", "profiles[0].schedulerName"),
        (HEAD + "profiles: [{schedulerName: a}, {schedulerName: a}]\n",
         "profiles[1].schedulerName: 'a' appears twice"),
        (HEAD + "profiles: [{}, {schedulerName: default-scheduler}]\n",
         "profiles[1].schedulerName: 'default-scheduler' appears twice"),
        (HEAD + "clientConnection: 5\n", "clientConnection: want a mapping"),
        ("a: [\n", "not YAML"),
    ],
)  # fmt: skip
def test_bad_configuration_is_refused_naming_the_field(text: str, field: str) -> None:
    with pytest.raises(SchedulerConfigError, match="^cfg.yaml: .*" + re.escape(field)):
        parse_scheduler_config(text, "cfg.yaml")


def test_profile_names_default_when_unnamed_or_absent() -> None:
    assert parse_scheduler_config(HEAD).profile_names == ("default-scheduler",)
    two = parse_scheduler_config(HEAD + "profiles: [{}, {schedulerName: pack}]\n")
    assert two.profile_names == ("default-scheduler", "pack")


def test_effective_config_carries_the_client_settings_the_flags_would(tmp_path: Path) -> None:
    """kube-scheduler ignores --kubeconfig and --kube-api-qps/burst with --config: the
    written file must hold them, and keep the admin's own settings and profiles."""
    config = parse_scheduler_config(
        HEAD + "clientConnection: {contentType: application/json, qps: 5}\n"
        "leaderElection: {leaderElect: true, resourceName: x}\n"
        "profiles: [{schedulerName: pack, percentageOfNodesToScore: 100}]\n"
    )
    options = ClusterOptions(client_qps=1000, client_burst=2000, scheduler_config=config)
    kubeconfig = tmp_path / "admin.kubeconfig"
    path = write_scheduler_config(options, tmp_path, kubeconfig)
    assert path is not None and path.stat().st_mode & 0o077 == 0
    doc = yaml.safe_load(path.read_text())
    assert doc["clientConnection"] == {
        "contentType": "application/json", "qps": 1000, "burst": 2000,
        "kubeconfig": str(kubeconfig),
    }  # fmt: skip
    assert doc["leaderElection"] == {"leaderElect": False, "resourceName": "x"}
    assert doc["enableProfiling"] is False
    assert doc["profiles"] == [{"schedulerName": "pack", "percentageOfNodesToScore": 100}]
    # the caller's document is not changed by the overlay
    assert config.document["clientConnection"] == {"contentType": "application/json", "qps": 5}
    assert write_scheduler_config(ClusterOptions(), tmp_path, kubeconfig) is None


def test_scheduler_argv_uses_the_file_instead_of_the_ignored_flags(tmp_path: Path) -> None:
    certs = generate_certs(tmp_path)
    binaries = Binaries(*(tmp_path / n for n in ("etcd", "apiserver", "sched", "kcm")))
    kubeconfig = tmp_path / "admin.kubeconfig"
    options = ClusterOptions(
        client_qps=1000, client_burst=2000, scheduler_config=parse_scheduler_config(HEAD)
    )
    config = tmp_path / "kube-scheduler-config.yaml"
    argv = scheduler_argv(binaries, options, certs, kubeconfig, 1, config)
    assert f"--config={config}" in argv
    assert not [a for a in argv if a.startswith(("--kube-api-", "--kubeconfig"))]
    # /configz is readable (as /healthz), to show the configuration in force
    (allow,) = [a for a in argv if a.startswith("--authorization-always-allow-paths=")]
    assert "/configz" in allow.split("=")[1].split(",")
    plain = scheduler_argv(binaries, ClusterOptions(), certs, kubeconfig, 1)
    assert not [a for a in plain if a.startswith("--authorization-always-allow-paths")]
    # the controller manager has no such file: its flags stay
    kcm = controller_manager_argv(binaries, options, certs, kubeconfig, 1)
    assert "--kube-api-qps=1000" in kcm and f"--kubeconfig={kubeconfig}" in kcm


@pytest.mark.parametrize("path", SHIPPED + TRIALS, ids=lambda p: p.name)
def test_every_profile_file_parses_and_keeps_a_default_profile(path: Path) -> None:
    """Each file the docs measure loads as kube-scheduler's input, and its first
    profile is the default one (pods that select no profile still get scheduled)."""
    config = read_scheduler_config(path)
    assert config.profile_names[0] == "default-scheduler"
    assert set(config.profile_names) <= {"default-scheduler", "gpu-packing"}


def test_shipped_packing_profile_is_most_allocated_beside_an_untouched_default() -> None:
    config = read_scheduler_config(REPO / "deploy" / "scheduler" / "gpu-packing.yaml")
    assert config.profile_names == ("default-scheduler", "gpu-packing")
    profile = config.document["profiles"][1]
    (fit,) = [c for c in profile["pluginConfig"] if c["name"] == "NodeResourcesFit"]
    assert fit["args"]["scoringStrategy"]["type"] == "MostAllocated"
    assert config.document["profiles"][0] == {"schedulerName": "default-scheduler"}


def test_replay_refuses_a_profile_the_configuration_lacks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    shipped = str(REPO / "deploy" / "scheduler" / "gpu-packing.yaml")
    code = replay_main(["--mode", "consumable", "--subset", "10", "--scheduler-config",
                        shipped, "--scheduler-name", "packing"])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert "--scheduler-name packing: not a profile" in err and "gpu-packing" in err
    assert replay_main(["--mode", "consumable", "--scheduler-name", "gpu-packing"]) == 2
    assert "it has default-scheduler" in capsys.readouterr().err
