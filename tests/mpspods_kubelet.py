"""A pods-only API server with a kubelet behind it, on this machine: for the pod runner's
unit tier (tests/test_mpspods.py).

The plugin's real API client (:class:`KubeClient`, the ``kubernetes`` library) talks
HTTP to it. A created pod is *run* as a real kubelet would run its one container, as a
local process: ``python -m dra_driver <args>`` (the image's entry point runs
``dra-driver <args>``) with the pod's env. The pod is Running while it runs; a container
that exits is started again (restartPolicy Always). DELETE marks the pod terminating,
SIGTERMs the process, SIGKILLs it after the grace period, then removes the object, as the
kubelet confirms a deletion. Host paths are this machine's: mounted "at the same path"
holds by itself; a mount at another path is recorded, not made (no ``/dev/shm`` swap).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from dra_driver.plugin.kubeclient import KubeClient
from tests.plugin.fakes import JsonHandler


class PodKubelet:
    def __init__(self, workdir: Path) -> None:
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.requests: list[tuple[str, str]] = []
        self.workdir = workdir
        self._lock = threading.RLock()
        self._stopping = False
        kubelet = self

        class Handler(JsonHandler):
            def _route(self) -> tuple[str, str | None, dict[str, list[str]]]:
                url = urlparse(self.path)
                parts = url.path.strip("/").split("/")  # api v1 namespaces NS pods [NAME]
                assert parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "pods", url.path
                return parts[3], parts[5] if len(parts) > 5 else None, parse_qs(url.query)

            def do_GET(self) -> None:
                ns, name, query = self._route()
                kubelet.requests.append(("GET", self.path))
                with kubelet._lock:
                    if name is not None:
                        pod = kubelet.pods.get((ns, name))
                        self._send(200, pod) if pod else self._send(404, _not_found(name))
                        return
                    items = [
                        p for (n, _), p in kubelet.pods.items() if n == ns and _selected(p, query)
                    ]
                self._send(200, {"kind": "PodList", "items": items})

            def do_POST(self) -> None:
                ns, _, _ = self._route()
                pod = self._body()
                kubelet.requests.append(("POST", self.path))
                name = pod["metadata"]["name"]
                with kubelet._lock:
                    if (ns, name) in kubelet.pods:
                        self._send(
                            409,
                            {
                                "kind": "Status",
                                "reason": "AlreadyExists",
                                "message": f"pods {name!r} already exists",
                            },
                        )
                        return
                    pod["metadata"]["uid"] = str(uuid.uuid4())
                    pod["status"] = {"phase": "Pending"}
                    kubelet.pods[(ns, name)] = pod
                    kubelet._run(ns, name)
                self._send(201, pod)

            def do_DELETE(self) -> None:
                ns, name, _ = self._route()
                assert name is not None
                body = self._body()
                kubelet.requests.append(("DELETE", self.path))
                with kubelet._lock:
                    pod = kubelet.pods.get((ns, name))
                    if pod is None:
                        self._send(404, _not_found(name))
                        return
                    want = (body.get("preconditions") or {}).get("uid")
                    if want and want != pod["metadata"]["uid"]:
                        self._send(
                            409,
                            {
                                "kind": "Status",
                                "reason": "Conflict",
                                "message": "Precondition failed: UID",
                            },
                        )
                        return
                    pod["metadata"]["deletionTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ")
                threading.Thread(target=kubelet._terminate, args=(ns, name), daemon=True).start()
                self._send(200, pod)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._supervisor = threading.Thread(target=self._supervise, daemon=True)

    @property
    def server(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def client(self) -> KubeClient:
        return KubeClient.for_server(self.server, token="t")

    def __enter__(self) -> PodKubelet:
        self._thread.start()
        self._supervisor.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping = True
        with self._lock:
            procs = list(self.procs.values())
        for proc in procs:
            _kill_group(proc)
        self._httpd.shutdown()
        self._httpd.server_close()

    def pod_named(self, name: str) -> dict[str, Any] | None:
        with self._lock:
            return next((p for (_, n), p in self.pods.items() if n == name), None)

    def _run(self, ns: str, name: str) -> None:
        pod = self.pods[(ns, name)]
        (container,) = pod["spec"]["containers"]
        env = {**os.environ, **{e["name"]: e["value"] for e in container.get("env", [])}}
        log = (self.workdir / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "dra_driver", *container["args"]],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.procs[pod["metadata"]["uid"]] = proc
        restarts = pod["status"].get("restarts", 0)
        pod["status"] = {
            "phase": "Running",
            "restarts": restarts,
            "containerStatuses": [
                {"name": "main", "restartCount": restarts, "state": {"running": {}}}
            ],
        }

    def _supervise(self) -> None:
        """restartPolicy Always: a container that exited is started again."""
        while not self._stopping:
            with self._lock:
                for (ns, name), pod in list(self.pods.items()):
                    proc = self.procs.get(pod["metadata"]["uid"])
                    if (
                        "deletionTimestamp" in pod["metadata"]
                        or proc is None
                        or proc.poll() is None
                    ):
                        continue
                    _kill_group(proc)  # a container's processes end with its first one
                    pod["status"]["restarts"] = pod["status"].get("restarts", 0) + 1
                    self._run(ns, name)
            time.sleep(0.05)

    def _terminate(self, ns: str, name: str) -> None:
        with self._lock:
            pod = self.pods[(ns, name)]
            proc = self.procs.get(pod["metadata"]["uid"])
        if proc is not None:
            if proc.poll() is None:  # SIGTERM to the container's first process only
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=pod["spec"].get("terminationGracePeriodSeconds", 30))
                except subprocess.TimeoutExpired:
                    pass
            _kill_group(proc)  # then the rest of the container, as runc does
        with self._lock:
            self.pods.pop((ns, name), None)


def _not_found(name: str) -> dict[str, Any]:
    return {"kind": "Status", "reason": "NotFound", "message": f'pods "{name}" not found'}


def _selected(pod: dict[str, Any], query: dict[str, list[str]]) -> bool:
    labels = pod["metadata"].get("labels") or {}
    for term in ",".join(query.get("labelSelector", [])).split(","):
        if term and labels.get(term.split("=", 1)[0]) != term.split("=", 1)[1]:
            return False
    for term in ",".join(query.get("fieldSelector", [])).split(","):
        if term.startswith("spec.nodeName=") and pod["spec"].get("nodeName") != term[14:]:
            return False
    return True


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
