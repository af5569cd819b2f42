"""Where the API client's credentials come from, and how a token in a file stays current.

The ``kubernetes`` library loads the credentials (:mod:`dra_driver.plugin.kubeclient`
calls these loaders when it connects): the in-cluster service account, kubeconfig
files as kubectl reads them, a server and token for tests. What it does not do is what
kubectl and client-go do for a bearer token that a kubeconfig names by file
(``tokenFile``) or that a pod's projected volume holds: read the file again. The
library reads a kubeconfig's ``tokenFile`` once (it refreshes only tokens with an
expiry) and the in-cluster token once a minute; a token rotated, or replaced after a
revocation, would then fail every call with 401 until the plugin restarted.

:class:`TokenFile` reads such a file again every :data:`TOKEN_REREAD_S` seconds, as
client-go's cached file token source does, and at once after the API server answered
401 (the facade calls :meth:`TokenFile.stale`), so a rotated token is in use within the
next retry. Client certificate and CA files need nothing: urllib3 loads them for each
new connection.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

IN_CLUSTER_SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD_S = 60.0
"""How long a token read from a file is used before the file is read again."""

CERT_DIR_PREFIX = "dra-kubeclient-"


def cert_dir() -> Path:
    """A private (0700) dir for the certificate files the library writes from inline
    kubeconfig data: ``<tmp>/dra-kubeclient-<pid>-<random>``. A process SIGKILLed
    cannot remove its own, so each new one first removes those whose process is gone
    (they may hold a private key)."""
    base = Path(tempfile.gettempdir())
    for old in base.glob(f"{CERT_DIR_PREFIX}*-*"):
        pid = old.name[len(CERT_DIR_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{CERT_DIR_PREFIX}{os.getpid()}-"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    return True


class TokenFile:
    """A bearer token read from a file, again after ``period_s`` or after :meth:`stale`.

    A read that fails (the file is being replaced, or gone) keeps the last token and is
    tried again on the next request: the old token may still be valid."""

    def __init__(
        self,
        read: Callable[[], str],
        *,
        period_s: float = TOKEN_REREAD_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read = read
        self._period_s = period_s
        self._clock = clock
        self._lock = threading.Lock()
        self._token = ""
        self._read_at: float | None = None

    def stale(self) -> None:
        """The API server refused the token: read the file before the next request."""
        with self._lock:
            self._read_at = None

    def header(self) -> str:
        """``Bearer <token>``; the token trimmed as kubectl trims it (``echo`` adds a
        newline that urllib3 would refuse in a header)."""
        with self._lock:
            now = self._clock()
            if self._read_at is None or now - self._read_at >= self._period_s:
                try:
                    self._token = self._read().strip()
                    self._read_at = now
                except OSError:
                    if not self._token:
                        raise
            return f"Bearer {self._token}"

    def install(self, cfg: Any) -> None:
        """Make ``cfg`` send this token on every request. Replaces the library's own
        refresh hook, which would set the token it read first (and put itself back)."""

        def hook(c: Any) -> None:
            c.api_key["BearerToken"] = self.header()

        hook(cfg)
        cfg.refresh_api_key_hook = hook


Configure = Callable[[Any, Path], TokenFile | None]
"""Fills a ``kubernetes.client.Configuration``; the path is a private (0700) dir for
the certificate files the library writes from inline kubeconfig data. Returns the
:class:`TokenFile` it installed, if the token lives in a file."""


class Credentials:
    """A loader of the client's configuration and, once it ran, the :class:`TokenFile`
    that keeps a token from a file current (None for other credentials)."""

    def __init__(self, configure: Configure, what: str) -> None:
        self._configure = configure
        self.what = what
        self.token_file: TokenFile | None = None

    def configure(self, cfg: Any, tmp: Path) -> None:
        self.token_file = self._configure(cfg, tmp)

    def stale(self) -> None:
        """A 401: a token that came from a file is read again before the next request."""
        if self.token_file is not None:
            self.token_file.stale()


def in_cluster(environ: Mapping[str, str], sa_dir: Path = IN_CLUSTER_SA_DIR) -> Credentials:
    """The pod's service account: ``KUBERNETES_SERVICE_HOST``/``_PORT`` from ``environ``
    (not this process's environment), its projected token re-read as it rotates."""

    def configure(cfg: Any, _tmp: Path) -> TokenFile:
        from kubernetes.config.incluster_config import InClusterConfigLoader

        loader = InClusterConfigLoader(  # type: ignore[no-untyped-call]
            token_filename=str(sa_dir / "token"),
            cert_filename=str(sa_dir / "ca.crt"),
            environ=dict(environ),
        )
        loader.load_and_set(cfg)  # type: ignore[no-untyped-call]
        token = TokenFile((sa_dir / "token").read_text)
        token.install(cfg)
        return token

    return Credentials(configure, f"in-cluster service account ({sa_dir})")


def kubeconfig(paths: str, context: str | None = None) -> Credentials:
    """Kubeconfig file(s), ``:``-joined (the first naming an entry wins), as kubectl
    reads them; ``context`` None is their current-context."""

    def configure(cfg: Any, tmp: Path) -> TokenFile | None:
        from kubernetes.config.config_exception import ConfigException
        from kubernetes.config.kube_config import KubeConfigLoader, KubeConfigMerger

        merged = KubeConfigMerger(paths)  # type: ignore[no-untyped-call]
        if merged.config is None:
            raise ConfigException("Invalid kube-config file. No configuration found.")
        loader = KubeConfigLoader(  # type: ignore[no-untyped-call]
            config_dict=merged.config, active_context=context, config_base_path=None,
            temp_file_path=str(tmp),
        )  # fmt: skip
        loader.load_and_set(cfg)  # type: ignore[no-untyped-call]
        read = _token_file_reader(merged.config, context)
        if read is None:
            return None
        token = TokenFile(read)
        token.install(cfg)
        return token

    what = f"kubeconfig {paths}" + (f" (context {context})" if context else "")
    return Credentials(configure, what)


def for_server(server: str, token: str | None = None) -> Credentials:
    """A server URL and a bearer token (tests and tools)."""

    def configure(cfg: Any, _tmp: Path) -> None:
        cfg.host = server
        if token:
            cfg.api_key = {"BearerToken": f"Bearer {token}"}

    return Credentials(configure, f"server {server}")


def _token_file_reader(config: Any, context: str | None) -> Callable[[], str] | None:
    """How to read the context's user's ``tokenFile`` (relative to the kubeconfig that
    names it), or None when its token comes from elsewhere: the library takes an
    auth-provider first, then ``token`` over ``tokenFile``, then an exec plugin."""
    from kubernetes.config.kube_config import FileOrData

    name = context or config.safe_get("current-context")
    if not name:
        return None
    user_name = config["contexts"].get_with_name(name)["context"].safe_get("user")
    if not user_name:
        return None
    user = config["users"].get_with_name(user_name)["user"]
    if user.safe_get("auth-provider") or user.safe_get("token") or not user.safe_get("tokenFile"):
        return None
    base = str(Path(user.path).absolute().parent) if user.path else ""

    def read() -> str:
        data = FileOrData(  # type: ignore[no-untyped-call]
            user, "tokenFile", "token", file_base_path=base, base64_file_content=False
        ).as_data()
        return str(data or "")

    return read
