"""Which full GPUs are published for sharing (``--consumable-gpus``): a plain value,
kept apart from :mod:`dra_driver.gpu.shares` so that parsing the flag, which happens
before the daemon binds its sockets, loads nothing of the GPU layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dra_driver.gpu.inventory import Gpu, Inventory


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
