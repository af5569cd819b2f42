"""A kube-scheduler configuration file (``KubeSchedulerConfiguration``, ``--config``)
for the dev control plane: read and checked here, then overlaid with what the control
plane must set itself.

With ``--config`` kube-scheduler ignores its deprecated flags (``--kubeconfig``,
``--kube-api-qps``, ``--kube-api-burst``, ``--profiling``; its ``--help`` says so), so
the cluster's kubeconfig, client rate limits and profiling go into the file's
``clientConnection`` and ``enableProfiling`` instead, and leader election is turned off
as ``--leader-elect=false`` does without one. Everything else, profiles included, is
the admin's file as written."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

API_VERSION = "kubescheduler.config.k8s.io/v1"
KIND = "KubeSchedulerConfiguration"
DEFAULT_SCHEDULER = "default-scheduler"


class SchedulerConfigError(ValueError):
    """The file is not a usable KubeSchedulerConfiguration; the message names the field."""


@dataclass(frozen=True)
class SchedulerConfig:
    """A checked KubeSchedulerConfiguration and where it came from."""

    source: str
    document: Mapping[str, Any]

    @property
    def profile_names(self) -> tuple[str, ...]:
        """``schedulerName`` of each profile, in order; a file without profiles has the
        default one."""
        profiles = self.document.get("profiles") or []
        return tuple(p.get("schedulerName", DEFAULT_SCHEDULER) for p in profiles) or (
            DEFAULT_SCHEDULER,
        )

    def effective(
        self,
        kubeconfig: Path,
        *,
        qps: int | None = None,
        burst: int | None = None,
        profiling: bool = False,
    ) -> dict[str, Any]:
        """The document the control plane writes for ``--config``: the file's, with the
        client connection, profiling and leader election the cluster needs."""
        doc = copy.deepcopy(dict(self.document))
        conn = dict(doc.get("clientConnection") or {})
        conn["kubeconfig"] = str(kubeconfig)
        if qps is not None:
            conn["qps"] = qps
        if burst is not None:
            conn["burst"] = burst
        doc["clientConnection"] = conn
        doc["enableProfiling"] = profiling
        election = dict(doc.get("leaderElection") or {})
        election["leaderElect"] = False
        doc["leaderElection"] = election
        return doc


def parse_scheduler_config(text: str, source: str = "<text>") -> SchedulerConfig:
    """Check the parts the control plane and the replay rely on; kube-scheduler itself
    validates the rest (plugins, weights) and refuses to start on an error."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SchedulerConfigError(f"{source}: not YAML: {exc}") from exc
    if not isinstance(doc, Mapping):
        raise SchedulerConfigError(f"{source}: want a KubeSchedulerConfiguration mapping")
    if doc.get("apiVersion") != API_VERSION:
        raise SchedulerConfigError(
            f"{source}: apiVersion: want {API_VERSION}, got {doc.get('apiVersion')!r}"
        )
    if doc.get("kind") != KIND:
        raise SchedulerConfigError(f"{source}: kind: want {KIND}, got {doc.get('kind')!r}")
    conn = doc.get("clientConnection")
    if conn is not None and not isinstance(conn, Mapping):
        raise SchedulerConfigError(f"{source}: clientConnection: want a mapping")
    profiles = doc.get("profiles")
    if profiles is not None and not isinstance(profiles, list):
        raise SchedulerConfigError(f"{source}: profiles: want a list")
    seen: set[str] = set()
    for i, profile in enumerate(profiles or []):
        if not isinstance(profile, Mapping):
            raise SchedulerConfigError(f"{source}: profiles[{i}]: want a mapping")
        name = profile.get("schedulerName", DEFAULT_SCHEDULER)
        if not isinstance(name, str) or not name:
            raise SchedulerConfigError(
                f"{source}: profiles[{i}].schedulerName: want a non-empty string"
            )
        if name in seen:
            raise SchedulerConfigError(
                f"{source}: profiles[{i}].schedulerName: {name!r} appears twice"
            )
        seen.add(name)
    return SchedulerConfig(source, doc)


def read_scheduler_config(path: Path) -> SchedulerConfig:
    """:func:`parse_scheduler_config` of a file; an unreadable file is an OSError."""
    return parse_scheduler_config(path.read_text(encoding="utf-8"), str(path))
