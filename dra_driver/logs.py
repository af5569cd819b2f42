"""Structured logging, configured once by the CLI.

Every record is rendered as ``key=value`` pairs or one JSON object per line.
Context such as the claim UID travels in ``extra`` (see :class:`ContextLogger`)
so that every line about a claim carries ``claim_uid`` without string building.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping, MutableMapping
from typing import Any, Literal, TextIO

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")

# Attributes every LogRecord has; anything else on a record came from `extra`.
_STANDARD_ATTRS = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys()
    | {"message", "asctime", "taskName"}
)


def _record_fields(record: logging.LogRecord) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        + f".{int(record.msecs):03d}Z",
        "level": record.levelname.lower(),
        "logger": record.name,
        "msg": record.getMessage(),
    }
    for key, value in vars(record).items():
        if key not in _STANDARD_ATTRS and not key.startswith("_"):
            fields[key] = value
    if record.exc_info and record.exc_info[0] is not None:
        fields["error"] = logging.Formatter().formatException(record.exc_info)
    return fields


def _quote(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if text == "" or any(c in text for c in ' ="\n\t'):
        return json.dumps(text)
    return text


class KeyValueFormatter(logging.Formatter):
    """``time=... level=info logger=... msg="..." claim_uid=...`` (logfmt)."""

    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{k}={_quote(v)}" for k, v in _record_fields(record).items())


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log collectors."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_record_fields(record), default=str)


def setup_logging(
    fmt: LogFormat = "text", level: int | str = logging.INFO, stream: TextIO | None = None
) -> None:
    """Install one handler on the ``dra_driver`` root logger (idempotent)."""
    formatter: logging.Formatter = JsonFormatter() if fmt == "json" else KeyValueFormatter()
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)


class ContextLogger(logging.LoggerAdapter[logging.Logger]):
    """A logger that adds fixed fields (e.g. ``claim_uid``) to every record.

    Fields given per call in ``extra`` are merged on top of the bound ones.
    """

    def bind(self, **fields: Any) -> ContextLogger:
        return ContextLogger(self.logger, {**dict(self.extra or {}), **fields})

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        extra: Mapping[str, Any] = kwargs.get("extra") or {}
        kwargs["extra"] = {**dict(self.extra or {}), **extra}
        return msg, kwargs
