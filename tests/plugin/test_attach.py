"""A plugin that serves before its backend exists (the daemon discovers GPUs after its
sockets are up): claim calls wait for :meth:`KubeletPlugin.attach`, readiness says why."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import grpc

from dra_driver.plugin._proto import dra_v1_pb2, dra_v1_pb2_grpc
from dra_driver.plugin.app import KubeletPlugin, PluginSettings
from tests.plugin.fakes import DRIVER, FakeApiServer, FakeBackend, claim_object

UID = "11111111-aaaa-4000-8000-0000000000a7"


def test_claim_calls_wait_for_the_backend_attached_after_serving(
    short_dir: Path, api: FakeApiServer
) -> None:
    settings = PluginSettings(
        driver_name=DRIVER,
        node_name="node-a",
        registry_dir=short_dir / "registry",
        plugins_dir=short_dir / "plugins",
        cleanup_interval_s=3600,
    )
    plugin = KubeletPlugin(
        settings=settings,
        backend=None,
        logger=logging.getLogger("test.plugin"),
        client=api.client(timeout_s=settings.api_timeout_s),
        waiting_for="discovering devices",
    )
    try:
        plugin.serve()
        assert "starting: discovering devices" in plugin.readiness().problems
        api.add_claim(claim_object("c1", UID))
        answer: dict[str, object] = {}

        def kubelet() -> None:
            req = dra_v1_pb2.NodePrepareResourcesRequest(
                claims=[dra_v1_pb2.Claim(namespace="default", name="c1", uid=UID)]
            )
            with grpc.insecure_channel(f"unix:{plugin.paths.dra}") as ch:
                answer["r"] = dra_v1_pb2_grpc.DRAPluginStub(ch).NodePrepareResources(
                    req, timeout=45
                )

        call = threading.Thread(target=kubelet)
        call.start()
        call.join(0.5)
        assert call.is_alive()  # waiting for the backend
        backend = FakeBackend()
        plugin.attach(backend)
        call.join(10)
        claim = answer["r"].claims[UID]  # type: ignore[attr-defined]
        assert claim.error == ""
        assert [d.device_name for d in claim.devices] == ["gpu-0"]
        assert not any(p.startswith("starting:") for p in plugin.readiness().problems)
    finally:
        plugin.stop(grace_s=0)
