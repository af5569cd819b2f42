"""Dynamic MIG: which prepared partition holds which MIG instance, and its faults' lifetime.

NVML scopes a MIG fault by GI and CI IDs. Under dynamic MIG those name an
instance only while a claim's prepared record (the checkpoint) holds it: the
instance is destroyed at unprepare, and a later prepare may be given the same
IDs at another placement, for another claim. A fault belongs to the instance,
not to its IDs, so when the record that held an instance goes, or the same IDs
turn up held by another claim or device, the instance's faults are dropped
(:meth:`~dra_driver.gpu.monitoring.health.HealthBook.drop_scope`): the pod that used it
was told while it ran, and a partition made afterwards starts healthy.
GPU-wide faults are untouched; they heal as always.

The checkpoint is re-read after every dynamic MIG prepare and unprepare and at
every discovery, under one lock, so no older reading replaces a newer one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TypeVar

from dra_driver.errors import DriverError
from dra_driver.gpu.checkpoint import Unit
from dra_driver.gpu.hardware.partitions import InstanceKey, OwnedInstance
from dra_driver.gpu.monitoring.health import DynamicMig, HealthBook
from dra_driver.gpu.sharing.strategies.dynamicmig import held_by

_A = TypeVar("_A")
_R = TypeVar("_R")


class MigHolders:
    """The instances our prepared partitions hold; thread-safe."""

    def __init__(
        self, *, read: Callable[[], Mapping[str, Sequence[Unit]]], book: HealthBook | None
    ) -> None:
        """``read``: the checkpoint's units per claim UID. ``book``: whose faults of
        instances gone are dropped (None: no health monitor)."""
        self._read = read
        self._book = book
        self._lock = threading.Lock()
        self._holders: dict[InstanceKey, tuple[str, str]] = {}
        self._held: Mapping[InstanceKey, str] = {}
        """MIG instance -> the device whose record holds it (replaced whole, never mutated)."""

    def view(self, owned: Collection[OwnedInstance]) -> DynamicMig:
        """What fault mapping needs (:func:`~dra_driver.gpu.monitoring.health.device_faults`)."""
        return DynamicMig(owned=owned, held=self._held)

    def update(self) -> bool:
        """Re-read the checkpoint; True when a holder changed. Faults of an instance whose
        holder went or changed are dropped first. An unreadable checkpoint changes nothing
        (the node is then not ready and every device tainted)."""
        with self._lock:
            try:
                holders = held_by(self._read())
            except DriverError:
                return False
            if holders == self._holders:
                return False
            for (uuid, gi, ci), holder in self._holders.items():
                if holders.get((uuid, gi, ci)) != holder and self._book is not None:
                    self._book.drop_scope(uuid, (gi, ci))
            self._holders = holders
            self._held = {key: device for key, (_, device) in holders.items()}
            return True

    def following(self, call: Callable[[_A], _R], then: Callable[[], None]) -> Callable[[_A], _R]:
        """``call`` (a prepare or unprepare, which may make or destroy instances), after
        which the holders are re-read, and ``then`` called when they changed."""

        def follow(arg: _A) -> _R:
            try:
                return call(arg)
            finally:
                if self.update():
                    then()

        return follow
