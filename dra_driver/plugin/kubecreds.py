"""Credentials for the plugin's API client, as kubectl and client-go find them.

* kubeconfig: one file or a ``KUBECONFIG``-style list (``a:b``): the first file
  that names a cluster, user or context wins, as does the first
  ``current-context``; relative paths are relative to the file that said them;
  ``--context`` picks another context;
* client certificates by file are re-read when the files change (rotation by
  cert-manager or a kubelet-style rotator), token files are re-read;
* ``exec`` users run a credential plugin (``client.authentication.k8s.io``
  v1 or v1beta1 ``ExecCredential``): token or client certificate, cached
  until its ``expirationTimestamp`` and refreshed when the server says 401;
* in-cluster: the pod's projected ServiceAccount token.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_driver import yamlfiles
from dra_driver.errors import DriverError

IN_CLUSTER_SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
EXEC_TIMEOUT_S = 60.0
EXPIRY_MARGIN_S = 10.0
"""A credential this close to its expiry is fetched again before use."""


class KubeError(DriverError):
    """Any failure talking to the API server."""


class KubeConfigError(KubeError):
    """Credentials could not be loaded; names the file and the missing piece."""


@dataclass(frozen=True)
class ExecConfig:
    """A kubeconfig ``user.exec`` entry."""

    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    api_version: str = EXEC_API_VERSIONS[0]
    provide_cluster_info: bool = False
    base: Path = Path()
    """Directory of the kubeconfig: a relative command with a ``/`` is taken from there."""


@dataclass(frozen=True)
class KubeConfig:
    """Where and how to reach the API server."""

    server: str
    ca_pem: str | None = None
    client_cert_pem: str | None = None
    client_key_pem: str | None = None
    token: str | None = None
    token_file: Path | None = None
    insecure_skip_tls_verify: bool = False
    client_cert_file: Path | None = None
    """Set when the certificate came from a file: re-read when the file changes."""
    client_key_file: Path | None = None
    exec: ExecConfig | None = None


def _files(paths: Path | str | Sequence[Path]) -> list[Path]:
    if isinstance(paths, Path | str):
        return [Path(p) for p in str(paths).split(os.pathsep) if p]
    return list(paths)


@dataclass
class _Merged:
    entries: dict[str, dict[str, tuple[dict[str, Any], Path]]] = field(default_factory=dict)
    current: str | None = None


def _parse(path: Path) -> object:
    """A kubeconfig file's document. JSON (``kubectl config view -o json``) is parsed
    without PyYAML, whose import costs ~20 ms of the daemon's start; anything else is
    YAML, read with libyaml when it is there."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise KubeConfigError(f"kubeconfig {path}: cannot read: {exc.strerror}") from exc
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text)
        except ValueError:
            pass  # YAML flow style also starts with "{"
    import yaml  # only YAML kubeconfig files need it, not the in-cluster config

    try:
        return yamlfiles.safe_load(text)
    except yaml.YAMLError as exc:
        raise KubeConfigError(f"kubeconfig {path}: cannot read: {exc}") from exc


def _merge(files: Sequence[Path]) -> _Merged:
    merged = _Merged({"clusters": {}, "users": {}, "contexts": {}})
    read = 0
    for path in files:
        if len(files) > 1 and not path.exists():
            continue  # as kubectl: missing files of a list are skipped
        doc = _parse(path) or {}
        if not isinstance(doc, dict):
            raise KubeConfigError(f"kubeconfig {path}: not a mapping")
        read += 1
        for kind in ("clusters", "users", "contexts"):
            for item in doc.get(kind) or []:
                name = item.get("name")
                if name and name not in merged.entries[kind]:
                    merged.entries[kind][name] = (dict(item.get(kind[:-1]) or {}), path.parent)
        merged.current = merged.current or doc.get("current-context") or None
    if not read:
        raise KubeConfigError(f"kubeconfig: none of {', '.join(map(str, files))} exists")
    return merged


def _data_or_file(entry: Mapping[str, Any], key: str, base: Path) -> tuple[str | None, Path | None]:
    data = entry.get(f"{key}-data")
    if data:
        return base64.b64decode(data).decode(), None
    path = entry.get(key)
    if path:
        full = base / str(path)
        try:
            return full.read_text(), full
        except OSError as exc:
            raise KubeConfigError(f"kubeconfig: cannot read {key} {full}: {exc}") from exc
    return None, None


def _exec_config(spec: Mapping[str, Any], base: Path, where: str) -> ExecConfig:
    command = spec.get("command")
    if not command:
        raise KubeConfigError(f"{where}: exec needs a command")
    version = spec.get("apiVersion", EXEC_API_VERSIONS[0])
    if version not in EXEC_API_VERSIONS:
        raise KubeConfigError(
            f"{where}: exec apiVersion {version!r} is not one of {', '.join(EXEC_API_VERSIONS)}"
        )
    return ExecConfig(
        command=str(command),
        args=tuple(str(a) for a in spec.get("args") or ()),
        env=tuple((str(e["name"]), str(e["value"])) for e in spec.get("env") or ()),
        api_version=version,
        provide_cluster_info=bool(spec.get("provideClusterInfo", False)),
        base=base,
    )


def load_kubeconfig(paths: Path | str | Sequence[Path], context: str | None = None) -> KubeConfig:
    """One context (``current-context`` by default) of one or more kubeconfig files."""
    files = _files(paths)
    merged = _merge(files)
    where = f"kubeconfig {os.pathsep.join(map(str, files))}"
    name = context or merged.current
    if not name:
        raise KubeConfigError(f"{where}: no current-context and no --context given")

    def pick(kind: str, wanted: str | None) -> tuple[dict[str, Any], Path]:
        found = merged.entries[kind].get(wanted or "")
        if found is None:
            known = ", ".join(sorted(merged.entries[kind])) or "none"
            raise KubeConfigError(f"{where}: {kind[:-1]} {wanted!r} not found (known: {known})")
        return found

    ctx, _ = pick("contexts", name)
    cluster, cluster_base = pick("clusters", ctx.get("cluster"))
    user, user_base = pick("users", ctx.get("user"))
    if "auth-provider" in user:
        raise KubeConfigError(f"{where}: auth-provider users are not supported; use exec")
    server = cluster.get("server")
    if not server:
        raise KubeConfigError(f"{where}: cluster {ctx.get('cluster')!r} has no server")
    ca, _ = _data_or_file(cluster, "certificate-authority", cluster_base)
    cert, cert_file = _data_or_file(user, "client-certificate", user_base)
    key, key_file = _data_or_file(user, "client-key", user_base)
    token_file = user.get("tokenFile")
    return KubeConfig(
        server=str(server).rstrip("/"),
        ca_pem=ca,
        client_cert_pem=cert,
        client_key_pem=key,
        token=user.get("token"),
        token_file=user_base / token_file if token_file else None,
        insecure_skip_tls_verify=bool(cluster.get("insecure-skip-tls-verify", False)),
        client_cert_file=cert_file,
        client_key_file=key_file,
        exec=_exec_config(user["exec"], user_base, where) if "exec" in user else None,
    )


def load_in_cluster(environ: Mapping[str, str], sa_dir: Path = IN_CLUSTER_SA_DIR) -> KubeConfig:
    """Service-account credentials of the pod; ``environ`` is passed in, not read here."""
    host = environ.get("KUBERNETES_SERVICE_HOST")
    port = environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise KubeConfigError("in-cluster config: KUBERNETES_SERVICE_HOST is not set")
    if ":" in host:
        host = f"[{host}]"
    try:
        ca = (sa_dir / "ca.crt").read_text()
    except OSError as exc:
        raise KubeConfigError(f"in-cluster config: cannot read {sa_dir / 'ca.crt'}") from exc
    return KubeConfig(server=f"https://{host}:{port}", ca_pem=ca, token_file=sa_dir / "token")


@dataclass(frozen=True)
class ExecCredential:
    token: str | None
    cert_pem: str | None
    key_pem: str | None
    expires_at: float | None
    """Unix time, or None: valid until the server refuses it."""


class ExecPlugin:
    """Runs a kubeconfig ``exec`` credential plugin; caches what it returns."""

    def __init__(self, config: ExecConfig, server: str, ca_pem: str | None) -> None:
        self._config = config
        self._cluster = {"server": server, **({"certificate-authority-data": base64.b64encode(
            ca_pem.encode()).decode()} if ca_pem else {})}  # fmt: skip
        self._lock = threading.Lock()
        self._cached: ExecCredential | None = None
        self.runs = 0

    def credential(self, *, refresh: bool = False) -> ExecCredential:
        with self._lock:
            cached = self._cached
            fresh = cached is not None and (
                cached.expires_at is None or cached.expires_at - EXPIRY_MARGIN_S > time.time()
            )
            if refresh or not fresh:
                self._cached = cached = self._run()
            assert cached is not None
            return cached

    def _run(self) -> ExecCredential:
        cfg = self._config
        command = cfg.command
        if "/" in command and not Path(command).is_absolute():
            command = str(cfg.base / command)
        spec: dict[str, Any] = {"interactive": False}
        if cfg.provide_cluster_info:
            spec["cluster"] = self._cluster
        info = {"apiVersion": cfg.api_version, "kind": "ExecCredential", "spec": spec}
        env = {**os.environ, **dict(cfg.env), "KUBERNETES_EXEC_INFO": json.dumps(info)}
        self.runs += 1
        try:
            done = subprocess.run(
                [command, *cfg.args], env=env, stdin=subprocess.DEVNULL, capture_output=True,
                text=True, timeout=EXEC_TIMEOUT_S, check=False,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise KubeConfigError(f"exec credential plugin {command}: {exc}") from exc
        if done.returncode != 0:
            raise KubeConfigError(
                f"exec credential plugin {command} exited {done.returncode}: "
                f"{done.stderr.strip()[-500:]}"
            )
        try:
            answer = json.loads(done.stdout)
            status = answer["status"]
        except (ValueError, KeyError, TypeError) as exc:
            raise KubeConfigError(
                f"exec credential plugin {command}: not an ExecCredential with a status"
            ) from exc
        if answer.get("apiVersion") != cfg.api_version or answer.get("kind") != "ExecCredential":
            raise KubeConfigError(
                f"exec credential plugin {command}: answered {answer.get('apiVersion')} "
                f"{answer.get('kind')}, expected {cfg.api_version} ExecCredential"
            )
        token = status.get("token")
        cert, key = status.get("clientCertificateData"), status.get("clientKeyData")
        if not token and not (cert and key):
            raise KubeConfigError(
                f"exec credential plugin {command}: status has neither token nor "
                "clientCertificateData+clientKeyData"
            )
        expires = status.get("expirationTimestamp")
        return ExecCredential(token, cert, key, _timestamp(expires) if expires else None)


def _timestamp(text: str) -> float:
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError as exc:
        raise KubeConfigError(f"exec credential: bad expirationTimestamp {text!r}") from exc
