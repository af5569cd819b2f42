"""Kubernetes ``resource.Quantity`` as an exact rational, for CEL's quantity library.

The scheduler compares quantities semantically (``1Gi == 1024Mi``), rounds
anything finer than 1n up (away from zero) when parsing, and converts to an
integer only when the value is integral and fits int64. Both CEL engines wrap
this one model, so they cannot disagree about arithmetic.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_SYNTAX = re.compile(
    r"(?P<sign>[+-]?)(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?"
)
_NANO = 10**9
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


class QuantityError(ValueError):
    """The string is not a Kubernetes quantity."""


@dataclass(frozen=True, slots=True)
class Quantity:
    """An exact value; ``text`` keeps the spelling it was parsed from for messages."""

    value: Fraction
    text: str = field(default="", compare=False)

    @property
    def canonical(self) -> str:
        """The exact value as ``n`` or ``n/d``: equal strings iff equal quantities."""
        return str(self.value)

    def __str__(self) -> str:
        return self.text or self.canonical

    def compare(self, other: Quantity) -> int:
        return (self.value > other.value) - (self.value < other.value)

    def sign(self) -> int:
        return (self.value > 0) - (self.value < 0)

    def is_integer(self) -> bool:
        return self.value.denominator == 1 and INT64_MIN <= self.value <= INT64_MAX

    def as_integer(self) -> int:
        if not self.is_integer():
            raise QuantityError(f"cannot convert value to integer: {self}")
        return int(self.value)

    def as_float(self) -> float:
        return float(self.value)

    def add(self, other: Quantity | int) -> Quantity:
        delta = other.value if isinstance(other, Quantity) else Fraction(other)
        return Quantity(self.value + delta)

    def sub(self, other: Quantity | int) -> Quantity:
        delta = other.value if isinstance(other, Quantity) else Fraction(other)
        return Quantity(self.value - delta)


@lru_cache(maxsize=4096)
def parse_quantity(text: str) -> Quantity:
    """Parse like ``resource.ParseQuantity``; raises :class:`QuantityError`."""
    match = _SYNTAX.fullmatch(text) if text else None
    if match is None:
        raise QuantityError(
            f"quantities must match the regular expression "
            f"'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {text!r}"
        )
    number = Fraction(match["num"] if not match["num"].endswith(".") else match["num"][:-1])
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        number *= _BINARY[suffix]
    elif suffix in _DECIMAL:
        number *= _DECIMAL[suffix]
    else:
        number *= Fraction(10) ** int(suffix[1:])
    # Anything finer than 1n is rounded up (away from zero), as Kubernetes does.
    scaled = number * _NANO
    if scaled.denominator != 1:
        number = Fraction(-(-scaled.numerator // scaled.denominator), _NANO)
    if match["sign"] == "-":
        number = -number
    return Quantity(number, text)


def is_quantity(text: str) -> bool:
    try:
        parse_quantity(text)
    except QuantityError:
        return False
    return True


def from_canonical(canonical: str) -> Quantity:
    """Inverse of :attr:`Quantity.canonical` (engines store the canonical form)."""
    return Quantity(Fraction(canonical))
