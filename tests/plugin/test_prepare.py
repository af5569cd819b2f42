"""NodePrepare/NodeUnprepare over the real DRA socket, both service versions."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from dra_driver.devcluster import wait_until
from dra_driver.plugin._proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
)
from dra_driver.plugin.claims import ClaimRef
from dra_driver.plugin.preparing import ClaimService, start_every_thread
from dra_driver.plugin.sockets import FileLock
from tests.plugin.conftest import RunningPlugin, StartPlugin
from tests.plugin.fakes import DRIVER, FakeBackend, claim_object

VERSIONS = [
    pytest.param((dra_v1_pb2, dra_v1_pb2_grpc), id="v1"),
    pytest.param((dra_v1beta1_pb2, dra_v1beta1_pb2_grpc), id="v1beta1"),
]
UID_A = "11111111-aaaa-4000-8000-000000000001"
UID_B = "11111111-aaaa-4000-8000-000000000002"


def _prepare(run: RunningPlugin, version: Any, *claims: tuple[str, str]) -> Any:
    pb, pb_grpc = version
    req = pb.NodePrepareResourcesRequest(
        claims=[pb.Claim(namespace="default", name=n, uid=u) for n, u in claims]
    )
    with run.channel() as ch:
        return pb_grpc.DRAPluginStub(ch).NodePrepareResources(req, timeout=45)


def _unprepare(run: RunningPlugin, version: Any, *claims: tuple[str, str]) -> Any:
    pb, pb_grpc = version
    req = pb.NodeUnprepareResourcesRequest(
        claims=[pb.Claim(namespace="default", name=n, uid=u) for n, u in claims]
    )
    with run.channel() as ch:
        return pb_grpc.DRAPluginStub(ch).NodeUnprepareResources(req, timeout=45)


@pytest.mark.parametrize("version", VERSIONS)
def test_prepare_filters_to_our_driver_and_returns_base_request_names(
    start_plugin: StartPlugin, version: Any
) -> None:
    run = start_plugin()
    run.api.add_claim(
        claim_object(
            "c1",
            UID_A,
            results=[
                {
                    "request": "gpus/big",
                    "driver": DRIVER,
                    "pool": "node-a",
                    "device": "gpu-0",
                    "shareID": "5b1c7f0e-0000-4000-8000-00000000000a",
                },
                {"request": "nic", "driver": "net.other.io", "pool": "node-a", "device": "eth1"},
            ],
            config=[
                {
                    "source": "FromClass",
                    "requests": [],
                    "opaque": {"driver": DRIVER, "parameters": {"sharing": "time-slicing"}},
                },
                {
                    "source": "FromClaim",
                    "requests": ["nic"],
                    "opaque": {"driver": "net.other.io", "parameters": {"mtu": 9000}},
                },
            ],
        )
    )
    resp = _prepare(run, version, ("c1", UID_A))
    assert list(resp.claims) == [UID_A]
    entry = resp.claims[UID_A]
    assert entry.error == ""
    assert [(d.pool_name, d.device_name, list(d.request_names)) for d in entry.devices] == [
        ("node-a", "gpu-0", ["gpus"])
    ]
    assert list(entry.devices[0].cdi_device_ids) == [f"{DRIVER}/gpu={UID_A}-gpu-0"]
    if version[0] is dra_v1_pb2:
        assert entry.devices[0].share_id == "5b1c7f0e-0000-4000-8000-00000000000a"
    claim = run.backend.seen_claims[0]
    assert [(d.request, d.base_request) for d in claim.devices] == [("gpus/big", "gpus")]
    assert [c.parameters for c in claim.configs] == [{"sharing": "time-slicing"}]
    assert claim.configs[0].source == "FromClass"


@pytest.mark.parametrize("version", VERSIONS)
def test_every_requested_uid_gets_its_own_outcome(start_plugin: StartPlugin, version: Any) -> None:
    run = start_plugin()
    uids = {n: f"22222222-bbbb-4000-8000-00000000000{i}" for i, n in enumerate("abcdef")}
    run.api.add_claim(claim_object("a", uids["a"]))
    run.api.add_claim(claim_object("b", "99999999-0000-4000-8000-000000000000"))  # re-created
    run.api.add_claim(claim_object("c", uids["c"], allocated=False))
    # "d" does not exist at all
    run.api.add_claim(claim_object("e", uids["e"]))
    run.backend.fail[uids["e"]] = "GPU fell off the bus"
    run.api.add_claim(
        claim_object(
            "f",
            uids["f"],
            results=[{"request": "r", "driver": "other.io", "pool": "p", "device": "d"}],
        )
    )
    resp = _prepare(run, version, *[(n, u) for n, u in uids.items()])
    assert set(resp.claims) == set(uids.values())
    errors = {n: resp.claims[u].error for n, u in uids.items()}
    assert errors["a"] == "" and len(resp.claims[uids["a"]].devices) == 1
    assert "re-created" in errors["b"]
    assert "not allocated" in errors["c"]
    assert "not found" in errors["d"]
    assert errors["e"] == "GPU fell off the bus"
    assert f"no devices allocated by driver {DRIVER}" in errors["f"]
    assert [c.uid for c in run.backend.seen_claims].count(uids["b"]) == 0


@pytest.mark.parametrize("version", VERSIONS)
def test_unprepare_works_when_the_claim_object_is_gone(
    start_plugin: StartPlugin, version: Any
) -> None:
    run = start_plugin()
    resp = _unprepare(run, version, ("gone", UID_A))
    assert list(resp.claims) == [UID_A] and resp.claims[UID_A].error == ""
    assert run.backend.unprepared == [ClaimRef("default", "gone", UID_A)]
    assert not any("resourceclaims" in p for _, p in run.api.requests)


def test_invalid_uid_is_rejected_before_the_backend_sees_it(start_plugin: StartPlugin) -> None:
    run = start_plugin()
    bad = "../../etc"
    resp = _unprepare(run, VERSIONS[0].values[0], ("x", bad))
    assert "invalid" in resp.claims[bad].error
    assert run.backend.unprepared == []


def _concurrent_prepares(run: RunningPlugin, uids: list[str]) -> list[Any]:
    for i, uid in enumerate(uids):
        run.api.add_claim(claim_object(f"c{i}", uid))
    with ThreadPoolExecutor(len(uids)) as pool:
        futures = [
            pool.submit(_prepare, run, VERSIONS[0].values[0], (f"c{i}", uid))
            for i, uid in enumerate(uids)
        ]
        return [f.result() for f in futures]


def test_different_claims_run_in_parallel_when_the_backend_allows(
    start_plugin: StartPlugin,
) -> None:
    run = start_plugin(FakeBackend(delay_s=0.3, supports_parallel_claims=True))
    uids = [f"33333333-cccc-4000-8000-00000000000{i}" for i in range(4)]
    results = _concurrent_prepares(run, uids)
    assert all(r.claims[u].error == "" for r, u in zip(results, uids, strict=True))
    assert run.backend.max_active_total > 1


def test_a_burst_s_api_connections_are_kept_for_the_calls_after_it(
    start_plugin: StartPlugin,
) -> None:
    """16 prepares at once GET their claims concurrently, on at most one connection per
    gRPC worker; the client's pool keeps them, so the prepares after the burst open
    none: every connection is a TLS handshake and a socket on the API server."""
    run = start_plugin(FakeBackend(supports_parallel_claims=True))
    run.api.claim_get_delay_s = 0.01
    first = [f"55555555-eeee-4000-8000-0000000000{i:02d}" for i in range(16)]
    results = _concurrent_prepares(run, first)
    assert all(r.claims[u].error == "" for r, u in zip(results, first, strict=True))
    opened = set(run.api.claim_get_peers)
    assert 1 <= len(opened) <= run.settings.grpc_workers
    run.api.claim_get_peers.clear()
    for i in range(16):
        uid = f"66666666-eeee-4000-8000-0000000000{i:02d}"
        run.api.add_claim(claim_object(f"c{i}", uid))
        assert _prepare(run, VERSIONS[0].values[0], (f"c{i}", uid)).claims[uid].error == ""
    assert run.api.claim_get_peers <= opened


def test_a_slow_api_server_does_not_queue_a_burst_into_timeouts(
    start_plugin: StartPlugin,
) -> None:
    """With every GET taking 1.5 s, 16 prepares at once finish in two GETs' time (one per
    8 gRPC workers), not 16 (or more) rounds of them: a connection for each worker."""
    run = start_plugin(FakeBackend(supports_parallel_claims=True))
    run.api.claim_get_delay_s = 1.5
    uids = [f"77777777-aaaa-4000-8000-0000000000{i:02d}" for i in range(16)]
    started = time.monotonic()
    results = _concurrent_prepares(run, uids)
    assert all(r.claims[u].error == "" for r, u in zip(results, uids, strict=True))
    assert time.monotonic() - started < 3.5


def _grpc_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("grpc")}


def test_the_first_burst_after_a_start_starts_no_thread(start_plugin: StartPlugin) -> None:
    """Every gRPC worker runs before the first call: a pool that started one per call
    put 15 thread starts into the first burst's dispatch (docs/benchmarks.md)."""
    before = _grpc_threads()  # other tests' plugins may still be ending theirs
    run = start_plugin(FakeBackend(delay_s=0.1, supports_parallel_claims=True))
    ours = _grpc_threads() - before
    assert len(ours) == run.settings.grpc_workers
    uids = [f"66666666-ffff-4000-8000-0000000000{i:02d}" for i in range(16)]
    results = _concurrent_prepares(run, uids)
    assert all(r.claims[u].error == "" for r, u in zip(results, uids, strict=True))
    # the started threads do serve calls at once
    assert run.backend.max_active_total > run.settings.grpc_workers // 2
    assert _grpc_threads() - before == ours


def test_start_every_thread_leaves_every_thread_idle() -> None:
    with ThreadPoolExecutor(6, thread_name_prefix="every-thread-test") as pool:
        start_every_thread(pool, 6)
        names = [t.name for t in threading.enumerate() if t.name.startswith("every-thread-test")]
        assert len(names) == 6
        together = threading.Barrier(6)  # six tasks at once need six idle threads
        assert all(
            f.result(5) is not None for f in [pool.submit(together.wait, 5) for _ in range(6)]
        )


def test_claims_are_serialised_when_the_backend_does_not_allow_parallelism(
    start_plugin: StartPlugin,
) -> None:
    run = start_plugin(FakeBackend(delay_s=0.1))
    _concurrent_prepares(run, [f"44444444-dddd-4000-8000-00000000000{i}" for i in range(4)])
    assert run.backend.max_active_total == 1


def test_the_same_claim_is_never_handled_twice_at_once(start_plugin: StartPlugin) -> None:
    run = start_plugin(FakeBackend(delay_s=0.2, supports_parallel_claims=True))
    run.api.add_claim(claim_object("same", UID_A))
    with ThreadPoolExecutor(4) as pool:
        futures = [
            pool.submit(_prepare, run, VERSIONS[0].values[0], ("same", UID_A)) for _ in range(3)
        ]
        futures.append(pool.submit(_unprepare, run, VERSIONS[1].values[0], ("same", UID_A)))
        for f in futures:
            f.result()
    assert run.backend.max_active_per_claim == 1
    assert len(run.backend.seen_claims) == 3


@pytest.mark.parametrize("parallel", [False, True], ids=["serial-backend", "parallel-backend"])
def test_rolling_update_file_lock_serialises_two_instances_of_a_serial_backend(
    short_dir: Path, parallel: bool
) -> None:
    """Two plugin instances (here: two services) sharing serialize.lock never overlap when
    the backend runs one claim at a time; a ParallelClaims backend orders claims itself
    (the GPU backend by GPU and checkpoint locks), so the file lock must not serialise it."""
    backend = FakeBackend(delay_s=0.2, supports_parallel_claims=parallel)
    lock = short_dir / "serialize.lock"

    def preparer() -> ClaimService:
        return ClaimService(
            driver_name=DRIVER,
            pool_name="node-a",
            backend=backend,
            get_claim=lambda ns, name: claim_object(name, name),
            lock_file=FileLock(lock),
            logger=logging.getLogger("test"),
        )

    first, second = preparer(), preparer()
    uids = [f"55555555-eeee-4000-8000-00000000000{i}" for i in range(4)]
    threads = [
        threading.Thread(target=p.prepare, args=([ClaimRef("default", u, u)],))
        for p, u in zip([first, second, first, second], uids, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(backend.seen_claims) == 4
    assert (backend.max_active_total > 1) if parallel else (backend.max_active_total == 1)
    first.close()
    second.close()


def test_metrics_given_after_start_count_from_then_on(start_plugin: StartPlugin) -> None:
    """The daemon serves before it imports prometheus-client and adds the registry later:
    claims handled before count nowhere, those after do, and the scrape-time gauges and
    slice-sync metrics are all there."""
    from prometheus_client import CollectorRegistry

    from dra_driver.plugin.metrics import exposition

    run = start_plugin()
    v1 = (dra_v1_pb2, dra_v1_pb2_grpc)
    assert _unprepare(run, v1, ("gone", UID_A)).claims[UID_A].error == ""
    registry = CollectorRegistry()
    run.plugin.add_metrics(registry)
    with pytest.raises(ValueError, match="already has metrics"):
        run.plugin.add_metrics(CollectorRegistry())
    assert _unprepare(run, v1, ("gone", UID_B)).claims[UID_B].error == ""
    run.plugin.republish()  # a sync after the registry came: counted
    wait_until(lambda: (registry.get_sample_value(
        "dra_driver_resourceslice_sync_duration_seconds_count") or 0) >= 1,
        timeout=10, what="a counted slice sync")  # fmt: skip
    unprepares = registry.get_sample_value(
        "dra_driver_node_operation_duration_seconds_count", {"operation": "unprepare"}
    )
    assert unprepares == 1
    assert registry.get_sample_value("dra_driver_prepared_claims") == 0
    text = exposition(registry)()[0].decode()
    assert "dra_driver_device_healthy{" in text and "dra_driver_prepared_devices 0.0" in text
