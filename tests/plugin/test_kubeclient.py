"""Credential loading of the small kube client (no kubernetes.client involved)."""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dra_driver.devcluster.certs import generate_certs
from dra_driver.plugin.kubeclient import (
    KubeClient,
    KubeConfig,
    KubeConfigError,
    NotFoundError,
    load_in_cluster,
    load_kubeconfig,
)
from tests.plugin.fakes import FakeApiServer, claim_object


def _write(path: Path, user: dict[str, object], cluster: dict[str, object]) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
                "clusters": [{"name": "k", "cluster": cluster}],
                "users": [{"name": "u", "user": user}],
            }
        )
    )
    return path


def test_kubeconfig_with_inline_ca_and_token_file(tmp_path: Path) -> None:
    (tmp_path / "tok").write_text("secret-token\n")
    cfg = load_kubeconfig(
        _write(
            tmp_path / "kc",
            {"tokenFile": "tok"},
            {
                "server": "https://k:6443/",
                "certificate-authority-data": base64.b64encode(b"PEM").decode(),
            },
        )
    )
    assert cfg.server == "https://k:6443"
    assert cfg.ca_pem == "PEM"
    assert cfg.token_file == tmp_path / "tok"


def test_in_cluster_config_uses_the_passed_environment(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_text("CA")
    cfg = load_in_cluster(
        {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}, sa_dir=tmp_path
    )
    assert cfg.server == "https://[fd00::1]:443"
    assert cfg.token_file == tmp_path / "token" and cfg.ca_pem == "CA"
    with pytest.raises(KubeConfigError, match="KUBERNETES_SERVICE_HOST"):
        load_in_cluster({}, sa_dir=tmp_path)


def test_claim_get_and_not_found_mapping(api: FakeApiServer, tmp_path: Path) -> None:
    api.add_claim(claim_object("c", "u-1"))
    client = KubeClient(api.config)
    claim = client.get_resource_claim("default", "c")
    assert claim is not None and claim["metadata"]["uid"] == "u-1"
    assert client.get_resource_claim("default", "nope") is None
    with pytest.raises(NotFoundError):
        client.get_node("missing")
    client.close()


def _config(path: Path, **doc: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", **doc}))
    return path


def test_kubeconfig_list_first_file_wins_and_paths_are_relative_to_their_file(
    tmp_path: Path,
) -> None:
    (tmp_path / "b" / "tok").parent.mkdir(parents=True)
    (tmp_path / "b" / "tok").write_text("from-b\n")
    a = _config(
        tmp_path / "a" / "config",
        **{"current-context": "first"},
        clusters=[{"name": "k", "cluster": {"server": "https://a:6443"}}],
        contexts=[{"name": "first", "context": {"cluster": "k", "user": "u"}}],
        users=[{"name": "u", "user": {"token": "from-a"}}],
    )
    b = _config(
        tmp_path / "b" / "config",
        **{"current-context": "second"},
        clusters=[{"name": "k", "cluster": {"server": "https://b:6443"}}],
        contexts=[{"name": "second", "context": {"cluster": "k", "user": "v"}}],
        users=[
            {"name": "u", "user": {"token": "ignored"}},
            {"name": "v", "user": {"tokenFile": "tok"}},
        ],
    )
    listed = f"{a}:{tmp_path / 'missing'}:{b}"
    first = load_kubeconfig(Path(listed))
    assert (first.server, first.token) == ("https://a:6443", "from-a")
    second = load_kubeconfig(listed, context="second")
    # Context from b, but cluster k was first named in a.
    assert second.server == "https://a:6443"
    assert second.token_file == tmp_path / "b" / "tok"
    with pytest.raises(
        KubeConfigError, match=r"context 'third' not found \(known: first, second\)"
    ):
        load_kubeconfig(listed, context="third")


def test_exec_plugin_of_the_wrong_api_version_is_refused(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "kc",
        {"exec": {"command": "x", "apiVersion": "client.authentication.k8s.io/v1alpha1"}},
        {"server": "https://k"},
    )
    with pytest.raises(KubeConfigError, match="v1alpha1' is not one of"):
        load_kubeconfig(path)


def test_json_yaml_flow_style_and_broken_kubeconfigs(tmp_path: Path) -> None:
    """JSON is read without PyYAML; YAML flow style starts with "{" too and is YAML;
    a file that is neither names the file."""
    doc = {
        "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "clusters": [{"name": "k", "cluster": {"server": "https://json:6443"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
    }
    (tmp_path / "json").write_text(json.dumps(doc, indent=1))
    assert load_kubeconfig(tmp_path / "json").server == "https://json:6443"
    flow = yaml.safe_dump(doc, default_flow_style=True).replace('"', "")
    (tmp_path / "flow").write_text(flow.replace("json", "flow"))
    assert flow.startswith("{") and load_kubeconfig(tmp_path / "flow").server == (
        "https://flow:6443"
    )
    (tmp_path / "broken").write_text("{clusters: [")
    with pytest.raises(KubeConfigError, match=r"kubeconfig .*broken: cannot read"):
        load_kubeconfig(tmp_path / "broken")
    code = (
        "import sys; from dra_driver.plugin.kubecreds import load_kubeconfig\n"
        f"load_kubeconfig({str(tmp_path / 'json')!r}); print('yaml' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_client_key_pair_is_loaded_from_memory_and_bad_material_is_refused(
    tmp_path: Path,
) -> None:
    """The key pair goes to ssl through memfds (never a file on disk): it loads, every
    descriptor is closed again, and a key that does not match the certificate fails
    when the client is made, not at the first request."""
    certs = generate_certs(tmp_path / "pki")
    cert_pem, key_pem = certs.admin_cert.read_text(), certs.admin_key.read_text()
    fds = set(os.listdir("/proc/self/fd"))
    client = KubeClient(
        KubeConfig(server="https://127.0.0.1:1", client_cert_pem=cert_pem, client_key_pem=key_pem)
    )
    client.close()
    assert set(os.listdir("/proc/self/fd")) == fds
    other_key = certs.serving_key.read_text()
    with pytest.raises(ssl.SSLError):
        KubeClient(KubeConfig(server="https://127.0.0.1:1", client_cert_pem=cert_pem,
                              client_key_pem=other_key))  # fmt: skip
    assert set(os.listdir("/proc/self/fd")) == fds
