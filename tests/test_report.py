"""``dra-driver report`` and the right-sizing it prints: under-used claims and the smaller
MIG profile or MPS share that would have held their peak; read from a plugin's /metrics,
from Prometheus's query API, or from a recorded window."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from dra_driver.commands.report import parse_exposition, windows, write_recorded
from dra_driver.emulation import EmulatedNode
from dra_driver.gpu.hardware.nvml import Nvml
from dra_driver.gpu.monitoring.usage import UsageCollector, UsageSampler, UsageTarget
from dra_driver.plugin.metrics import exposition
from dra_driver.rightsizing import DeviceWindow, analyse

GIB = 2**30
A100 = "NVIDIA A100-SXM4-80GB"


def window(
    device: str,
    product: str,
    util: list[float],
    mem_gib: list[float],
    *,
    profile: str = "",
    alloc_gib: float = 80,
    sharing: str = "exclusive",
) -> DeviceWindow:
    return DeviceWindow(namespace="ml", claim=f"c-{device}", pod=f"p-{device}", device=device,
                        product=product, profile=profile, sharing=sharing,
                        allocated_bytes=int(alloc_gib * GIB), utilization=tuple(util),
                        memory_used=tuple(int(m * GIB) for m in mem_gib))  # fmt: skip


def test_suggestions_cover_the_peak_with_headroom() -> None:
    findings = {f.device: f for f in analyse([
        window("a100-idle", A100, [0.05, 0.1, 0.08], [6, 8, 7]),
        window("h100-busy", "NVIDIA H100 80GB HBM3", [0.9, 0.95, 0.85], [60, 70, 65]),
        window("l4-idle", "NVIDIA L4", [0.02, 0.05], [1, 2], alloc_gib=22.5),
        window("mig-3g", A100, [], [4, 5], profile="3g.40gb", alloc_gib=39.25),
        window("mig-1g", A100, [], [1], profile="1g.10gb", alloc_gib=9.5),
    ])}  # fmt: skip
    # 8 GiB x 1.2 = 9.6 GiB > 1g.10gb's 9.5 GiB; 10 % x 1.2 fits one of 7 slices.
    assert findings["a100-idle"].suggestion == "MIG 1g.20gb"
    assert findings["a100-idle"].utilization_p95 == 0.1 and findings["a100-idle"].under_used
    assert not findings["h100-busy"].under_used and findings["h100-busy"].suggestion == ""
    assert findings["l4-idle"].suggestion == "MPS share: 10% threads, 3Gi"  # no MIG on L4
    assert findings["mig-3g"].under_used and findings["mig-3g"].suggestion == "MIG 1g.10gb"
    assert findings["mig-1g"].under_used and findings["mig-1g"].suggestion == ""  # nothing smaller
    order = [f.device for f in analyse(list(map(lambda d: window(d, A100, [0.5], [1]), "ab")))]
    assert order == ["a", "b"]


def _emulated_metrics(tmp_path: Path) -> bytes:
    """A real exposition: the usage collector over an emulated dgx-a100 with two pods."""
    node = EmulatedNode.create("dgx-a100", tmp_path / "node")
    pod_a, pod_b = "11111111-2222-4333-8444-555555555555", "66666666-7777-4888-9999-aaaaaaaaaaaa"
    node.set_processes(0, [{"pid": 10, "usedMiB": 4096, "smUtil": 5}], pods={10: pod_a})
    node.set_processes(1, [{"pid": 20, "usedMiB": 70000, "smUtil": 97}], pods={20: pod_b})
    targets = [
        UsageTarget(namespace="ml", claim="notebook", pods=(("jupyter", pod_a),), device="gpu-0",
                    gpu_uuid=node.profile.gpus[0].uuid, mig=None, allocated_bytes=80 * GIB,
                    product=A100),
        UsageTarget(namespace="ml", claim="train", pods=(("trainer", pod_b),), device="gpu-1",
                    gpu_uuid=node.profile.gpus[1].uuid, mig=None, allocated_bytes=80 * GIB,
                    product=A100),
    ]  # fmt: skip
    with node.nvml():
        nvml = Nvml()
        nvml.init()
        try:
            sampler = UsageSampler(nvml=nvml, host=node.host, targets=lambda: targets,
                                   interval_s=60, logger=logging.getLogger("t"))  # fmt: skip
            sampler.sample_once()
            registry = CollectorRegistry()
            registry.register(UsageCollector(sampler))
            return exposition(registry)()[0]
        finally:
            nvml.shutdown()


class _Server:
    def __init__(self, routes: dict[str, bytes]) -> None:
        routes_ = routes

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                parsed = urllib.parse.urlparse(self.path)
                key = parsed.path
                if key == "/api/v1/query_range":
                    key += "?" + urllib.parse.parse_qs(parsed.query)["query"][0]
                body = routes_.get(key)
                self.send_response(200 if body is not None else 404)
                self.end_headers()
                self.wfile.write(body or b"{}")

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"


@pytest.fixture
def served() -> Iterator[callable]:
    servers: list[_Server] = []

    def serve(routes: dict[str, bytes]) -> str:
        servers.append(_Server(routes))
        return servers[-1].url

    yield serve
    for s in servers:
        s.httpd.shutdown()
        s.httpd.server_close()


def report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dra_driver", "report", *args],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip


def test_report_from_a_plugins_metrics_table_json_and_record(tmp_path: Path, served) -> None:
    url = served({"/metrics": _emulated_metrics(tmp_path)}) + "/metrics"
    recorded = tmp_path / "window.jsonl"
    # Two scrapes 1 s apart in a 2 s window: exactly 2 unless one scrape takes over
    # a second (0.1 s apart in 0.2 s gave 1 whenever the machine was busy).
    done = report("--scrape", url, "--duration", "2", "--interval", "1",
                  "--record", str(recorded), "-o", "json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    claims = {c["claim"]: c for c in json.loads(done.stdout)["claims"]}
    assert claims["notebook"]["under_used"] and claims["notebook"]["suggestion"] == "MIG 1g.10gb"
    assert claims["notebook"]["samples"] == 2 and claims["notebook"]["utilization_max"] == 0.05
    assert not claims["train"]["under_used"]
    again = report("--recorded", str(recorded))
    assert again.returncode == 0, again.stderr
    lines = again.stdout.splitlines()
    assert lines[0].split()[:4] == ["NAMESPACE", "CLAIM", "POD", "DEVICE"]
    assert "notebook" in lines[1] and "MIG 1g.10gb" in lines[1] and "5%/5%" in lines[1]


def test_report_from_prometheus_range_queries(tmp_path: Path, served) -> None:
    labels = {"namespace": "ml", "claim": "idle", "pod": "p", "device": "gpu-3"}

    def matrix(metric: str, values: list[float], extra: dict[str, str] | None = None) -> bytes:
        series = {
            "metric": {"__name__": metric, **labels, **(extra or {})},
            "values": [[1_700_000_000 + 60 * i, str(v)] for i, v in enumerate(values)],
        }
        data = {"resultType": "matrix", "result": [series]}
        return json.dumps({"status": "success", "data": data}).encode()

    url = served({
        "/api/v1/query_range?dra_driver_claim_gpu_utilization_ratio": matrix(
            "dra_driver_claim_gpu_utilization_ratio", [0.01, 0.02, 0.0]),
        "/api/v1/query_range?dra_driver_claim_gpu_memory_used_bytes": matrix(
            "dra_driver_claim_gpu_memory_used_bytes", [GIB, 2 * GIB, GIB]),
        "/api/v1/query_range?dra_driver_claim_gpu_memory_allocated_bytes": matrix(
            "dra_driver_claim_gpu_memory_allocated_bytes", [80 * GIB] * 3),
        "/api/v1/query_range?dra_driver_claim_device_info": matrix(
            "dra_driver_claim_device_info", [1] * 3,
            {"product": "NVIDIA H100 80GB HBM3", "profile": "", "sharing": "exclusive"}),
    })  # fmt: skip
    done = report("--prometheus", url, "--window", "600", "-o", "json")
    assert done.returncode == 0, done.stderr
    (claim,) = json.loads(done.stdout)["claims"]
    assert (claim["claim"], claim["samples"], claim["suggestion"]) == ("idle", 3, "MIG 1g.10gb")


def test_bad_sources_are_clear_errors(tmp_path: Path, served) -> None:
    done = report("--scrape", "http://127.0.0.1:9/metrics", "--duration", "0")
    assert done.returncode == 1 and "cannot read http://127.0.0.1:9/metrics" in done.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"ts": 1}\n')
    done = report("--recorded", str(bad))
    assert done.returncode == 1 and f"{bad}:1: not a recorded sample" in done.stderr
    empty = served({"/metrics": b"# nothing\n"}) + "/metrics"
    done = report("--scrape", empty, "--duration", "0")
    assert done.returncode == 1 and "no dra_driver_claim_* samples" in done.stderr


def test_recorded_windows_round_trip(tmp_path: Path) -> None:
    text = _emulated_metrics(tmp_path).decode()
    records = parse_exposition(text, 1.0) + parse_exposition(text, 2.0)
    write_recorded(tmp_path / "w.jsonl", records)
    from dra_driver.commands.report import read_recorded

    assert windows(read_recorded(tmp_path / "w.jsonl")) == windows(records)
