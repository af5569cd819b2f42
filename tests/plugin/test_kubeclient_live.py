"""The plugin's API client against the real apiserver: GETs multiplexed on one HTTP/2
connection, exec credential plugins (token fetched again when the server refuses it)
and client certificates that rotate on disk (new connections use the new identity)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from dra_driver.devcluster import Cluster
from dra_driver.devcluster.certs import issue_client_cert
from dra_driver.plugin import kubeclient
from dra_driver.plugin.kubeclient import KubeClient, load_kubeconfig

REVIEW = "/apis/authentication.k8s.io/v1/selfsubjectreviews"


def whoami(client: KubeClient) -> str:
    answer = client.request(
        "POST", REVIEW, body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    )
    return str(answer["status"]["userInfo"]["username"])


def kubeconfig(path: Path, cluster: Cluster, user: dict[str, object]) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": cluster.server,
                                               "certificate-authority": str(cluster.ca_file)}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "users": [{"name": "u", "user": user}],
    }))  # fmt: skip
    return path


def connections_to(port: int) -> int:
    """This process's established TCP connections to ``port`` (the kernel's view)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:[") : -1])
    count = 0
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            remote_port = int(f[2].rsplit(":", 1)[1], 16)
            count += f[3] == "01" and remote_port == port and f[9] in inodes
    return count


def test_a_burst_of_gets_shares_one_http2_connection(cluster: Cluster) -> None:
    """As client-go does: 16 GETs at once on one connection (ALPN chose h2; the control
    plane spends less CPU on them, README "Benchmarks"); a write goes over HTTP/1.1 on
    a second one; closing the client closes both; with HTTP/2 off, the HTTP/1.1 pool."""
    port = urlsplit(cluster.server).port or 443
    before = connections_to(port)
    client = KubeClient(load_kubeconfig(cluster.kubeconfig), http2=True)
    path = "/api/v1/namespaces/default"
    with ThreadPoolExecutor(16) as ex:
        names = list(ex.map(lambda _: client.request("GET", path)["metadata"]["name"], range(16)))
    assert names == ["default"] * 16
    assert connections_to(port) - before == 1
    assert whoami(client) == "dra-driver-admin"  # a POST
    assert connections_to(port) - before == 2
    client.close()
    deadline = time.monotonic() + 5
    while connections_to(port) > before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert connections_to(port) == before
    # --api-http2=false: the same burst over the HTTP/1.1 pool (up to 4 connections).
    client = KubeClient(load_kubeconfig(cluster.kubeconfig), http2=False)
    with ThreadPoolExecutor(16) as ex:
        names = list(ex.map(lambda _: client.request("GET", path)["metadata"]["name"], range(16)))
    assert names == ["default"] * 16
    assert 1 < connections_to(port) - before <= 4
    client.close()


def test_exec_plugin_token_is_fetched_again_after_a_401(cluster: Cluster, tmp_path: Path) -> None:
    sa_config = yaml.safe_load(
        cluster.service_account_kubeconfig("default", "exec-user").read_text()
    )
    token = sa_config["users"][0]["user"]["token"]
    # First run: a token the server refuses; every later run: the real one.
    plugin = tmp_path / "cred.py"
    plugin.write_text(
        "import json, os, pathlib, sys\n"
        "runs = pathlib.Path(sys.argv[1]); n = len(runs.read_text()) if runs.exists() else 0\n"
        "runs.write_text('x' * (n + 1))\n"
        "info = json.loads(os.environ['KUBERNETES_EXEC_INFO'])\n"
        "assert info['spec']['cluster']['server'].startswith('https://'), info\n"
        "tok = 'not-a-token' if n == 0 else os.environ['REAL_TOKEN']\n"
        "print(json.dumps({'apiVersion': info['apiVersion'], 'kind': 'ExecCredential',\n"
        "                  'status': {'token': tok}}))\n"
    )
    path = kubeconfig(tmp_path / "kc", cluster, {"exec": {
        "apiVersion": "client.authentication.k8s.io/v1", "command": sys.executable,
        "args": [str(plugin), str(tmp_path / "runs")], "provideClusterInfo": True,
        "env": [{"name": "REAL_TOKEN", "value": token}], "interactiveMode": "Never",
    }})  # fmt: skip
    client = KubeClient(load_kubeconfig(path))
    assert whoami(client) == "system:serviceaccount:default:exec-user"
    assert (tmp_path / "runs").read_text() == "xx"  # refused once, fetched again once
    assert whoami(client) == "system:serviceaccount:default:exec-user"
    assert (tmp_path / "runs").read_text() == "xx"  # cached: no expiry given


def test_rotated_client_certificate_files_are_used_for_new_requests(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kubeclient, "CERT_RECHECK_S", 0.0)
    first_cert, first_key = issue_client_cert(cluster.certs, tmp_path / "a", "first-identity")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(first_cert, cert)
    shutil.copy(first_key, key)
    path = kubeconfig(tmp_path / "kc", cluster, {"client-certificate": "tls.crt",
                                                 "client-key": "tls.key"})  # fmt: skip
    client = KubeClient(load_kubeconfig(path))
    assert whoami(client) == "first-identity"
    new_cert, new_key = issue_client_cert(cluster.certs, tmp_path / "b", "rotated-identity")
    # As a rotator does: write the new pair in place.
    key.write_bytes(new_key.read_bytes())
    cert.write_bytes(new_cert.read_bytes())
    assert whoami(client) == "rotated-identity"


def test_kubelet_plugin_context_flag_picks_the_context_and_names_unknown_ones(
    cluster: Cluster, tmp_path: Path
) -> None:
    """--context reaches the loader: an unknown one fails at start with the known names."""
    path = kubeconfig(tmp_path / "kc", cluster, {"token": "t"})
    done = subprocess.run(
        [sys.executable, "-m", "dra_driver", "kubelet-plugin", "--node-name", "n",
         "--emulate", "t4", "--host-root", str(tmp_path / "h"), "--cdi-dir", str(tmp_path / "cdi"),
         "--kubelet-registry-dir", str(tmp_path / "r"),
         "--kubelet-plugins-dir", str(tmp_path / "p"),
         "--kubeconfig", f"{tmp_path / 'none'}:{path}", "--context", "other"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "context 'other' not found (known: c)" in done.stderr
