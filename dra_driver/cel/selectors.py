"""Selector evaluation as the scheduler does it, with compiled-program and device caches.

The scheduler compiles each distinct expression once and converts a device
once per attempt; here both live as long as the :class:`SelectorEvaluator`, so
a simulation over thousands of devices and claims pays each cost once.
Checks that neither engine makes (expression length, unknown ``device``
fields, non-bool results) happen here, for both engines alike.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from dra_driver.cel.device import CelDevice, DeviceDataError
from dra_driver.cel.engine import (
    CelCompileError,
    CelEngine,
    CelError,
    CelRuntimeError,
    Program,
    load_engine,
)

MAX_EXPRESSION_LENGTH = 10 * 1024
"""resource.k8s.io's limit on one CEL selector (characters)."""

DEVICE_FIELDS = frozenset({"driver", "attributes", "capacity", "allowMultipleAllocations"})

_STRING_LITERAL = re.compile(
    r"""[rR]?(?:'''.*?'''|\"\"\".*?\"\"\"|'(?:\\.|[^'\\])*'|"(?:\\.|[^"\\])*")""", re.S
)
_DEVICE_FIELD = re.compile(r"(?<![\w.])device\s*\.\s*([A-Za-z_]\w*)")


@dataclass(frozen=True)
class _Failed:
    error: CelError


def static_check(expression: str) -> None:
    """What the scheduler's type checker rejects and the engines' checkers do not."""
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise CelCompileError(
            f"expression is {len(expression)} characters long; at most "
            f"{MAX_EXPRESSION_LENGTH} are allowed"
        )
    code = _STRING_LITERAL.sub('""', expression)
    for match in _DEVICE_FIELD.finditer(code):
        if match[1] not in DEVICE_FIELDS:
            raise CelCompileError(
                f"undefined field {match[1]!r}: device has only " + ", ".join(sorted(DEVICE_FIELDS))
            )


class SelectorEvaluator:
    """Compile and evaluate DRA CEL selectors on one engine; not thread-safe."""

    def __init__(self, engine: CelEngine | None = None) -> None:
        self.engine = engine or load_engine()
        self._programs: dict[str, Program | _Failed] = {}
        self._devices: dict[Hashable, object] = {}
        self.compiles = 0
        self.conversions = 0

    @property
    def engine_name(self) -> str:
        return self.engine.name

    def compile(self, expression: str) -> Program:
        """The compiled selector; raises (a cached) :class:`CelCompileError`."""
        cached = self._programs.get(expression)
        if cached is None:
            self.compiles += 1
            try:
                static_check(expression)
                cached = self.engine.compile(expression)
            except CelCompileError as err:
                cached = _Failed(err)
            self._programs[expression] = cached
        if isinstance(cached, _Failed):
            raise cached.error
        return cached

    def prepared(self, key: Hashable, device: Callable[[], CelDevice]) -> object:
        """The engine's form of the device under ``key``, converted on first use."""
        cached = self._devices.get(key)
        if cached is None:
            self.conversions += 1
            try:
                cached = self.engine.prepare(device())
            except DeviceDataError as err:
                cached = _Failed(CelRuntimeError(str(err)))
            self._devices[key] = cached
        if isinstance(cached, _Failed):
            raise cached.error
        return cached

    def matches(self, expression: str, key: Hashable, device: Callable[[], CelDevice]) -> bool:
        """Whether the device satisfies the selector; raises CelCompileError/CelRuntimeError."""
        program = self.compile(expression)
        result = self.engine.evaluate(program, self.prepared(key, device))
        if not isinstance(result, bool):
            raise CelRuntimeError(
                f"CEL result of type {type(result).__name__} could not be converted to bool"
            )
        return result

    def forget_devices(self) -> None:
        """Drop converted devices (their slices changed)."""
        self._devices.clear()
