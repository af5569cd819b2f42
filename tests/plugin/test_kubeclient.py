"""The plugin's API facade over the ``kubernetes`` library: credentials as kubectl finds
them, the calls at the wire (a fake API server), errors mapped to ours, and the import
made only when connecting. Real-API-server cases are in test_kubeclient_live.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dra_driver.plugin.kubeauth import TOKEN_REREAD_S, TokenFile
from dra_driver.plugin.kubeclient import (
    ConflictError,
    KubeApiError,
    KubeClient,
    KubeConfigError,
    KubeConnectionError,
    KubeError,
    NotFoundError,
)
from tests.plugin.fakes import FakeApiServer, claim_object


def _config(path: Path, **doc: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", **doc}))
    return path


def _single(path: Path, server: str, user: dict[str, object]) -> Path:
    return _config(
        path,
        **{"current-context": "c"},
        contexts=[{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        clusters=[{"name": "k", "cluster": {"server": server}}],
        users=[{"name": "u", "user": user}],
    )


def test_a_token_file_in_a_kubeconfig_is_sent_as_bearer_token(
    api: FakeApiServer, tmp_path: Path
) -> None:
    (tmp_path / "tok").write_text("secret-token\n")
    client = KubeClient.from_kubeconfig(
        str(_single(tmp_path / "kc", api.server, {"tokenFile": "tok"}))
    )
    client.get_resource_claim("default", "missing")
    assert api.authorizations[-1] == "Bearer secret-token"  # relative to the kubeconfig
    client.close()


def test_in_cluster_config_uses_the_passed_environment_only(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("sa-token")
    (tmp_path / "ca.crt").write_text("CA")
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    client = KubeClient.in_cluster(env, sa_dir=tmp_path)
    assert client.server == "https://[fd00::1]:443"
    client.close()
    with pytest.raises(KubeConfigError, match=r"in-cluster service account .*host/port is not set"):
        KubeClient.in_cluster({}, sa_dir=tmp_path).connect()


def test_calls_and_their_errors_at_the_wire(api: FakeApiServer) -> None:
    api.add_claim(claim_object("c", "u-1"))
    api.add_node("node-a")
    client = api.client()
    claim = client.get_resource_claim("default", "c")
    assert claim is not None and claim["metadata"]["uid"] == "u-1"
    assert client.get_resource_claim("default", "nope") is None
    assert client.get_node("node-a")["metadata"]["name"] == "node-a"
    with pytest.raises(NotFoundError, match=r"GET /api/v1/nodes/missing"):
        client.get_node("missing")
    made = client.create_resource_slice({"metadata": {"name": "s1"}, "spec": {"x": 1}})
    assert made["metadata"]["resourceVersion"]
    assert [s["metadata"]["name"] for s in client.list_resource_slices("a=b")["items"]] == ["s1"]
    client.delete_resource_slice("s1", uid=made["metadata"]["uid"])
    assert api.slices == {}
    with pytest.raises(KubeError, match="cannot be an object name"):
        client.get_resource_claim("default", "..")
    api.fail_slice_requests = 1
    with pytest.raises(KubeApiError, match=r"500 InternalError: GET .*: etcd down") as err:
        client.list_resource_slices("a=b")
    assert err.value.status == 500 and not isinstance(err.value, ConflictError)
    client.close()


def test_an_unreachable_server_is_a_connection_error(tmp_path: Path) -> None:
    client = KubeClient.for_server("http://127.0.0.1:1", timeout_s=2)
    with pytest.raises(KubeConnectionError, match="GET /api/v1/nodes/n"):
        client.get_node("n")
    client.close()


def test_kubeconfig_lists_and_contexts(tmp_path: Path) -> None:
    """A ``:``-joined list as kubectl reads it (a missing file is fine), ``--context``
    picks another context, an unknown one and a broken file are named."""
    a = _config(
        tmp_path / "a" / "config",
        **{"current-context": "first"},
        clusters=[{"name": "ka", "cluster": {"server": "https://a:6443"}}],
        contexts=[{"name": "first", "context": {"cluster": "ka", "user": "u"}}],
        users=[{"name": "u", "user": {"token": "from-a"}}],
    )
    b = _config(
        tmp_path / "b" / "config",
        clusters=[{"name": "kb", "cluster": {"server": "https://b:6443"}}],
        contexts=[{"name": "second", "context": {"cluster": "kb", "user": "u"}}],
    )
    listed = f"{a}:{tmp_path / 'missing'}:{b}"
    assert KubeClient.from_kubeconfig(listed).server == "https://a:6443"
    assert KubeClient.from_kubeconfig(listed, "second").server == "https://b:6443"
    with pytest.raises(KubeConfigError, match=r"\(context third\): .*name third"):
        KubeClient.from_kubeconfig(listed, "third").connect()
    (tmp_path / "broken").write_text("{clusters: [")
    with pytest.raises(KubeConfigError, match=r"cannot load the kubeconfig .*broken"):
        KubeClient.from_kubeconfig(str(tmp_path / "broken")).connect()


def test_the_library_is_imported_only_when_connecting() -> None:
    """Importing it loads every generated model (~0.6 s): the daemon connects once its
    sockets serve, so making the client must not import it."""
    code = (
        "import sys\n"
        "from dra_driver.plugin.kubeclient import KubeClient\n"
        "c = KubeClient.for_server('http://127.0.0.1:1')\n"
        "before = 'kubernetes' in sys.modules\n"
        "c.connect()\n"
        "print(before, 'kubernetes.client' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]


def test_a_rotated_token_file_is_read_again_after_a_401(api: FakeApiServer, tmp_path: Path) -> None:
    """The library reads a kubeconfig's tokenFile once; a token rotated (or replaced after
    a revocation) must be in use from the next call, not after a restart."""
    (tmp_path / "tok").write_text("old\n")
    client = KubeClient.from_kubeconfig(
        str(_single(tmp_path / "kc", api.server, {"tokenFile": "tok"}))
    )
    client.get_resource_claim("default", "missing")
    api.accepted_authorizations = {"Bearer new"}
    (tmp_path / "tok").write_text("new\n")
    with pytest.raises(KubeApiError) as refused:
        client.get_resource_claim("default", "missing")
    assert refused.value.status == 401 and api.authorizations[-1] == "Bearer old"
    assert client.get_resource_claim("default", "missing") is None
    assert api.authorizations[-1] == "Bearer new"
    client.close()


def test_an_in_cluster_token_is_read_again_after_a_401(api: FakeApiServer, tmp_path: Path) -> None:
    (tmp_path / "token").write_text("sa-1")
    (tmp_path / "ca.crt").write_text("CA")
    client = KubeClient.in_cluster({"KUBERNETES_SERVICE_HOST": "h", "KUBERNETES_SERVICE_PORT": "1"},
                                   sa_dir=tmp_path)  # fmt: skip
    client.connect()
    client._api.configuration.host = api.server  # the fake serves plain HTTP
    client.get_resource_claim("default", "missing")
    assert api.authorizations[-1] == "Bearer sa-1"
    api.accepted_authorizations = {"Bearer sa-2"}
    (tmp_path / "token").write_text("sa-2")
    with pytest.raises(KubeApiError, match="401"):
        client.get_resource_claim("default", "missing")
    assert client.get_resource_claim("default", "missing") is None
    assert api.authorizations[-1] == "Bearer sa-2"
    client.close()


def test_a_token_file_is_read_again_every_minute_and_kept_while_unreadable(tmp_path: Path) -> None:
    now = [0.0]
    path = tmp_path / "tok"
    path.write_text("a")
    token = TokenFile(path.read_text, clock=lambda: now[0])
    assert token.header() == "Bearer a"
    path.write_text("b")
    now[0] = TOKEN_REREAD_S - 1
    assert token.header() == "Bearer a"  # cached, as client-go's file token source
    now[0] = TOKEN_REREAD_S
    assert token.header() == "Bearer b"
    path.unlink()  # being replaced: the last token may still be valid
    token.stale()
    assert token.header() == "Bearer b"
    path.write_text("c")
    assert token.header() == "Bearer c"  # the failed read is tried again on the next call
    with pytest.raises(FileNotFoundError):
        TokenFile((tmp_path / "never").read_text).header()


def test_certificate_dirs_of_dead_processes_are_removed(tmp_path: Path) -> None:
    """A SIGKILLed plugin cannot remove the dir where the library wrote an inline
    kubeconfig's key; the next client removes it (and leaves a live process's alone)."""
    import os
    import tempfile

    from dra_driver.plugin.kubeauth import cert_dir

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    base = Path(tempfile.gettempdir())
    stale = base / f"dra-kubeclient-{int(dead.stdout)}-abc"
    live = base / f"dra-kubeclient-{os.getppid()}-abc"
    for d in (stale, live):
        d.mkdir(exist_ok=True)
        (d / "key").write_text("secret")
    try:
        made = cert_dir()
        assert not stale.exists() and live.exists()
        assert made.name.startswith(f"dra-kubeclient-{os.getpid()}-")
        assert made.stat().st_mode & 0o777 == 0o700
        made.rmdir()
    finally:
        for d in (stale, live):
            if d.exists():
                (d / "key").unlink()
                d.rmdir()
