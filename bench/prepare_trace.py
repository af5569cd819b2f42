"""Measurement: which of our modules one prepare passes through (not a test).

Runs the shipped ``dra-driver kubelet-plugin`` command in this process (main thread,
as in the pod) on an emulated ``l4-x4`` node against the fake API server of
``tests.plugin.fakes``, and acts as the kubelet from another thread: once the plugin
is ready it sends ONE v1 ``NodePrepareResources`` for a claim with one exclusive GPU,
then SIGTERM. A profile hook (``threading.setprofile``, so gRPC's handler threads get
it) records every Python call into a ``dra_driver`` module made while a thread runs
inside the ``NodePrepareResources`` handler.

Reported:

- ``modules``: the distinct ``dra_driver`` modules entered, in the order first entered;
- ``reentries``: calls into a module other than the calling one (the nearest
  ``dra_driver`` frame up the stack) that had already been entered before: how often
  the path leaves a module and comes back to one it already passed through.

Run: ``.venv/bin/python -m bench.prepare_trace [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

DRIVER = "gpu.nvidia.com"
NODE = "node-a"
UID = "0a0b0c0d-1111-4222-8333-000000000029"
HANDLER = "NodePrepareResources"


@dataclass
class Trace:
    """Module transitions seen inside the handler (any thread running it)."""

    active: dict[int, int] = field(default_factory=dict)
    """Thread ident -> depth of the handler frame on that thread's stack."""
    order: list[str] = field(default_factory=list)
    entries: Counter[str] = field(default_factory=Counter)
    reentries: int = 0
    reentered: Counter[tuple[str, str]] = field(default_factory=Counter)
    steps: list[str] = field(default_factory=list)
    """Every transition, ``caller -> module.function``, in order."""
    armed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def hook(self, frame: FrameType, event: str, arg: object) -> None:
        if not self.armed or event not in ("call", "return"):
            return
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("dra_driver"):
            return
        ident = threading.get_ident()
        if frame.f_code.co_name == HANDLER and module.startswith("dra_driver.plugin"):
            if event == "call":
                self.active[ident] = 1
                self._enter(module, None, HANDLER)
            else:
                self.active.pop(ident, None)
            return
        if event != "call" or ident not in self.active:
            return
        self._enter(module, _caller_module(frame), frame.f_code.co_qualname)

    def _enter(self, module: str, caller: str | None, function: str) -> None:
        with self.lock:
            if module == caller:
                return
            self.steps.append(f"{caller} -> {module}.{function}")
            self.entries[module] += 1
            if module in self.order:
                self.reentries += 1
                self.reentered[(caller or "?", module)] += 1
            else:
                self.order.append(module)


def _caller_module(frame: FrameType) -> str | None:
    back = frame.f_back
    while back is not None:
        name = back.f_globals.get("__name__", "")
        if name.startswith("dra_driver"):
            return str(name)
        back = back.f_back
    return None


def _claim() -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "one-gpu", "namespace": "default", "uid": UID},
        "spec": {"devices": {"requests": [{"name": "gpu"}]}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0"}
                    ],
                    "config": [],
                }
            }
        },
    }


def _ready(port: int) -> bool:
    """Ready but for the kubelet's registration (no kubelet calls GetInfo here)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
            return bool(r.status == 200)
    except urllib.error.HTTPError as err:
        problems = json.loads(err.read()).get("problems", [])
        return bool(problems) and all(p.startswith("not registered") for p in problems)
    except OSError:
        return False


def _kubelet(trace: Trace, work: Path, port: int, result: dict[str, Any]) -> None:
    import grpc

    from dra_driver.plugin._proto import dra_v1_pb2, dra_v1_pb2_grpc

    try:
        deadline = time.monotonic() + 120
        while not _ready(port):
            if time.monotonic() > deadline:
                raise TimeoutError("the plugin did not become ready in 120 s")
            time.sleep(0.1)
        sock = work / "plugins" / DRIVER / "dra.sock"
        request = dra_v1_pb2.NodePrepareResourcesRequest(
            claims=[dra_v1_pb2.Claim(namespace="default", name="one-gpu", uid=UID)]
        )
        with grpc.insecure_channel(f"unix:{sock}") as channel:
            stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
            grpc.channel_ready_future(channel).result(timeout=10)
            trace.armed = True
            response = stub.NodePrepareResources(request, timeout=45)
            trace.armed = False
        claim = response.claims[UID]
        result["error"] = claim.error
        result["cdi_device_ids"] = [list(d.cdi_device_ids) for d in claim.devices]
    except BaseException as exc:
        result["error"] = f"kubelet side: {exc!r}"
    finally:
        os.kill(os.getpid(), signal.SIGTERM)


def measure(work: Path) -> dict[str, Any]:
    from dra_driver import cli
    from tests.plugin.fakes import FakeApiServer
    from tests.test_daemon import free_port

    with FakeApiServer() as api:
        api.add_node(NODE)
        api.add_claim(_claim())
        kubeconfig = api.write_kubeconfig(work / "kubeconfig")
        for name in [k for k in os.environ if k.startswith("DRA_")]:
            del os.environ[name]
        port = free_port()
        trace = Trace()
        result: dict[str, Any] = {}
        threading.Thread(
            target=_kubelet, args=(trace, work, port, result), name="kubelet", daemon=True
        ).start()
        threading.setprofile(trace.hook)
        sys.setprofile(trace.hook)
        try:
            code = cli.main(
                [
                    "--log-level=warning",
                    "kubelet-plugin",
                    f"--node-name={NODE}",
                    f"--kubeconfig={kubeconfig}",
                    "--emulate=l4-x4",
                    f"--host-root={work / 'host'}",
                    f"--cdi-dir={work / 'cdi'}",
                    f"--state-dir={work / 'state'}",
                    f"--kubelet-registry-dir={work / 'reg'}",
                    f"--kubelet-plugins-dir={work / 'plugins'}",
                    f"--health-port={port}",
                    "--rediscover-interval=0",
                ]
            )
        finally:
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]
    return {
        "exit_code": code,
        "error": result.get("error", "no answer"),
        "cdi_device_ids": result.get("cdi_device_ids", []),
        "modules": trace.order,
        "module_count": len(trace.order),
        "reentries": trace.reentries,
        "entries": dict(trace.entries),
        "reentered": {f"{a} -> {b}": n for (a, b), n in trace.reentered.most_common()},
        "steps": trace.steps,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--steps", action="store_true", help="also every transition, in order")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dra-trace-", dir="/tmp"))  # short: socket paths
    try:
        report = measure(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(report))
    else:
        for i, module in enumerate(report["modules"], 1):
            print(f"{i:3d}  {module}  (entered {report['entries'][module]}x)")
        if args.steps:
            print("transitions:")
            for step in report["steps"]:
                print(f"  {step}")
        print("re-entries by edge:")
        for edge, n in report["reentered"].items():
            print(f"  {n:3d}  {edge}")
        print(f"modules: {report['module_count']}  re-entries: {report['reentries']}")
        if report["error"]:
            print(f"prepare error: {report['error']}")
    return 0 if not report["error"] and report["exit_code"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
