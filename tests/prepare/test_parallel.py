"""Claims on different GPUs prepare in parallel; one GPU is never acted on twice at once;
a second plugin process during a rolling update never corrupts the checkpoint.

The emulated tools sleep 200 ms per call (``<record>.delay``) and record when each call
ran, so overlap is read from what the tools saw, not from a stopwatch in the test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dra_driver.emulation import gputools
from dra_driver.plugin.claims import Claim, ClaimRef, PrepareError
from tests.prepare.hosttree import Node, claim, gpu_config, make_node

REPO = Path(__file__).parents[2]
TOOL_DELAY_S = 0.2
LONG = gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}})


def uid(i: int) -> str:
    return f"0a1b2c3d-0000-4000-8000-0000000{i:05d}"


def sliced(i: int, device: str | None = None) -> Claim:
    return claim(uid=uid(i), name=f"c{i}", devices=[("gpu", device or f"gpu-{i}")], configs=[LONG])


@pytest.fixture
def node16(tmp_path: Path) -> Node:
    node = make_node(tmp_path / "node", gpus=16)
    node.record.with_name(node.record.name + ".delay").write_text(f"{TOOL_DELAY_S}\n")
    return node


def in_threads(fn: Callable[[int], object], count: int) -> tuple[float, list[BaseException]]:
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            fn(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.monotonic() - start, errors


def max_overlap(calls: list[dict[str, object]]) -> int:
    edges = sorted(
        [(float(c["start"]), 1) for c in calls] + [(float(c["end"]), -1) for c in calls]  # type: ignore[arg-type]
    )
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak


def test_16_claims_on_16_gpus_prepare_and_unprepare_in_parallel(node16: Node) -> None:
    p = node16.preparer()
    elapsed, errors = in_threads(lambda i: p.prepare(sliced(i)), 16)
    assert errors == []
    calls = node16.calls("nvidia-smi")
    assert len(calls) == 32  # compute mode + time-slice per GPU
    # Serialised, the 32 calls of 200 ms would take 6.4 s and never overlap.
    assert max_overlap(calls) >= 8, max_overlap(calls)
    print(f"16 claims x 2 tool calls of {TOOL_DELAY_S}s prepared in {elapsed:.2f}s")
    elapsed, errors = in_threads(lambda i: p.unprepare(ClaimRef("ns", f"c{i}", uid(i))), 16)
    assert errors == []
    resets = node16.calls("nvidia-smi")[32:]
    assert len(resets) == 16 and max_overlap(resets) >= 8
    print(f"and unprepared in {elapsed:.2f}s")
    assert json.loads((node16.state_dir / "checkpoint.json").read_text())["claims"] == {}


def test_one_gpu_is_never_acted_on_by_two_claims_at_once(node16: Node) -> None:
    p = node16.preparer()
    p.prepare(sliced(0, "gpu-3"))
    outcomes: dict[str, str] = {}

    def race(i: int) -> None:
        try:
            if i == 0:
                p.unprepare(ClaimRef("ns", "c0", uid(0)))
            else:
                p.prepare(sliced(i, "gpu-3"))
            outcomes[uid(i)] = "ok"
        except PrepareError as exc:
            outcomes[uid(i)] = str(exc)

    in_threads(race, 4)
    calls = [c for c in node16.calls("nvidia-smi") if node16.inventory.gpus[3].uuid in c["argv"]]
    assert max_overlap(calls) == 1
    assert outcomes[uid(0)] == "ok"
    winners = [u for u in outcomes if u != uid(0) and outcomes[u] == "ok"]
    assert len(winners) <= 1  # the others find gpu-3 held, by c0 or by the winner
    assert all("'gpu-3' is already prepared" in outcomes[u] for u in outcomes if u != uid(0)
               and u not in winners)  # fmt: skip


def test_a_second_plugin_process_shares_the_checkpoint_without_corrupting_it(
    node16: Node,
) -> None:
    """Like two plugin pods during a rolling update: both prepare and unprepare claims on
    the same state dir at the same time; every entry survives every rewrite."""
    node16.record.with_name(node16.record.name + ".delay").write_text("0.05\n")
    script = (
        "import sys\nfrom pathlib import Path\n"
        "from tests.prepare.hosttree import open_node\n"
        "from tests.prepare.test_parallel import sliced\n"
        "p = open_node(Path(sys.argv[1]), gpus=16).preparer()\n"
        "for i in range(8, 16):\n    p.prepare(sliced(i))\n"
    )
    other = subprocess.Popen(
        [sys.executable, "-c", script, str(node16.root)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    p = node16.preparer()
    _, errors = in_threads(lambda i: p.prepare(sliced(i)), 8)
    assert other.wait(timeout=120) == 0
    assert errors == []
    claims = json.loads((node16.state_dir / "checkpoint.json").read_text())["claims"]
    assert sorted(claims) == [uid(i) for i in range(16)]
    assert all(e["state"] == "Prepared" for e in claims.values())
    _, errors = in_threads(lambda i: p.unprepare(ClaimRef("ns", f"c{i}", uid(i))), 16)
    assert errors == []
    assert json.loads((node16.state_dir / "checkpoint.json").read_text())["claims"] == {}
    assert gputools.read_record(node16.record)  # the tools really ran


def test_a_claim_without_units_takes_one_checkpoint_transaction_each_way(node16: Node) -> None:
    """Free GPUs: the claim is recorded, and dropped, in the transaction that looked."""
    p = node16.preparer()
    store, opened = p._store, []
    transaction = store.transaction

    def counted():  # type: ignore[no-untyped-def]
        opened.append(1)
        return transaction()

    store.transaction = counted  # type: ignore[method-assign]
    c = claim(uid=uid(1), name="c1", devices=[("gpu", "gpu-1")])
    p.prepare(c)
    assert len(opened) == 1 and p.prepared_claims() == [c.ref]
    opened.clear()
    p.unprepare(c.ref)
    assert len(opened) == 1 and p.prepared_claims() == []
    assert list(node16.cdi_dir.iterdir()) == []


def test_an_unprepare_during_the_prepare_of_the_same_claim_waits_for_it(node16: Node) -> None:
    """Between recording a claim and writing its spec the prepare holds the GPU: an
    unprepare that arrives then must not drop the entry and leave the spec written after
    it behind; it waits and removes both."""
    c = claim(uid=uid(2), name="c2", devices=[("gpu", "gpu-2")])
    seen: dict[str, bool] = {}
    unprepare = threading.Thread(target=lambda: p.unprepare(c.ref))

    def step(name: str) -> None:
        if name == "checkpoint-prepared" and not seen:
            unprepare.start()
            unprepare.join(0.5)
            seen["unprepare finished before the spec was written"] = not unprepare.is_alive()

    p = node16.preparer(on_step=step)
    p.prepare(c)
    unprepare.join(10)
    assert seen == {"unprepare finished before the spec was written": False}
    assert not unprepare.is_alive()
    assert p.prepared_claims() == [] and list(node16.cdi_dir.iterdir()) == []
