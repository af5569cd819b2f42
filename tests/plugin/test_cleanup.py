"""Stale-claim cleanup against the (fake) API server over HTTP."""

from __future__ import annotations

import logging

from dra_driver.plugin.claims import ClaimRef
from dra_driver.plugin.cleanup import StaleClaimCleaner
from dra_driver.plugin.preparing import ClaimService
from tests.plugin.fakes import DRIVER, FakeApiServer, FakeBackend, claim_object

LIVE = ClaimRef("default", "live", "66666666-0000-4000-8000-000000000001")
GONE = ClaimRef("default", "gone", "66666666-0000-4000-8000-000000000002")
RECREATED = ClaimRef("default", "again", "66666666-0000-4000-8000-000000000003")


def test_unprepares_claims_that_are_gone_or_recreated(api: FakeApiServer) -> None:
    api.add_claim(claim_object("live", LIVE.uid))
    api.add_claim(claim_object("again", "66666666-0000-4000-8000-0000000000ff"))
    backend = FakeBackend()
    backend.prepared = {r.uid: r for r in (LIVE, GONE, RECREATED)}
    client = api.client()
    log = logging.getLogger("test")
    service = ClaimService(
        driver_name=DRIVER,
        pool_name="node-a",
        backend=backend,
        get_claim=client.get_resource_claim,
        lock_file=None,
        logger=log,
    )
    cleaner = StaleClaimCleaner(
        prepared=backend.prepared_claims,
        get_claim=client.get_resource_claim,
        service=service,
        interval_s=600,
        logger=log,
    )
    assert sorted(cleaner.run_once()) == sorted([GONE.uid, RECREATED.uid])
    assert sorted(r.uid for r in backend.unprepared) == sorted([GONE.uid, RECREATED.uid])
    assert list(backend.prepared) == [LIVE.uid]
    service.close()
    client.close()


def test_cleanup_runs_once_at_start(start_plugin) -> None:
    backend = FakeBackend()
    backend.prepared = {GONE.uid: GONE}
    run = start_plugin(backend, cleanup_interval_s=3600)
    import time

    deadline = time.monotonic() + 5
    while not backend.unprepared and time.monotonic() < deadline:
        time.sleep(0.05)
    assert backend.unprepared == [GONE]
    assert run.plugin.cleaner is not None
