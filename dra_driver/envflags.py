"""Every long flag has one environment variable: ``--state-dir`` is ``DRA_STATE_DIR``.

:func:`bind` walks a parser and its subcommands once: for each option it adds
``(env DRA_...)`` to the help and, when that variable is set and not empty,
makes its value the default, converted and checked exactly as the flag's value
would be (type, choices, booleans). A flag given on the command line wins over
the variable. One prefix, no exceptions: a DaemonSet sets ``DRA_NODE_NAME``
from the downward API under that name, not a name of its own.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

PREFIX = "DRA_"
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def env_name(option: str) -> str:
    """``--state-dir`` -> ``DRA_STATE_DIR``."""
    return PREFIX + option.lstrip("-").upper().replace("-", "_")


def bind(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                bind(sub, environ)
            continue
        long = [o for o in action.option_strings if o.startswith("--")]
        if not long or action.default is argparse.SUPPRESS or action.help is argparse.SUPPRESS:
            continue
        if isinstance(action, argparse._HelpAction | argparse._VersionAction):
            continue
        name = env_name(long[0])
        action.help = f"{action.help} (env {name})" if action.help else f"(env {name})"
        raw = environ.get(name, "")
        if raw:
            action.default = _convert(parser, action, name, raw)
            action.required = False
            for group in parser._mutually_exclusive_groups:
                if action in group._group_actions:
                    group.required = False  # the variable stands in for the choice


def _convert(parser: argparse.ArgumentParser, action: argparse.Action, name: str, raw: str) -> Any:
    if isinstance(action, argparse.BooleanOptionalAction):  # --x / --no-x
        if raw.lower() in TRUE_WORDS + FALSE_WORDS:
            return raw.lower() in TRUE_WORDS
        parser.error(f"{name}={raw!r}: expected one of {', '.join(TRUE_WORDS + FALSE_WORDS)}")
    if action.nargs == 0:  # store_true / store_false / store_const
        if raw.lower() in TRUE_WORDS:
            return action.const
        if raw.lower() in FALSE_WORDS:
            return not action.const if isinstance(action.const, bool) else None
        parser.error(f"{name}={raw!r}: expected one of {', '.join(TRUE_WORDS + FALSE_WORDS)}")
    if isinstance(action, argparse._AppendAction):
        return [_value(parser, action, name, part.strip()) for part in raw.split(",")]
    return _value(parser, action, name, raw)


def _value(parser: argparse.ArgumentParser, action: argparse.Action, name: str, raw: str) -> Any:
    try:
        value = action.type(raw) if callable(action.type) else raw
    except (argparse.ArgumentTypeError, TypeError, ValueError) as exc:
        parser.error(f"{name}={raw!r}: {exc}")
    if action.choices is not None and value not in action.choices:
        allowed = ", ".join(map(str, action.choices))
        parser.error(f"{name}={raw!r}: invalid choice; allowed: {allowed}")
    return value
