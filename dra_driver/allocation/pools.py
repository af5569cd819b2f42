"""Which ResourceSlices a node sees, grouped into pools as the scheduler groups them.

Per (driver, pool) only the newest generation counts; a pool is complete when
the node sees as many slices of that generation as ``resourceSliceCount``, or
when the slices not targeting the node make up the rest; an older generation
is skipped as obsolete. Duplicate device names and counters that do not exist
make a pool invalid. Pools are ordered by driver then name, slices by name,
which fixes the order devices are tried in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dra_driver.allocation.model import Device, Node, Slice
from dra_driver.quantity import Quantity


@dataclass(eq=False)
class Pool:
    driver: str
    name: str
    generation: int = 0
    incomplete: bool = False
    invalid: str = ""
    slices: list[Slice] = field(default_factory=list)
    """Device slices that target the node, sorted by name."""
    other_slices: list[Slice] = field(default_factory=list)
    """Device slices of the pool that do not target the node (they still consume counters)."""
    counter_sets: dict[str, dict[str, Quantity]] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.driver}/{self.name}"


def _requirement(req: Mapping[str, Any], value: str | None) -> bool:
    op = req.get("operator")
    values = [str(v) for v in req.get("values") or ()]
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt"):
        try:
            have, want = int(value or ""), int(values[0])
        except (ValueError, IndexError):
            return False
        return have > want if op == "Gt" else have < want
    return False


def selector_matches(selector: Mapping[str, Any], node: Node) -> bool:
    """A core/v1 NodeSelector: terms are ORed, requirements within a term ANDed."""
    for term in selector.get("nodeSelectorTerms") or ():
        exprs = term.get("matchExpressions") or ()
        fields = term.get("matchFields") or ()
        if not exprs and not fields:
            continue  # an empty term matches no node
        if all(_requirement(r, node.labels.get(str(r.get("key")))) for r in exprs) and all(
            _requirement(r, node.name if r.get("key") == "metadata.name" else None) for r in fields
        ):
            return True
    return False


def node_matches(
    node: Node, node_name: str, all_nodes: bool, selector: Mapping[str, Any] | None
) -> bool:
    if node_name:
        return node.name == node_name
    if all_nodes:
        return True
    if selector is not None:
        return selector_matches(selector, node)
    return False


def device_on_node(device: Device, node: Node) -> bool:
    return node_matches(node, device.node_name, device.all_nodes, device.node_selector)


def slice_targets(slice_: Slice, node: Node) -> bool:
    if slice_.node_name or slice_.all_nodes or slice_.node_selector is not None:
        return node_matches(node, slice_.node_name, slice_.all_nodes, slice_.node_selector)
    if slice_.per_device_node_selection:
        return any(device_on_node(d, node) for d in slice_.devices)
    return False


class SliceIndex:
    """Slices by node name and by pool, so gathering one node's pools is not O(all slices)."""

    def __init__(self, slices: Iterable[Slice]) -> None:
        self.by_node: dict[str, list[Slice]] = {}
        self.elsewhere: list[Slice] = []
        self.by_pool: dict[tuple[str, str], list[Slice]] = {}
        for s in slices:
            self.by_pool.setdefault((s.driver, s.pool), []).append(s)
            if s.node_name:
                self.by_node.setdefault(s.node_name, []).append(s)
            else:
                self.elsewhere.append(s)

    def candidates(self, node: Node) -> list[Slice]:
        return self.by_node.get(node.name, []) + self.elsewhere


def gather_pools(node: Node, all_slices: Iterable[Slice] | SliceIndex) -> list[Pool]:
    """The pools ``node`` can allocate from, in the scheduler's order."""
    index = all_slices if isinstance(all_slices, SliceIndex) else SliceIndex(all_slices)
    seen: dict[tuple[str, str], list[Slice]] = {}
    for s in index.candidates(node):
        if not slice_targets(s, node):
            continue
        key = (s.driver, s.pool)
        have = seen.get(key)
        if have is None or s.generation > have[0].generation:
            seen[key] = [s]
        elif s.generation == have[0].generation:
            have.append(s)
    pools = []
    for (driver, name), mine in seen.items():
        generation = mine[0].generation
        pool_slices = mine
        if len(mine) != mine[0].slice_count:
            same_pool = index.by_pool[(driver, name)]
            if any(s.generation > generation for s in same_pool):
                continue  # obsolete: a newer generation is being published
            pool_slices = [s for s in same_pool if s.generation == generation]
            if len(pool_slices) != mine[0].slice_count:
                pools.append(Pool(driver, name, generation, incomplete=True))
                continue
        pools.append(_build(driver, name, generation, mine, pool_slices))
    pools.sort(key=lambda p: (bool(_has_binding_conditions(p)), p.driver, p.name))
    return pools


def _has_binding_conditions(pool: Pool) -> bool:
    return any(d.binding_conditions for s in pool.slices for d in s.devices)


def _build(
    driver: str, name: str, generation: int, mine: list[Slice], all_of_pool: list[Slice]
) -> Pool:
    mine_ids = {id(s) for s in mine}
    pool = Pool(driver, name, generation)
    for s in sorted(all_of_pool, key=lambda s: s.name):
        if s.counter_sets:
            for set_name, counters in s.counter_sets.items():
                if set_name in pool.counter_sets:
                    pool.invalid = f"duplicate counter set name {set_name}"
                    return pool
                pool.counter_sets[set_name] = counters
        elif id(s) in mine_ids:
            pool.slices.append(s)
        else:
            pool.other_slices.append(s)
    names: set[str] = set()
    for s in pool.slices:
        for d in s.devices:
            if d.name in names:
                pool.invalid = f"duplicate device name {d.name}"
                return pool
            names.add(d.name)
    for s in pool.slices + pool.other_slices:
        for d in s.devices:
            for set_name, counters in d.consumes.items():
                if set_name not in pool.counter_sets:
                    pool.invalid = f"counter set {set_name} not found"
                    return pool
                for counter in counters:
                    if counter not in pool.counter_sets[set_name]:
                        pool.invalid = f"counter {counter} not found in counter set {set_name}"
                        return pool
    return pool
