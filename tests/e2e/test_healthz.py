"""The plugin's HTTP health endpoint, over a real TCP socket, as the kubelet's
httpGet probes of the chart's DaemonSet call it."""

from __future__ import annotations

import json
import logging
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families

from dra_driver.plugin.healthz import HealthServer
from dra_driver.plugin.metrics import exposition
from dra_driver.plugin.publishing import PublishStatus
from dra_driver.plugin.settings import Readiness


class Switch:
    def __init__(self) -> None:
        self.state = Readiness(serving=True, registered=False, registration_error="")
        self.fail: Exception | None = None

    def __call__(self) -> Readiness:
        if self.fail is not None:
            raise self.fail
        return self.state


@pytest.fixture
def served() -> Iterator[tuple[HealthServer, Switch]]:
    switch = Switch()
    server = HealthServer(readiness=switch, port=0, host="127.0.0.1", logger=logging.getLogger("t"))
    server.start()
    yield server, switch
    server.stop()


def get(server: HealthServer, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_live_but_not_ready_until_registered_and_published(served) -> None:
    server, switch = served
    assert get(server, "/healthz") == (200, {"ok": True, "problems": []})
    code, body = get(server, "/readyz")
    assert code == 503
    assert body["ok"] is False
    assert any("not registered with the kubelet" in p for p in body["problems"])
    switch.state = Readiness(
        serving=True, registered=True, registration_error="",
        publish=PublishStatus(in_sync=True, generation=0, slice_count=1),
    )  # fmt: skip
    no_devices = {"healthy": 0, "unhealthy": []}
    assert get(server, "/readyz") == (200, {"ok": True, "problems": [], "devices": no_devices})


def test_dropped_fields_make_it_unready(served) -> None:
    server, switch = served
    switch.state = Readiness(
        serving=True, registered=True, registration_error="",
        publish=PublishStatus(in_sync=True, dropped_fields=("devices[].consumesCounters",)),
    )  # fmt: skip
    code, body = get(server, "/readyz")
    assert code == 503
    assert "devices[].consumesCounters" in body["problems"][0]


def test_not_serving_fails_liveness(served) -> None:
    server, switch = served
    switch.state = Readiness(serving=False, registered=True, registration_error="")
    assert get(server, "/healthz")[0] == 503


def test_a_failing_check_answers_503_and_unknown_paths_404(served) -> None:
    server, switch = served
    switch.fail = RuntimeError("boom")
    code, body = get(server, "/readyz")
    assert code == 503
    assert "boom" in body["problems"][0]
    assert get(server, "/metrics")[0] == 404


def raw(server: HealthServer, request: bytes) -> bytes:
    """What the server answers to exactly these bytes (it closes the connection)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_head_answers_the_headers_only_and_other_methods_405(served) -> None:
    server, _ = served
    got = raw(server, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    head, _, body = got.partition(b"\r\n\r\n")
    full = raw(server, b"GET /healthz HTTP/1.0\r\n\r\n").partition(b"\r\n\r\n")[2]
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"Content-Length: %d\r\n" % len(full) in head and b"Connection: close" in head
    assert body == b"" and json.loads(full) == {"ok": True, "problems": []}
    assert raw(server, b"POST /healthz HTTP/1.1\r\nContent-Length: 0\r\n\r\n").startswith(
        b"HTTP/1.1 405 Method Not Allowed\r\n"
    )


def test_malformed_and_oversized_requests_get_4xx_not_a_crash(served) -> None:
    """http.server's limits: 64 KiB a line, 100 header lines. An unparseable request
    line is answered the HTTP/0.9 way (no status line), as the library does."""
    server, _ = served
    assert b"Error code: 400" in raw(server, b"GARBAGE\r\n\r\n")
    long_path = b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n"
    assert raw(server, long_path).startswith(b"HTTP/1.1 414 ")
    many = b"".join(b"X-%d: y\r\n" % i for i in range(101))
    assert raw(server, b"GET /healthz HTTP/1.1\r\n" + many + b"\r\n").startswith(b"HTTP/1.1 431 ")
    long_header = b"X: " + b"y" * 70000 + b"\r\n"
    assert raw(server, b"GET /healthz HTTP/1.1\r\n" + long_header + b"\r\n").startswith(
        b"HTTP/1.1 431 "
    )
    assert get(server, "/healthz")[0] == 200  # still serving


def test_a_silent_client_does_not_hold_up_the_probes(served) -> None:
    server, _ = served
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as silent:
        silent.sendall(b"GET /heal")  # and nothing more
        assert get(server, "/healthz")[0] == 200


def test_metrics_are_served_in_the_text_format() -> None:
    registry = CollectorRegistry()
    Counter("t_requests", "Requests.", ["code"], registry=registry).labels("200").inc(3)
    server = HealthServer(readiness=Switch(), port=0, host="127.0.0.1",
                          logger=logging.getLogger("t"), metrics=exposition(registry))  # fmt: skip
    server.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as r:
            assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
            text = r.read().decode()
    finally:
        server.stop()
    [family] = text_string_to_metric_families(text)
    assert [(s.name, s.labels, s.value) for s in family.samples] == [
        ("t_requests_total", {"code": "200"}, 3.0)
    ]


def test_an_unexpected_failure_answers_500_and_is_logged(served, monkeypatch, caplog) -> None:
    server, _ = served

    def broken(method: str, path: str) -> tuple[int, bytes, str]:
        raise KeyError("boom")

    monkeypatch.setattr(server, "respond", broken)
    with caplog.at_level(logging.ERROR, logger="t"):
        got = raw(server, b"GET /healthz HTTP/1.1\r\n\r\n")
    assert got.startswith(b"HTTP/1.1 500 Internal Server Error\r\n")
    assert "health endpoint request failed" in caplog.text


def test_the_daemons_families_keep_the_names_types_and_labels_dashboards_read() -> None:
    """The chart's rules and dashboard query these exact series; prometheus-client's
    ``_created`` samples are not served (nothing reads them)."""
    from dra_driver.gpu.monitoring.metrics import GpuMetrics
    from dra_driver.plugin.backend import DeviceHealth
    from dra_driver.plugin.metrics import PluginMetrics
    from dra_driver.plugin.resources import Pool

    registry = CollectorRegistry()
    plugin, gpu = PluginMetrics(registry), GpuMetrics(registry)
    health = [DeviceHealth(pool="p", device="gpu-0", health="Healthy")]
    plugin.watch_state(health=lambda: health, pool=Pool, prepared_claims=lambda: 1,
                       prepared_devices=lambda: 2)  # fmt: skip
    plugin.operations.observe("prepare", 0.003, "api")
    plugin.publish.write("update")
    plugin.publish.conflict()
    plugin.publish.sync(0.02, ok=False, generation=3)
    gpu.nvml_call("nvmlDeviceGetUUID", 0.001, 999)
    gpu.xid("GPU-1", 79)
    gpu.fault("GPU-1", "xid")
    body, content_type = exposition(registry)()
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
    got = {
        f.name: (f.type, sorted({k for s in f.samples for k in s.labels} - {"le"}))
        for f in text_string_to_metric_families(body.decode())
    }
    assert got == {
        "dra_driver_resourceslice_writes": ("counter", ["operation"]),
        "dra_driver_resourceslice_conflicts": ("counter", []),
        "dra_driver_resourceslice_sync_errors": ("counter", []),
        "dra_driver_resourceslice_sync_duration_seconds": ("histogram", []),
        "dra_driver_resourceslice_generation": ("gauge", []),
        "dra_driver_node_operation_duration_seconds": ("histogram", ["operation"]),
        "dra_driver_node_operation_errors": ("counter", ["operation", "reason"]),
        "dra_driver_prepared_claims": ("gauge", []),
        "dra_driver_prepared_devices": ("gauge", []),
        "dra_driver_device_healthy": ("gauge", ["device", "health", "pool"]),
        "dra_driver_device_taints": ("gauge", []),  # no taints on an empty pool
        "dra_driver_nvml_call_duration_seconds": ("histogram", ["function"]),
        "dra_driver_nvml_errors": ("counter", ["code", "function"]),
        "dra_driver_gpu_xid_events": ("counter", ["gpu", "xid"]),
        "dra_driver_gpu_faults": ("counter", ["gpu", "kind"]),
    }
    assert b"_created" not in body
    assert b'dra_driver_node_operation_errors_total{operation="prepare",reason="api"} 1.0' in body
