"""The plugin's API client (the ``kubernetes`` library below it) against the real
apiserver: a burst's connections kept for the next, exec credential plugins (kept until
they expire, then fetched again), client certificates by file and inline, and the
``--context`` flag reaching the loader."""

from __future__ import annotations

import base64
import os
import stat
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from dra_driver.devcluster import Cluster
from dra_driver.devcluster.certs import issue_client_cert
from dra_driver.plugin.kubeclient import KubeClient

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


def connections_to(port: int) -> set[str]:
    """This process's established TCP connections to ``port`` (the kernel's view), by
    socket inode."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:[") : -1])
    found = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            remote_port = int(f[2].rsplit(":", 1)[1], 16)
            if f[3] == "01" and remote_port == port and f[9] in inodes:
                found.add(f[9])
    return found


def test_a_burst_of_gets_keeps_its_connections_for_the_next(cluster: Cluster) -> None:
    """16 GETs at once, as 16 gRPC workers preparing claims do: the pool (sized for the
    workers) keeps the connections it opened, so the next burst reuses every one of them
    (it may add some when its GETs overlap more than the first's did); closing the client
    closes them all."""
    port = urlsplit(cluster.server).port or 443
    before = connections_to(port)
    client = KubeClient.from_kubeconfig(str(cluster.kubeconfig), pool_size=20)
    path = "/api/v1/namespaces/default"
    with ThreadPoolExecutor(16) as ex:
        names = list(ex.map(lambda _: client.request("GET", path)["metadata"]["name"], range(16)))
    assert names == ["default"] * 16
    first = connections_to(port) - before
    assert 1 <= len(first) <= 16
    with ThreadPoolExecutor(16) as ex:
        list(ex.map(lambda _: client.request("GET", path), range(16)))
    second = connections_to(port) - before
    assert first <= second  # kept: none closed and re-made
    assert len(second) <= 16
    assert whoami(client) == "dra-driver-admin"  # a POST, through the same pool
    client.close()
    deadline = time.monotonic() + 5
    while connections_to(port) - before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not connections_to(port) - before


def exec_plugin(tmp_path: Path, cluster: Cluster, expires_in_s: int) -> Path:
    """A credential plugin handing out a service account's token that expires in
    ``expires_in_s``; it counts its runs in ``runs``."""
    sa_config = yaml.safe_load(
        cluster.service_account_kubeconfig("default", "exec-user").read_text()
    )
    token = sa_config["users"][0]["user"]["token"]
    tmp_path.mkdir(parents=True, exist_ok=True)
    plugin = tmp_path / "cred.py"
    plugin.write_text(
        "import datetime, json, os, pathlib, sys\n"
        "runs = pathlib.Path(sys.argv[1]); n = len(runs.read_text()) if runs.exists() else 0\n"
        "runs.write_text('x' * (n + 1))\n"
        "info = json.loads(os.environ['KUBERNETES_EXEC_INFO'])\n"
        "until = datetime.datetime.now(datetime.timezone.utc) + "
        f"datetime.timedelta(seconds={expires_in_s})\n"
        "status = {'token': os.environ['REAL_TOKEN'],\n"
        "          'expirationTimestamp': until.strftime('%Y-%m-%dT%H:%M:%SZ')}\n"
        "print(json.dumps({'apiVersion': info['apiVersion'], 'kind': 'ExecCredential',\n"
        "                  'status': status}))\n"
    )
    return kubeconfig(tmp_path / "kc", cluster, {"exec": {
        "apiVersion": "client.authentication.k8s.io/v1", "command": sys.executable,
        "args": [str(plugin), str(tmp_path / "runs")], "provideClusterInfo": True,
        "env": [{"name": "REAL_TOKEN", "value": token}], "interactiveMode": "Never",
    }})  # fmt: skip


def test_an_exec_credential_is_kept_until_it_expires_then_fetched_again(
    cluster: Cluster, tmp_path: Path
) -> None:
    lasting = KubeClient.from_kubeconfig(str(exec_plugin(tmp_path / "a", cluster, 3600)))
    assert whoami(lasting) == "system:serviceaccount:default:exec-user"
    assert whoami(lasting) == "system:serviceaccount:default:exec-user"
    assert (tmp_path / "a" / "runs").read_text() == "x"  # once: cached
    lasting.close()
    # Within the library's 5-minute margin before expiry: fetched again before each use.
    expiring = KubeClient.from_kubeconfig(str(exec_plugin(tmp_path / "b", cluster, 60)))
    assert whoami(expiring) == "system:serviceaccount:default:exec-user"
    assert whoami(expiring) == "system:serviceaccount:default:exec-user"
    assert len((tmp_path / "b" / "runs").read_text()) >= 3
    expiring.close()


def test_client_certificates_by_file_and_inline(cluster: Cluster, tmp_path: Path) -> None:
    """Files relative to the kubeconfig, or inline data, which the library writes to files
    in the client's private directory (0700, removed when the client closes)."""
    cert, key = issue_client_cert(cluster.certs, tmp_path / "a", "file-identity")
    by_file = kubeconfig(tmp_path / "a" / "kc", cluster, {"client-certificate": cert.name,
                                                          "client-key": key.name})  # fmt: skip
    client = KubeClient.from_kubeconfig(str(by_file))
    assert whoami(client) == "file-identity"
    client.close()
    cert, key = issue_client_cert(cluster.certs, tmp_path / "b", "inline-identity")
    inline = kubeconfig(tmp_path / "kc", cluster, {
        "client-certificate-data": base64.b64encode(cert.read_bytes()).decode(),
        "client-key-data": base64.b64encode(key.read_bytes()).decode(),
    })  # fmt: skip
    client = KubeClient.from_kubeconfig(str(inline))
    assert whoami(client) == "inline-identity"
    private = client._tmp
    assert private is not None and stat.S_IMODE(private.stat().st_mode) == 0o700
    client.close()
    assert not private.exists()


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
    assert "context other" in done.stderr and "name other" in done.stderr, done.stderr


def test_a_watch_closed_from_another_thread_ends_quietly(cluster: Cluster) -> None:
    """Stopping the plugin closes the slice watch from the main thread; the watch
    thread's own close follows. That second close raised urllib3's ValueError, so every
    stop logged the watch thread as crashed (and a crash is fatal)."""
    import threading

    client = KubeClient.from_kubeconfig(str(cluster.kubeconfig), pool_size=4)
    listed = client.request("GET", "/apis/resource.k8s.io/v1/resourceslices")
    watch = client.watch_resource_slices(
        field_selector="spec.nodeName=nowhere",
        resource_version=listed["metadata"]["resourceVersion"], timeout_s=60,
    )  # fmt: skip
    errors: list[BaseException] = []

    def read() -> None:
        try:
            list(watch)
        except BaseException as exc:  # whatever escapes is the failure
            errors.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.3)  # the reader is blocked in the response now
    started = time.monotonic()
    watch.close()
    reader.join(timeout=5)
    assert not reader.is_alive() and time.monotonic() - started < 2
    assert [type(e).__name__ for e in errors] in ([], ["KubeConnectionError"])
    client.close()
