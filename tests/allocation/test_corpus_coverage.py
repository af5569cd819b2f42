"""The differential corpus (seed 15, 200 scenarios, as the cluster test) covers every feature."""

from __future__ import annotations

import json

from tests.allocation.corpus import SELECTORS, Generator


def test_default_corpus_covers_every_feature() -> None:
    gen = Generator(15, "ns", "x")
    scenarios = [gen.scenario(i) for i in range(200)]
    slices = json.dumps([s for sc in scenarios for s in sc.slices])
    claims = json.dumps(
        [o for sc in scenarios for ph in sc.phases for o in ph if o["kind"] == "ResourceClaim"]
    )
    claim_features = (
        '"allocationMode": "All"', '"firstAvailable"', '"adminAccess": true', '"tolerations"',
        '"capacity": {"requests"', '"matchAttribute"', '"distinctAttribute"', '"count": 3',
        '"diff-nic"',
    )  # fmt: skip
    for needle in claim_features:
        assert needle in claims, needle
    for needle in ('"sharedCounters"', '"consumesCounters"', '"allowMultipleAllocations": true',
                   '"validRange"', '"validValues"', '"NoExecute"', '"NoSchedule"',
                   '"generation": 2', '"resourceSliceCount": 3', "nic.example.com"):  # fmt: skip
        assert needle in slices, needle
    used = sum(json.dumps(s)[1:-1] in claims for s in SELECTORS)
    assert used == len(SELECTORS)
    assert sum(len(sc.phases) == 2 for sc in scenarios) > 30
