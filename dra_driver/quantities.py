"""Kubernetes quantities (``10Gi``, ``1.5G``, ``1e9``, ``100m``) as exact decimals.

Both layers need them: the plugin layer to check capacity request policies
before a slice is sent, the GPU layer to read opaque configs and the capacity
an allocation consumed. One parser, no dependency on either layer.
"""

from __future__ import annotations

import re
from decimal import Decimal, DecimalException

MAX_EXPONENT = 40
"""Exponent forms beyond ``e40`` are refused before a huge Decimal is built."""

_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$")
_SUFFIX = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    **{s: Decimal(1024) ** (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
}


class QuantityError(ValueError):
    """Not a quantity."""


class QuantityRangeError(QuantityError):
    """A quantity too large to be represented."""


def parse(value: str | int) -> Decimal:
    """The exact value of a quantity; raises :class:`QuantityError`."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise QuantityError(f"{value!r} is not a quantity")
    m = _QUANTITY.match(str(value).strip())
    if not m or len(m.group(1)) > MAX_EXPONENT:
        raise QuantityError(f"{value!r} is not a quantity (examples: 8Gi, 4096Mi, 1e9)")
    suffix = m.group(2) or ""
    if suffix not in _SUFFIX:  # exponent form, e.g. e9 (E alone is exa, Ei exbi)
        exponent = int(suffix[1:])
        if exponent > MAX_EXPONENT:
            raise QuantityRangeError(f"{value!r} is out of range")
        scale = Decimal(10) ** max(exponent, -MAX_EXPONENT - 1)  # smaller ones round up alike
    else:
        scale = _SUFFIX[suffix]
    try:
        return Decimal(m.group(1)) * scale
    except DecimalException as exc:
        raise QuantityError(f"{value!r} is not a quantity") from exc
