"""The Helm chart as the real node deploys it: rendered with the Helm CLI built
from ``tests/go/helm`` (``scripts/build-helm.sh``), never with a copy of its
templates, so the node runs exactly what a cluster admin installs."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

HELM_ENV = "DRA_HELM"
RELEASE = "dra-driver"
NAMESPACE = "dra-driver"


class ChartError(RuntimeError):
    """Helm could not be built or refused to render (the message has its stderr)."""


def find_helm(repo: Path, env: Mapping[str, str] | None = None) -> Path:
    """``$DRA_HELM``, or the binary scripts/build-helm.sh builds once and caches."""
    env = os.environ if env is None else env
    if env.get(HELM_ENV):
        return Path(env[HELM_ENV])
    done = subprocess.run(
        [str(repo / "scripts" / "build-helm.sh")],
        cwd=repo, stdout=subprocess.PIPE, text=True, check=False,
    )  # fmt: skip
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise ChartError(f"scripts/build-helm.sh failed ({done.returncode})")
    return Path(lines[-1])


def render(
    helm: Path,
    chart: Path,
    values: Mapping[str, str],
    namespace: str = NAMESPACE,
    release: str = RELEASE,
) -> list[dict[str, Any]]:
    """``helm template`` with ``--set key=value`` for each entry; the objects in order."""
    argv = [str(helm), "template", release, str(chart), "--namespace", namespace]
    for key, value in values.items():
        argv += ["--set", f"{key}={value}"]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    if done.returncode != 0:
        raise ChartError(f"helm template failed: {done.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def daemonset(objs: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = (o for o in objs if o["kind"] == "DaemonSet")
    return found


def resolve_env(container: Mapping[str, Any], fields: Mapping[str, str]) -> dict[str, str]:
    """The container's env as the kubelet gives it (downward-API ``fieldRef``s resolved
    from ``fields``, e.g. ``{"spec.nodeName": ..., "metadata.uid": ...}``)."""
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = str(item["value"])
        else:
            env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
    return env
