"""The CEL engine on ``cel-python`` (pure Python; the fallback when cel-expr-python is absent).

Its interpreter has no type checker and no ``cel.bind``/optional syntax, and
it refuses mixed int/uint/double comparisons that Kubernetes allows; those
divergences are listed in ``tests/cel/corpus.yaml``. Quantity and Semver
values are the plain Python objects of :mod:`dra_driver.cel.library`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from typing import Any

import celpy
from celpy import celtypes
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError

from dra_driver.cel import library
from dra_driver.cel.device import CelDevice
from dra_driver.cel.engine import CelCompileError, CelRuntimeError
from dra_driver.cel.semver import Semver
from dra_driver.quantity import Quantity

# cel-python logs every evaluation error at ERROR level; errors are results here.
logging.getLogger("celpy").setLevel(logging.CRITICAL)


class _Domains(celtypes.MapType):
    """``device.attributes`` / ``device.capacity``: an unknown domain is an empty map."""

    def __missing__(self, key: Any) -> celtypes.MapType:
        return celtypes.MapType({})


def to_cel(value: object) -> Any:
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        return celtypes.IntType(value)
    if isinstance(value, float):
        return celtypes.DoubleType(value)
    if isinstance(value, str):
        return celtypes.StringType(value)
    if isinstance(value, list | tuple):
        return celtypes.ListType([to_cel(v) for v in value])
    if isinstance(value, Mapping):
        return celtypes.MapType({to_cel(k): to_cel(v) for k, v in value.items()})
    return value  # Quantity, Semver, already-CEL values


def from_cel(value: Any) -> object:
    if isinstance(value, celtypes.BoolType):
        return bool(value)
    if isinstance(value, celtypes.UintType):
        return int(value)
    if isinstance(value, celtypes.IntType):
        return int(value)
    if isinstance(value, celtypes.DoubleType):
        return float(value)
    if isinstance(value, celtypes.StringType):
        return str(value)
    if isinstance(value, celtypes.ListType):
        return [from_cel(v) for v in value]
    if isinstance(value, celtypes.MapType):
        return {from_cel(k): from_cel(v) for k, v in value.items()}
    return value


def _wrap(fn: Callable[..., object]) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        try:
            return to_cel(fn(*(from_cel(a) for a in args)))
        except Exception as err:  # becomes a CEL error value, absorbed by && / ||
            return CELEvalError(str(err) or type(err).__name__, type(err), err.args)

    return call


def _index_of(receiver: object, value: object) -> int:
    if isinstance(receiver, list):
        return library.index_of(receiver, value)
    return str(receiver).find(str(value))


def _last_index_of(receiver: object, value: object) -> int:
    if isinstance(receiver, list):
        return library.last_index_of(receiver, value)
    return str(receiver).rfind(str(value))


def _substring(text: str, start: int, end: int | None = None) -> str:
    if start < 0 or start > len(text) or (end is not None and not start <= end <= len(text)):
        raise IndexError(f"substring index out of range: {start}, {end}")
    return text[start:end]


def _char_at(text: str, index: int) -> str:
    if not 0 <= index <= len(text):
        raise IndexError(f"index out of range: {index}")
    return text[index : index + 1]


def _split(text: str, sep: str, limit: int = -1) -> list[str]:
    if limit == 0:
        return []
    return text.split(sep, limit - 1) if limit > 0 else text.split(sep)


def _lower_ascii(text: str) -> str:
    return "".join(c.lower() if c.isascii() else c for c in text)


def _upper_ascii(text: str) -> str:
    return "".join(c.upper() if c.isascii() else c for c in text)


def _replace(text: str, old: str, new: str, limit: int = -1) -> str:
    return text.replace(old, new, limit)


def _join(items: list[str], sep: str = "") -> str:
    return sep.join(items)


def _sets(name: str) -> Callable[..., Any]:
    return _wrap(getattr(library, f"sets_{name}"))


_PLAIN: dict[str, Callable[..., object]] = {
    "quantity": library.quantity,
    "isQuantity": library.is_quantity,
    "semver": library.semver,
    "isSemver": library.is_semver,
    "compareTo": library.compare_to,
    "isGreaterThan": library.is_greater_than,
    "isLessThan": library.is_less_than,
    "sign": library.sign,
    "isInteger": library.is_integer,
    "asInteger": library.as_integer,
    "asApproximateFloat": library.as_float,
    "add": library.add,
    "sub": library.sub,
    "major": library.major,
    "minor": library.minor,
    "patch": library.patch,
    "isSorted": library.is_sorted,
    "sum": library.list_sum,
    "min": library.list_min,
    "max": library.list_max,
    "indexOf": _index_of,
    "lastIndexOf": _last_index_of,
    "find": library.find,
    "findAll": library.find_all,
    "lowerAscii": _lower_ascii,
    "upperAscii": _upper_ascii,
    "replace": _replace,
    "split": _split,
    "join": _join,
    "trim": str.strip,
    "substring": _substring,
    "charAt": _char_at,
}
FUNCTIONS: dict[str, Callable[..., Any]] = {name: _wrap(fn) for name, fn in _PLAIN.items()}


class Engine:
    name = "cel-python"

    def __init__(self) -> None:
        self._env = celpy.Environment()

    def compile(self, expression: str, *, require_bool: bool = True) -> object:
        if "sets." in expression:
            # cel-python resolves `sets.contains` as a member of a variable `sets`;
            # the library is exposed under flat names instead.
            expression = (
                expression.replace("sets.contains(", "sets_contains(")
                .replace("sets.equivalent(", "sets_equivalent(")
                .replace("sets.intersects(", "sets_intersects(")
            )
        try:
            ast = self._env.compile(expression)
        except CELParseError as err:
            raise CelCompileError(f"syntax error: {err}") from None
        functions = {
            **FUNCTIONS,
            "sets_contains": _sets("contains"),
            "sets_equivalent": _sets("equivalent"),
            "sets_intersects": _sets("intersects"),
        }
        return self._env.program(ast, functions=functions)

    def prepare(self, device: CelDevice) -> object:
        return {
            "device": celtypes.MapType(
                {
                    celtypes.StringType("driver"): celtypes.StringType(device.driver),
                    celtypes.StringType("attributes"): _Domains(
                        {
                            celtypes.StringType(dom): celtypes.MapType(
                                {celtypes.StringType(k): _value(v) for k, v in ids.items()}
                            )
                            for dom, ids in device.attributes.items()
                        }
                    ),
                    celtypes.StringType("capacity"): _Domains(
                        {
                            celtypes.StringType(dom): celtypes.MapType(
                                {celtypes.StringType(k): v for k, v in ids.items()}
                            )
                            for dom, ids in device.capacity.items()
                        }
                    ),
                    celtypes.StringType("allowMultipleAllocations"): celtypes.BoolType(
                        device.allow_multiple_allocations
                    ),
                }
            )
        }

    def evaluate(self, program: object, prepared: object) -> object:
        try:
            result = program.evaluate(prepared)  # type: ignore[attr-defined]
        except CELEvalError as err:
            raise CelRuntimeError(_message(err)) from None
        except (TypeError, ValueError, KeyError, IndexError, ZeroDivisionError) as err:
            raise CelRuntimeError(f"{type(err).__name__}: {err}") from None
        if isinstance(result, CELEvalError):
            raise CelRuntimeError(_message(result))
        return from_cel(result)


def _value(value: int | bool | str | Semver | Quantity) -> Any:
    return value if isinstance(value, Semver | Quantity) else to_cel(value)


_NO_MEMBER = re.compile(r"no such member in mapping: '([^']*)'")


def _message(err: CELEvalError) -> str:
    """cel-python's wording as the scheduler's (cel-go) where they mean the same."""
    text = str(err.args[0]) if err.args else "evaluation error"
    text = text.split(" (in activation", 1)[0]
    return _NO_MEMBER.sub(lambda m: f"no such key: {m[1]}", text)
