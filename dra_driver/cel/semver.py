"""Semantic versions as Kubernetes' CEL semver library and DRA ``version`` attributes see them.

Strict semver 2.0.0 parsing (no ``v`` prefix, no leading zeros); the optional
``normalize`` mode of ``semver(s, true)`` strips a ``v``, pads missing minor and
patch and drops leading zeros first. Equality and ordering ignore build
metadata, as blang/semver (which Kubernetes uses) does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

_CORE = r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"
_IDENT = r"[0-9A-Za-z-]+"
_STRICT = re.compile(rf"{_CORE}(?:-({_IDENT}(?:\.{_IDENT})*))?(?:\+({_IDENT}(?:\.{_IDENT})*))?")


class SemverError(ValueError):
    """The string is not a semantic version."""


@dataclass(frozen=True, slots=True)
class Semver:
    major: int
    minor: int
    patch: int
    pre: tuple[str, ...] = ()
    build: tuple[str, ...] = field(default=(), compare=False)

    @property
    def canonical(self) -> str:
        """The version without build metadata: equal strings iff equal versions."""
        core = f"{self.major}.{self.minor}.{self.patch}"
        return core + ("-" + ".".join(self.pre) if self.pre else "")

    def __str__(self) -> str:
        return self.canonical + ("+" + ".".join(self.build) if self.build else "")

    def compare(self, other: Semver) -> int:
        a = (self.major, self.minor, self.patch)
        b = (other.major, other.minor, other.patch)
        if a != b:
            return (a > b) - (a < b)
        return _compare_pre(self.pre, other.pre)


def _compare_pre(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    if a == b:
        return 0
    if not a:
        return 1  # a release is greater than any of its pre-releases
    if not b:
        return -1
    for x, y in zip(a, b, strict=False):
        if x == y:
            continue
        xn, yn = x.isdigit(), y.isdigit()
        if xn and yn:
            return (int(x) > int(y)) - (int(x) < int(y))
        if xn != yn:
            return -1 if xn else 1  # numeric identifiers sort before alphanumeric ones
        return (x > y) - (x < y)
    return (len(a) > len(b)) - (len(a) < len(b))


@lru_cache(maxsize=4096)
def parse_semver(text: str, normalize: bool = False) -> Semver:
    """Parse strictly (or after Kubernetes' normalisation); raises :class:`SemverError`."""
    source = _normalize(text) if normalize else text
    match = _STRICT.fullmatch(source)
    if match is None:
        raise SemverError(f"invalid semantic version: {text!r}")
    pre = tuple(match[4].split(".")) if match[4] else ()
    for ident in pre:
        if ident.isdigit() and len(ident) > 1 and ident[0] == "0":
            raise SemverError(f"invalid semantic version: {text!r} (leading zero in {ident!r})")
    build = tuple(match[5].split(".")) if match[5] else ()
    return Semver(int(match[1]), int(match[2]), int(match[3]), pre, build)


def _normalize(text: str) -> str:
    text = text.removeprefix("v")
    cut = len(text)
    for sep in "-+":
        pos = text.find(sep)
        if pos != -1:
            cut = min(cut, pos)
    core, rest = text[:cut], text[cut:]
    parts = core.split(".")
    if not 1 <= len(parts) <= 3:
        return text
    parts += ["0"] * (3 - len(parts))
    parts = [p.lstrip("0") or "0" if p.isdigit() else p for p in parts]
    return ".".join(parts) + rest


def is_semver(text: str, normalize: bool = False) -> bool:
    try:
        parse_semver(text, normalize)
    except SemverError:
        return False
    return True


def from_canonical(canonical: str) -> Semver:
    return parse_semver(canonical)
