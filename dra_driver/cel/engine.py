"""One small interface over the CEL engines, and how one is chosen.

``cel-expr-python`` (Google's C++ CEL, with a type checker like the
scheduler's) is used when it is installed; ``cel-python`` (pure Python) is the
fallback that is always installed with the tooling. Every difference between
them and Kubernetes is listed in ``tests/cel/corpus.yaml``.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Protocol

from dra_driver.cel.device import CelDevice

ENGINES: dict[str, tuple[str, str]] = {
    # name -> (module that implements it, module it needs)
    "cel-expr-python": ("dra_driver.cel.cppengine", "cel_expr_python"),
    "cel-python": ("dra_driver.cel.pyengine", "celpy"),
}
"""Known engines, most exact first."""


class CelError(Exception):
    """Base of every selector error; ``str()`` is the message the user sees."""


class CelCompileError(CelError):
    """The expression does not compile in the scheduler's environment (any device)."""


class CelRuntimeError(CelError):
    """Evaluating the expression on one device failed (the scheduler aborts the attempt)."""


class Program(Protocol):
    """A compiled expression, reusable for any device."""


class CelEngine(Protocol):
    """What the selector layer needs from an engine; nothing engine-specific leaks out."""

    name: str

    def compile(self, expression: str, *, require_bool: bool = True) -> Program:
        """Parse and check ``expression``; raises :class:`CelCompileError`.

        Selectors must be bool (``require_bool``); the conformance corpus also
        evaluates value expressions.
        """
        ...

    def prepare(self, device: CelDevice) -> object:
        """The engine's form of ``device``, built once and reused by every program."""
        ...

    def evaluate(self, program: Program, prepared: object) -> object:
        """Run ``program``; returns the CEL result as a Python value or raises CelRuntimeError."""
        ...


class EngineUnavailable(RuntimeError):
    """The requested engine's package is not installed."""


def available_engines() -> list[str]:
    """Installed engines, most exact first."""
    return [name for name, (_, need) in ENGINES.items() if importlib.util.find_spec(need)]


def load_engine(name: str | None = None) -> CelEngine:
    """The named engine, or the most exact installed one."""
    if name is None:
        installed = available_engines()
        if not installed:
            raise EngineUnavailable(
                "no CEL engine installed: reinstall dra-driver (it depends on cel-python), "
                "or pip install 'dra-driver[cel-cpp]' (cel-expr-python, faster and exact)"
            )
        name = installed[0]
    if name not in ENGINES:
        raise EngineUnavailable(f"unknown CEL engine {name!r}; known: {', '.join(ENGINES)}")
    module_name, need = ENGINES[name]
    if importlib.util.find_spec(need) is None:
        raise EngineUnavailable(f"CEL engine {name!r} needs the Python package {name!r}")
    module = importlib.import_module(module_name)
    engine: CelEngine = module.Engine()
    return engine
