"""The controller's probes, answered by the kubelet plugin's HealthServer from the
controller's :class:`Health`: a dead worker or a stale Lease fails liveness (the kubelet
restarts the pod); a leader is ready once its caches are synced, a standby at once."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from dra_driver.computedomain.controller.controller import Health
from dra_driver.plugin.healthz import HealthServer


@pytest.fixture()
def answer() -> Iterator[tuple[list[Health], HealthServer]]:
    state = [Health()]
    server = HealthServer(readiness=lambda: state[0], port=0, host="127.0.0.1",
                          logger=logging.getLogger("test"))  # fmt: skip
    server.start()
    try:
        yield state, server
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("health", "alive", "ready", "problem"),
    [
        (Health(leading=True, synced=True), 200, 200, ""),
        (Health(leading=True, synced=False), 200, 503, "caches not synced"),
        (Health(leading=False, synced=False), 200, 200, ""),
        (Health(failed="KeyError: 'x'", synced=True), 503, 503, "reconcile worker died"),
        (Health(lease_ok=False, synced=True), 503, 503, "lease not renewed"),
    ],
    ids=["leader-synced", "leader-syncing", "standby", "worker-died", "lease-stale"],
)
def test_probes(
    answer: tuple[list[Health], HealthServer], health: Health, alive: int, ready: int,
    problem: str,
) -> None:  # fmt: skip
    state, server = answer
    state[0] = health
    code, body = server.answer("/healthz")
    assert code == alive
    code, body = server.answer("/readyz")
    assert code == ready
    assert "devices" not in body  # a controller has none
    assert (problem in " ".join(body["problems"])) if problem else body["problems"] == []
