"""What both HTTP transports (:mod:`.httpconn` HTTP/1.1, :mod:`.http2`) hand back."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


class HttpError(Exception):
    """Transport failure: connect, TLS, timeout, a closed or malformed answer."""


@dataclass(frozen=True)
class Response:
    status: int
    headers: Mapping[str, str]
    """Lower-case names; repeated headers joined with ``, ``."""
    body: bytes
