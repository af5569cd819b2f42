"""The plugin's HTTP health endpoint, over a real TCP socket, as the kubelet's
httpGet probes of the chart's DaemonSet call it."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from dra_driver.plugin.app import Readiness
from dra_driver.plugin.healthz import HealthServer
from dra_driver.plugin.publishing import PublishStatus


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
