"""Kubernetes ``resource.Quantity`` (``10Gi``, ``1.5G``, ``1e9``, ``100m``) as an exact rational.

One parser for the whole project: the daemon reads opaque configs, consumed capacity
and request policies with it, and CEL's quantity library (``simulate``, ``explain``)
compares device capacities with it. Values are :class:`~fractions.Fraction`, never
floats, because the scheduler compares quantities semantically (``1Gi == 1024Mi``,
``0.1n == 1n``) and an allocator that rounds differently would place claims the
scheduler refuses.

Parsing follows ``resource.ParseQuantity``: decimal (``k`` .. ``E``, ``m``, ``u``,
``n``) and binary (``Ki`` .. ``Ei``) suffixes, decimal exponents (``1e9``, ``E`` alone
is exa), and anything finer than ``1n`` rounded up, away from zero. Two limits the API
server does not have keep a hostile string from costing seconds of big-integer
arithmetic: at most :data:`MAX_DIGITS` characters before the suffix
(:class:`QuantityError`) and exponents up to ``e``:data:`MAX_EXPONENT`
(:class:`QuantityRangeError`); both are far beyond any device's capacity (8Ei is 19
digits). Smaller exponents than that are exact (they round up to 1n alike).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from typing import Any

MAX_DIGITS = 40
"""Characters of the number before its suffix, sign and decimal point included."""
MAX_EXPONENT = 40
"""``1e40`` is the largest exponent form; ``1e41`` raises :class:`QuantityRangeError`."""
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

_SYNTAX = re.compile(
    r"(?P<sign>[+-]?)(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?"
)
_SCALE = {
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
    **{
        s: Fraction(2 ** (10 * (i + 1))) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))
    },
}
_NANO = 10**9


class QuantityError(ValueError):
    """Not a Kubernetes quantity."""


class QuantityRangeError(QuantityError):
    """A quantity whose exponent is beyond :data:`MAX_EXPONENT`."""


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
        """Integral and within int64, as ``Quantity.AsInt64`` requires."""
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
    match = _SYNTAX.fullmatch(text) if isinstance(text, str) else None
    if match is None or len(match["sign"] + match["num"]) > MAX_DIGITS:
        raise QuantityError(f"{text!r} is not a quantity (examples: 8Gi, 4096Mi, 1e9)")
    number = Fraction(match["num"].removesuffix("."))
    suffix = match["suffix"] or ""
    if suffix in _SCALE:
        number *= _SCALE[suffix]
    else:  # exponent form, e.g. e9
        digits = suffix[1:]
        # int() refuses over 4,300 digits; anything this long is out of range or 1n anyway
        exponent = int(digits) if len(digits) <= 12 else (-1 if digits[0] == "-" else 1) * 10**12
        if exponent > MAX_EXPONENT:
            raise QuantityRangeError(f"{text!r} is out of range")
        # Below 1e-(digits + 10) every non-zero value rounds up to 1n alike.
        number *= Fraction(10) ** max(exponent, -(len(match["num"]) + 10))
    # Anything finer than 1n is rounded up (away from zero), as Kubernetes does.
    scaled = number * _NANO
    if scaled.denominator != 1:
        number = Fraction(-(-scaled.numerator // scaled.denominator), _NANO)
    return Quantity(-number if match["sign"] == "-" else number, text)


def parse(value: str | int) -> Fraction:
    """The exact value of a quantity given as a string or a (non-bool) integer, as YAML
    and JSON configs hold them; raises :class:`QuantityError`."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise QuantityError(f"{value!r} is not a quantity (examples: 8Gi, 4096Mi, 1e9)")
    return Fraction(value) if isinstance(value, int) else parse_quantity(value).value


def is_quantity(text: str) -> bool:
    try:
        parse_quantity(text)
    except QuantityError:
        return False
    return True


def from_canonical(canonical: str) -> Quantity:
    """Inverse of :attr:`Quantity.canonical` (engines store the canonical form)."""
    return Quantity(Fraction(canonical))


def pod_requests(pod: Mapping[str, Any]) -> tuple[int, int]:
    """CPU (milli) and memory (MiB), each rounded up, that a Pod object's containers
    request; a missing or empty request counts 0. One reading for ``plan
    --from-cluster`` and the scoring extender, which both count pods against nodes."""
    cpu = memory = Fraction(0)
    for container in (pod.get("spec") or {}).get("containers") or ():
        requests = (container.get("resources") or {}).get("requests") or {}
        cpu += parse(str(requests.get("cpu") or 0))
        memory += parse(str(requests.get("memory") or 0))
    return math.ceil(cpu * 1000), math.ceil(memory / 2**20)
