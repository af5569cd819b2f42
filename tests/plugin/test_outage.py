"""An API server that stops answering: the pods of a claim already prepared still start.

The kubelet calls NodePrepareResources for every pod that shares a claim. A claim the
GPU driver records as prepared is answered from its checkpoint, with no API call, so
those pods start while the API server is frozen; only a claim not prepared yet needs
the API server (and fails, naming it, once the request times out)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.emulation import EmulatedNode, gputools
from dra_driver.gpu.driver import GpuDriver
from dra_driver.gpu.hardware.discovery import discover
from dra_driver.gpu.sharing.tools import GpuTools
from dra_driver.plugin._proto import dra_v1_pb2, dra_v1_pb2_grpc
from tests.plugin.conftest import RunningPlugin, StartPlugin
from tests.plugin.fakes import DRIVER, claim_object

LOG = logging.getLogger("tests.plugin.outage")
SHARED = "0a0b0c0d-1111-4222-8333-444455556666"
NEW = "0a0b0c0d-1111-4222-8333-444455557777"


@pytest.fixture
def gpu_driver(tmp_path: Path) -> Iterator[GpuDriver]:
    node = EmulatedNode.create("l4-x4", tmp_path / "host")
    with node.nvml():
        tools = gputools.install(node.bin_dir, tmp_path / "tools.jsonl")
        driver = GpuDriver(
            driver_name=DRIVER, discover=lambda: discover(node.host, LOG), host=node.host,
            cdi_dir=tmp_path / "cdi", state_dir=tmp_path / "state",
            tools=GpuTools(nvidia_smi=tools["nvidia-smi"],
                           mps_control=tools["nvidia-cuda-mps-control"]),
            logger=LOG, pool_name="node-a", health_policy=None,
        )  # fmt: skip
        yield driver
        driver.close()


def prepare(run: RunningPlugin, *uids: str) -> dict[str, object]:
    req = dra_v1_pb2.NodePrepareResourcesRequest(
        claims=[dra_v1_pb2.Claim(namespace="default", name=f"c-{u[-4:]}", uid=u) for u in uids]
    )
    with run.channel() as ch:
        resp = dra_v1_pb2_grpc.DRAPluginStub(ch).NodePrepareResources(req, timeout=45)
    return dict(resp.claims)


def test_a_prepared_claim_is_answered_from_the_checkpoint_while_the_api_server_is_frozen(
    start_plugin: StartPlugin, gpu_driver: GpuDriver
) -> None:
    run = start_plugin(gpu_driver, api_timeout_s=1.0)  # type: ignore[arg-type]
    run.api.add_claim(claim_object("c-6666", SHARED))
    run.api.add_claim(claim_object("c-7777", NEW, results=[
        {"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-1"}]))  # fmt: skip
    first = prepare(run, SHARED)[SHARED]
    assert first.error == ""  # type: ignore[attr-defined]
    ids = [d.cdi_device_ids for d in first.devices]  # type: ignore[attr-defined]

    run.api.claim_get_delay_s = 30  # frozen: no claim GET is answered any more
    gets = [p for m, p in run.api.requests if "resourceclaims" in p]
    started = time.monotonic()
    again = prepare(run, SHARED)[SHARED]  # the next pod of the same claim
    assert time.monotonic() - started < 1.0
    assert again.error == ""  # type: ignore[attr-defined]
    assert [d.cdi_device_ids for d in again.devices] == ids  # type: ignore[attr-defined]
    assert [p for m, p in run.api.requests if "resourceclaims" in p] == gets  # no GET at all

    started = time.monotonic()
    fresh = prepare(run, NEW)[NEW]  # not prepared yet: it needs the API server
    assert "cannot fetch claim default/c-7777 from the API server" in fresh.error  # type: ignore[attr-defined]
    assert time.monotonic() - started < 5  # the request timeout (1 s), sent twice
    assert (
        gpu_driver.prepared_devices(
            type("Ref", (), {"uid": NEW, "namespace": "default", "name": "c-7777"})()  # type: ignore[arg-type]
        )
        is None
    )
