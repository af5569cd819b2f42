"""The CEL engine on ``cel-expr-python`` (Google's C++ CEL with its type checker).

Quantity and Semver are protobuf messages named like Kubernetes' CEL types
(``kubernetes.Quantity``, ``kubernetes.Semver``) holding the canonical value,
so built-in ``==`` is the scheduler's semantic equality and type errors read as
the scheduler's do. Gaps closed here: a missing attribute domain reads as an
empty map; mixed int/uint/double literal comparisons, which the C++ checker
rejects but Kubernetes accepts, compile unchecked.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import cel_expr_python.cel as cel
from cel_expr_python.ext import ext_bindings, ext_optional, ext_strings
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

from dra_driver.cel import library
from dra_driver.cel.device import CelDevice
from dra_driver.cel.engine import CelCompileError, CelRuntimeError
from dra_driver.cel.semver import Semver
from dra_driver.quantity import Quantity

_MISSING_KEY = re.compile(r'Key not found in map : "(?P<key>[^"]*)"')
_CROSS_NUMERIC = re.compile(
    r"found no matching overload for '_(?:<|<=|>|>=)_' applied to "
    r"'\((?:int|uint|double), (?:int|uint|double)\)'"
)
_MAX_DOMAIN_RETRIES = 8


def _build_pool() -> tuple[descriptor_pool.DescriptorPool, type[Message], type[Message]]:
    proto = descriptor_pb2.FileDescriptorProto(
        name="dra_driver_cel_kubernetes.proto", package="kubernetes", syntax="proto3"
    )
    for name in ("Quantity", "Semver"):
        message = proto.message_type.add(name=name)
        message.field.add(
            name="value",
            number=1,
            type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
            label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
        )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    quantity = message_factory.GetMessageClass(pool.FindMessageTypeByName("kubernetes.Quantity"))
    semver = message_factory.GetMessageClass(pool.FindMessageTypeByName("kubernetes.Semver"))
    return pool, quantity, semver


@dataclass
class _Prepared:
    """One device: its plain dict and Activations (extra empty domains -> Activation)."""

    data: dict[str, Any]
    activations: dict[frozenset[str], Any] = field(default_factory=dict)


class Engine:
    name = "cel-expr-python"

    def __init__(self) -> None:
        self._pool, self._quantity_cls, self._semver_cls = _build_pool()
        self._qtype = cel.Type("kubernetes.Quantity")
        self._stype = cel.Type("kubernetes.Semver")
        self._env = cel.NewEnv(
            self._pool,
            variables={"device": cel.Type.DYN},
            extensions=[
                ext_strings.ExtStrings(version=2),
                ext_bindings.ExtBindings(),
                ext_optional.ExtOptional(),
            ],
            functions=self._functions(),
        )
        self._touch = self._env.compile("device.driver")
        self._quantity_msg = lru_cache(maxsize=8192)(self._new_quantity_msg)
        self._semver_msg = lru_cache(maxsize=8192)(self._new_semver_msg)

    # -- values ------------------------------------------------------------

    def _new_quantity_msg(self, canonical: str) -> Message:
        return self._quantity_cls(value=canonical)

    def _new_semver_msg(self, canonical: str) -> Message:
        return self._semver_cls(value=canonical)

    def _wrap(self, value: object) -> object:
        if isinstance(value, list):
            return [self._wrap(v) for v in value]
        if isinstance(value, Quantity):
            return self._quantity_msg(value.canonical)
        if isinstance(value, Semver):
            return self._semver_msg(value.canonical)
        return value

    def _unwrap(self, value: object) -> object:
        if isinstance(value, self._quantity_cls):
            return library.quantity_from_canonical(value.value)  # type: ignore[attr-defined]
        if isinstance(value, self._semver_cls):
            return library.semver_from_canonical(value.value)  # type: ignore[attr-defined]
        return value

    # -- functions ---------------------------------------------------------

    def _impl(self, fn: Callable[..., object]) -> Callable[..., object]:
        def call(*args: object) -> object:
            return self._wrap(fn(*(self._unwrap(a) for a in args)))

        return call

    def _functions(self) -> list[Any]:
        t, q, s = cel.Type, cel.Type("kubernetes.Quantity"), cel.Type("kubernetes.Semver")
        dyn_list = t.List(t.DYN)
        impl = self._impl
        decls: list[Any] = []
        f: Callable[..., object]

        def fn(name: str, *overloads: tuple[str, Any, Sequence[Any], bool, Any]) -> None:
            decls.append(
                cel.FunctionDecl(
                    name,
                    [
                        cel.Overload(oid, ret, list(params), is_member=member, impl=impl(f))
                        if f is not None
                        else cel.Overload(oid, ret, list(params), is_member=member)
                        for oid, ret, params, member, f in overloads
                    ],
                )
            )

        lib = library
        fn("quantity", ("quantity_string", q, [t.STRING], False, lib.quantity))
        fn("isQuantity", ("is_quantity_string", t.BOOL, [t.STRING], False, lib.is_quantity))
        fn(
            "semver",
            ("semver_string", s, [t.STRING], False, lib.semver),
            ("semver_string_bool", s, [t.STRING, t.BOOL], False, lib.semver),
        )
        fn(
            "isSemver",
            ("is_semver_string", t.BOOL, [t.STRING], False, lib.is_semver),
            ("is_semver_string_bool", t.BOOL, [t.STRING, t.BOOL], False, lib.is_semver),
        )
        # Same-kind overloads (message, message) share one implementation that
        # dispatches on the value's type (cel-cpp registers by argument kind).
        for name, ret, f in (
            ("compareTo", t.INT, lib.compare_to),
            ("isGreaterThan", t.BOOL, lib.is_greater_than),
            ("isLessThan", t.BOOL, lib.is_less_than),
        ):
            fn(
                name,
                (f"quantity_{name}", ret, [q, q], True, f),
                (f"semver_{name}", ret, [s, s], True, None),
            )
        # Kubernetes declares sign() as a global function, not a member.
        fn("sign", ("quantity_sign", t.INT, [q], False, lib.sign))
        fn("isInteger", ("quantity_is_integer", t.BOOL, [q], True, lib.is_integer))
        fn("asInteger", ("quantity_as_integer", t.INT, [q], True, lib.as_integer))
        fn("asApproximateFloat", ("quantity_as_float", t.DOUBLE, [q], True, lib.as_float))
        for name, f in (("add", lib.add), ("sub", lib.sub)):
            fn(
                name,
                (f"quantity_{name}_quantity", q, [q, q], True, f),
                (f"quantity_{name}_int", q, [q, t.INT], True, f),
            )
        for name, f in (("major", lib.major), ("minor", lib.minor), ("patch", lib.patch)):
            fn(name, (f"semver_{name}", t.INT, [s], True, f))
        # Kubernetes lists library.
        fn("isSorted", ("list_is_sorted", t.BOOL, [dyn_list], True, lib.is_sorted))
        fn("sum", ("list_sum", t.DYN, [dyn_list], True, lib.list_sum))
        fn("min", ("list_min", t.DYN, [dyn_list], True, lib.list_min))
        fn("max", ("list_max", t.DYN, [dyn_list], True, lib.list_max))
        # list.indexOf/lastIndexOf cannot be declared: the strings extension
        # owns those names and cel-cpp refuses a second declaration.
        # Kubernetes regex library.
        fn("find", ("string_find", t.STRING, [t.STRING, t.STRING], True, lib.find))
        fn(
            "findAll",
            ("string_find_all", t.List(t.STRING), [t.STRING, t.STRING], True, lib.find_all),
            (
                "string_find_all_n",
                t.List(t.STRING),
                [t.STRING, t.STRING, t.INT],
                True,
                lib.find_all,
            ),
        )
        # Sets extension.
        for name, f in (
            ("sets.contains", lib.sets_contains),
            ("sets.equivalent", lib.sets_equivalent),
            ("sets.intersects", lib.sets_intersects),
        ):
            fn(name, (name.replace(".", "_"), t.BOOL, [dyn_list, dyn_list], False, f))
        return decls

    # -- the interface -----------------------------------------------------

    def compile(self, expression: str, *, require_bool: bool = True) -> object:
        try:
            program = self._env.compile(expression)
        except RuntimeError as err:
            message = _clean(str(err))
            if not _CROSS_NUMERIC.search(message):
                raise CelCompileError(message) from None
            # Kubernetes enables cross-type numeric comparisons in the checker;
            # cel-cpp's checker does not, its runtime does.
            try:
                program = self._env.compile(expression, disable_check=True)
            except RuntimeError as err2:
                raise CelCompileError(_clean(str(err2))) from None
            return program
        result = program.return_type()
        if require_bool and result not in (cel.Type.BOOL, cel.Type.DYN):
            raise CelCompileError(
                f"must evaluate to bool, not {result.name()}"
                if result.name()
                else "must evaluate to bool"
            )
        return program

    def prepare(self, device: CelDevice) -> object:
        data = {
            "driver": device.driver,
            "attributes": {
                dom: {k: self._wrap(v) for k, v in ids.items()}
                for dom, ids in device.attributes.items()
            },
            "capacity": {
                dom: {k: self._wrap(v) for k, v in ids.items()}
                for dom, ids in device.capacity.items()
            },
            "allowMultipleAllocations": device.allow_multiple_allocations,
        }
        prepared = _Prepared(data)
        # The Activation converts the dict on first use; do it now, once per device.
        self._touch.eval(self._activation(prepared, frozenset()))
        return prepared

    def _activation(self, prepared: _Prepared, extra: frozenset[str]) -> Any:
        activation = prepared.activations.get(extra)
        if activation is None:
            data = prepared.data
            if extra:
                data = dict(data)
                for key in ("attributes", "capacity"):
                    data[key] = {**{d: {} for d in extra}, **data[key]}
            activation = prepared.activations[extra] = self._env.Activation({"device": data})
        return activation

    def evaluate(self, program: object, prepared: object) -> object:
        assert isinstance(prepared, _Prepared)
        extra: frozenset[str] = frozenset()
        for _ in range(_MAX_DOMAIN_RETRIES):
            result = program.eval(self._activation(prepared, extra))  # type: ignore[attr-defined]
            if result.type() != cel.Type.ERROR:
                return self._unwrap(result.plain_value())
            message = str(result.value())
            missing = _MISSING_KEY.search(message)  # before _clean rewrites it
            # The error does not say which map: retry while either lacks the key.
            in_both = prepared.data["attributes"].keys() & prepared.data["capacity"].keys()
            if missing is None or missing["key"] in in_both or missing["key"] in extra:
                raise CelRuntimeError(_clean(message))
            # Kubernetes reads an unknown attribute domain as an empty map.
            extra = extra | {missing["key"]}
        raise CelRuntimeError(_clean(message))


def _clean(message: str) -> str:
    """cel-cpp's wording as cel-go's: no status-code decoration, ``no such key: x``."""
    message = re.sub(r"^[A-Z_]+: ", "", message.strip())
    message = re.sub(r"\s*\[[A-Z_]+\]$", "", message)
    return _MISSING_KEY.sub(lambda m: f"no such key: {m['key']}", message)
