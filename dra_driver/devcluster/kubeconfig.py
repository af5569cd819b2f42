"""Kubeconfig files for the test control plane (admin cert or ServiceAccount token)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml


def write_kubeconfig(
    path: Path,
    *,
    server: str,
    ca_file: Path,
    user: str,
    cert_file: Path | None = None,
    key_file: Path | None = None,
    token: str | None = None,
) -> Path:
    """Write a one-context kubeconfig (mode 0600: it holds a credential)."""
    if (cert_file is None) == (token is None):
        raise ValueError("give either cert_file+key_file or token, not both or neither")
    credentials: dict[str, Any]
    if token is not None:
        credentials = {"token": token}
    else:
        if key_file is None:
            raise ValueError("cert_file needs key_file")
        credentials = {"client-certificate": str(cert_file), "client-key": str(key_file)}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "dra-dev",
                "cluster": {"server": server, "certificate-authority": str(ca_file)},
            }
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": user, "context": {"cluster": "dra-dev", "user": user}}],
        "current-context": user,
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        yaml.safe_dump(config, out, sort_keys=False)
    return path
