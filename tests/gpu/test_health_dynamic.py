"""Faults -> devices in dynamic MIG mode (pure): GPU-wide faults reach the whole GPU and
every placement, an instance's fault reaches the partition whose record holds it, and the
faults of an instance go when its holder does (NVML reuses GI/CI IDs)."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence

from dra_driver.errors import DriverError
from dra_driver.gpu.checkpoint import Unit
from dra_driver.gpu.hardware.partitions import partitions_by_name
from dra_driver.gpu.monitoring.health import DynamicMig, Fault, HealthBook, device_faults
from dra_driver.gpu.monitoring.healthpolicy import HealthPolicy, Severity
from dra_driver.gpu.monitoring.migholders import MigHolders
from dra_driver.gpu.sharing.miginstances import MigRequest

UUID = "GPU-2"
T0 = datetime.datetime(2026, 11, 28, 22, 0, 0, tzinfo=datetime.UTC).timestamp()
PARTITION = "gpu-2-mig-3g40gb-9-4"


def xid(n: int, scope: tuple[int, int] | None = None) -> Fault:
    return Fault("xid", str(n), Severity.FATAL, T0, f"Xid {n}", scope)


def test_faults_reach_the_whole_gpu_every_placement_or_the_holder(make_node, discover_node) -> None:
    inventory = discover_node(make_node("dgx-a100-mig-on"))  # MIG on, no instances
    gpu = next(g for g in inventory.gpus if g.minor == 2)
    published = set(partitions_by_name([gpu]))
    assert len(published) == 26 and "gpu-2" in published
    book = HealthBook(HealthPolicy())
    book.record(gpu.uuid, xid(79))
    assert set(device_faults(book.snapshot(), inventory, DynamicMig())) == published

    scoped = HealthBook(HealthPolicy())
    scoped.record(gpu.uuid, xid(95, scope=(2, 0)))
    ours = DynamicMig(owned={(gpu.uuid, 9, 4)}, held={(gpu.uuid, 2, 0): PARTITION})
    assert device_faults(scoped.snapshot(), inventory, ours) == {PARTITION: [xid(95, (2, 0))]}
    # An instance nobody's record holds (being made, or gone): GPU-wide, never lost.
    assert set(device_faults(scoped.snapshot(), inventory, DynamicMig())) == published
    # The whole GPU, prepared as the full instance (GI 0), holds its instance's faults.
    full = DynamicMig(owned={(gpu.uuid, 0, 0)}, held={(gpu.uuid, 0, 0): "gpu-2"})
    scoped.record(gpu.uuid, Fault("ecc", "double-bit", Severity.FATAL, T0, "dbe", (0, 0)))
    assert set(device_faults(scoped.snapshot(), inventory, full)) == published  # xid (2, 0)
    assert [f.kind for f in device_faults(scoped.snapshot(), inventory, full)["gpu-2"]] == [
        "ecc",
        "xid",
    ]


def unit(device: str, gi: int, ci: int = 0) -> Unit:
    request = MigRequest(UUID, 2, 2, 9, "3g.40gb", 3, 4, 4)
    record = {"request": request.to_json(), "giId": gi, "ciId": ci}
    return Unit("DynamicMIG", (device,), record=record)


class Checkpoint:
    def __init__(self) -> None:
        self.claims: Mapping[str, Sequence[Unit]] = {}
        self.broken = False

    def read(self) -> Mapping[str, Sequence[Unit]]:
        if self.broken:
            raise DriverError("checkpoint.json: corrupt")
        return self.claims


def test_an_instances_faults_go_with_its_holder() -> None:
    book, checkpoint = HealthBook(HealthPolicy()), Checkpoint()
    holders = MigHolders(read=checkpoint.read, book=book)
    checkpoint.claims = {"claim-a": [unit(PARTITION, gi=2)]}
    assert holders.update() and not holders.update()
    assert holders.view(()).held == {(UUID, 2, 0): PARTITION}
    book.record(UUID, xid(95, scope=(2, 0)))
    book.record(UUID, xid(79))  # GPU-wide: not the instance's
    checkpoint.broken = True  # unreadable: nothing is concluded from it
    assert not holders.update() and len(book.snapshot().faults[UUID]) == 2
    checkpoint.broken = False
    checkpoint.claims = {"claim-b": [unit(PARTITION, gi=2)]}  # same IDs, another claim
    assert holders.update()
    assert book.snapshot().faults[UUID] == (xid(79),)
    book.record(UUID, xid(95, scope=(2, 0)))
    checkpoint.claims = {}  # unprepared: the instance is destroyed
    assert holders.update() and holders.view(()).held == {}
    assert book.snapshot().faults[UUID] == (xid(79),)
