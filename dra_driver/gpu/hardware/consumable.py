"""Which full GPUs are published for sharing (``--consumable-gpus``) or split into MPS
slots (``--mps-slots``): plain values, kept apart from :mod:`dra_driver.gpu.sharing.shares`
and :mod:`dra_driver.gpu.sharing.slots` so that parsing the flags, which happens before the
daemon binds its sockets, loads nothing of the GPU layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dra_driver.gpu.hardware.inventory import Gpu, Inventory


@dataclass(frozen=True)
class ConsumableGpus:
    """Which full GPUs are published for sharing (``--consumable-gpus``)."""

    all: bool = False
    names: frozenset[str] = frozenset()
    """Product names (as NVML reports them, e.g. ``NVIDIA A100-SXM4-80GB``) or UUIDs."""

    @classmethod
    def parse(cls, text: str) -> ConsumableGpus:
        """``none``, ``all`` or a comma-separated list; raises ValueError."""
        value = text.strip()
        if value in ("", "none"):
            return cls()
        if value == "all":
            return cls(all=True)
        names = [n.strip() for n in value.split(",")]
        if any(not n for n in names):
            raise ValueError(
                f"{text!r}: an empty name in the list; expected none, all, or product names "
                "and GPU UUIDs separated by commas"
            )
        if {"all", "none"} & set(names):
            raise ValueError(f"{text!r}: all and none stand alone, not in a list")
        return cls(names=frozenset(names))

    def __bool__(self) -> bool:
        return self.all or bool(self.names)

    def selects(self, gpu: Gpu) -> bool:
        return self.all or gpu.uuid in self.names or gpu.product_name in self.names

    def unmatched(self, inventory: Inventory) -> list[str]:
        """Names that match no GPU of this node (a typo, or a GPU another node has)."""
        present = {g.uuid for g in inventory.gpus} | {g.product_name for g in inventory.gpus}
        return sorted(self.names - present)


MIN_SLOTS = 2
MAX_SLOTS = 64


@dataclass(frozen=True)
class MpsSlots:
    """GPUs split into N equal MPS slots (``--mps-slots``): ``<name or UUID>=<N>`` pairs.

    A UUID's count wins over its product name's, so one GPU of a model can differ."""

    counts: tuple[tuple[str, int], ...] = ()
    """(product name or GPU UUID, N), in flag order."""

    @classmethod
    def parse(cls, text: str) -> MpsSlots:
        """``none`` or ``<name>=<N>,...`` with N in 2..64; raises ValueError."""
        value = text.strip()
        if value in ("", "none"):
            return cls()
        counts: dict[str, int] = {}
        for item in value.split(","):
            name, sep, raw = item.strip().rpartition("=")
            name = name.strip()
            if not sep or not name:
                raise ValueError(
                    f"--mps-slots {text!r}: {item.strip()!r} is not <product name or GPU "
                    "UUID>=<N>; expected none or a comma-separated list such as "
                    "'NVIDIA L4=4,GPU-0c9f...=2'"
                )
            try:
                n = int(raw.strip())
            except ValueError:
                n = 0
            if str(n) != raw.strip() or not MIN_SLOTS <= n <= MAX_SLOTS:
                raise ValueError(
                    f"--mps-slots {text!r}: {name}={raw.strip()}: the number of slots must be "
                    f"a whole number from {MIN_SLOTS} to {MAX_SLOTS}"
                )
            if name in counts:
                raise ValueError(f"--mps-slots {text!r}: {name} is named twice")
            counts[name] = n
        return cls(counts=tuple(counts.items()))

    def __bool__(self) -> bool:
        return bool(self.counts)

    def slots_of(self, gpu: Gpu) -> int | None:
        """N for ``gpu`` (its UUID first, then its product name), None: not a slot GPU.
        MIG-enabled GPUs never are."""
        if gpu.mig_enabled:
            return None
        counts = dict(self.counts)
        return counts.get(gpu.uuid, counts.get(gpu.product_name))

    def unmatched(self, inventory: Inventory) -> list[str]:
        """Names that match no GPU of this node (a typo, or a GPU another node has)."""
        present = {g.uuid for g in inventory.gpus} | {g.product_name for g in inventory.gpus}
        return sorted({name for name, _ in self.counts} - present)
