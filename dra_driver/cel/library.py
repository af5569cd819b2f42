"""Kubernetes' CEL libraries as plain Python over :mod:`quantity` and :mod:`semver` values.

Engines only convert their values to and from these types, so the quantity,
semver, lists, regex and sets functions behave the same on every engine. A
raised exception becomes a CEL error value in the calling engine.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

from dra_driver.cel.semver import Semver, parse_semver
from dra_driver.cel.semver import from_canonical as semver_from_canonical
from dra_driver.cel.semver import is_semver as _is_semver
from dra_driver.quantity import Quantity, from_canonical, is_quantity, parse_quantity

quantity_from_canonical = lru_cache(maxsize=8192)(from_canonical)
semver_from_canonical = lru_cache(maxsize=8192)(semver_from_canonical)

__all__ = ["is_quantity", "quantity_from_canonical", "semver_from_canonical"]


def quantity(text: str) -> Quantity:
    return parse_quantity(str(text))


def semver(text: str, normalize: bool = False) -> Semver:
    return parse_semver(str(text), bool(normalize))


def is_semver(text: str, normalize: bool = False) -> bool:
    return _is_semver(str(text), bool(normalize))


def _same_kind(a: object, b: object) -> None:
    if type(a) is not type(b) or not isinstance(a, Quantity | Semver):
        raise TypeError("no such overload")


def compare_to(a: Quantity | Semver, b: Quantity | Semver) -> int:
    _same_kind(a, b)
    return a.compare(b)  # type: ignore[arg-type]


def is_greater_than(a: Quantity | Semver, b: Quantity | Semver) -> bool:
    return compare_to(a, b) > 0


def is_less_than(a: Quantity | Semver, b: Quantity | Semver) -> bool:
    return compare_to(a, b) < 0


def sign(q: Quantity) -> int:
    return q.sign()


def is_integer(q: Quantity) -> bool:
    return q.is_integer()


def as_integer(q: Quantity) -> int:
    return q.as_integer()


def as_float(q: Quantity) -> float:
    return q.as_float()


def add(q: Quantity, other: Quantity | int) -> Quantity:
    return q.add(other)


def sub(q: Quantity, other: Quantity | int) -> Quantity:
    return q.sub(other)


def major(v: Semver) -> int:
    return v.major


def minor(v: Semver) -> int:
    return v.minor


def patch(v: Semver) -> int:
    return v.patch


def _key(value: object) -> object:
    if isinstance(value, Quantity | Semver):
        return _Ordered(value)
    return value


class _Ordered:
    __slots__ = ("v",)

    def __init__(self, v: Quantity | Semver) -> None:
        self.v = v

    def __lt__(self, other: _Ordered) -> bool:
        return compare_to(self.v, other.v) < 0


def is_sorted(items: Sequence[object]) -> bool:
    keys = [_key(x) for x in items]
    return all(not (keys[i + 1] < keys[i]) for i in range(len(keys) - 1))  # type: ignore[operator]


def list_sum(items: Sequence[object]) -> object:
    total: object = 0
    for i, x in enumerate(items):
        if isinstance(x, bool) or not isinstance(x, int | float):
            raise TypeError("no such overload: sum of non-numeric list")
        total = x if i == 0 else total + x  # type: ignore[operator]
    return total


def list_min(items: Sequence[object]) -> object:
    if not items:
        raise ValueError("min called on empty list")
    return min(items, key=_key)  # type: ignore[arg-type]


def list_max(items: Sequence[object]) -> object:
    if not items:
        raise ValueError("max called on empty list")
    return max(items, key=_key)  # type: ignore[arg-type]


def index_of(items: Sequence[object], value: object) -> int:
    for i, x in enumerate(items):
        if x == value:
            return i
    return -1


def last_index_of(items: Sequence[object], value: object) -> int:
    for i in range(len(items) - 1, -1, -1):
        if items[i] == value:
            return i
    return -1


@lru_cache(maxsize=256)
def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def find(text: str, pattern: str) -> str:
    match = _regex(str(pattern)).search(str(text))
    return match.group(0) if match else ""


def find_all(text: str, pattern: str, limit: int = -1) -> list[str]:
    found = [m.group(0) for m in _regex(str(pattern)).finditer(str(text))]
    return found if limit < 0 else found[:limit]


def sets_contains(a: Sequence[object], b: Sequence[object]) -> bool:
    return all(any(x == y for x in a) for y in b)


def sets_equivalent(a: Sequence[object], b: Sequence[object]) -> bool:
    return sets_contains(a, b) and sets_contains(b, a)


def sets_intersects(a: Sequence[object], b: Sequence[object]) -> bool:
    return any(any(x == y for x in a) for y in b)
