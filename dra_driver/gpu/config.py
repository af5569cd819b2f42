"""Opaque device configs: strict decoding of the envelope, precedence, quantities.

Compatible with NVIDIA's ``resource.nvidia.com/v1beta1`` kinds so claims written
for their driver keep working::

    apiVersion: resource.nvidia.com/v1beta1
    kind: GpuConfig                  # or MigDeviceConfig
    sharing:
      strategy: TimeSlicing          # or MPS: the name of a sharing strategy
      timeSlicingConfig: {...}       # the settings of the strategy named above
      mpsConfig: {...}

This module owns the envelope (``apiVersion``, ``kind``, ``sharing.strategy``);
each sharing strategy (:mod:`dra_driver.gpu.sharing.strategies`) decodes its own
settings object through the small :class:`SharingDecoder` protocol, so a new
strategy adds a decoder, not a branch here. Decoding is strict: an unknown
apiVersion, kind, field or enum value fails the claim with the field path and
the allowed values, before anything is written. Precedence follows NVIDIA:
class configs, then claim configs, the later one replaces the earlier for a
device; a config without ``requests`` applies to all devices of its kind, one
that names a request whose device has the other kind is an error. No config
means no sharing (the default strategy).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from dra_driver import quantity
from dra_driver.errors import DriverError

API_VERSION = "resource.nvidia.com/v1beta1"
GPU_CONFIG = "GpuConfig"
MIG_CONFIG = "MigDeviceConfig"
KINDS = (GPU_CONFIG, MIG_CONFIG)
MIB = 1024 * 1024
MAX_QUANTITY = 2**63
"""8Ei: no GPU quantity comes near it, and larger ones overflow int64 elsewhere."""

DeviceType = Literal["gpu", "mig"]


class ConfigError(DriverError, ValueError):
    """An opaque config is invalid; the message names the field and what is allowed."""


class SharingDecoder(Protocol):
    """How a sharing strategy reads its settings from ``sharing.<field>``."""

    @property
    def field(self) -> str:
        """Its settings field under ``sharing``, e.g. ``timeSlicingConfig``."""
        ...

    @property
    def kinds(self) -> tuple[str, ...]:
        """Config kinds on which that field is allowed (the strategy name is allowed on
        both; e.g. MIG devices are always time-sliced and take no settings)."""
        ...

    def decode(self, raw: object, path: str) -> object:
        """Settings from ``raw`` (None when absent); raises :class:`ConfigError`."""
        ...


@dataclass(frozen=True)
class Sharing:
    strategy: str
    """Name of the strategy, as ``sharing.strategy`` gives it."""
    settings: object
    """What the strategy's decoder returned."""


@dataclass(frozen=True)
class DeviceConfig:
    kind: str
    sharing: Sharing | None = None
    origin: str = "default"
    """Where it came from, for messages and grouping (e.g. ``config[1]``)."""


def parse_quantity(value: object, path: str) -> int:
    """A Kubernetes quantity (``10Gi``, ``1.5G``, ``1e9``, ``512``) as whole bytes, rounded
    up; at most 8Ei, like the API server's int64."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ConfigError(f"{path}: must be a quantity such as 8Gi or 4096Mi, got {value!r}")
    too_big = ConfigError(f"{path}: {value!r} is out of range; the maximum is 8Ei")
    try:
        total = quantity.parse(value)
    except quantity.QuantityRangeError:
        raise too_big from None
    except quantity.QuantityError:
        raise ConfigError(
            f"{path}: {value!r} is not a quantity (examples: 8Gi, 4096Mi, 1e9)"
        ) from None
    result = math.ceil(total)
    if abs(result) > MAX_QUANTITY:
        raise too_big
    return result


def obj(value: object, path: str, allowed: tuple[str, ...]) -> dict[str, Any]:
    """``value`` as an object with only ``allowed`` keys; for strategy decoders too."""
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: must be an object with fields {', '.join(allowed)}")
    for key in value:
        if key not in allowed:
            raise ConfigError(
                f"{path}.{key}: unknown field; allowed: {', '.join(allowed)}".lstrip(".")
            )
    return value


def enum(value: object, path: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ConfigError(f"{path}: unsupported value {value!r}; allowed: {', '.join(allowed)}")
    return str(value)


def decode(
    parameters: object, origin: str, strategies: Mapping[str, SharingDecoder]
) -> DeviceConfig:
    """Strictly decode one opaque ``parameters`` object; ``origin`` prefixes messages,
    ``strategies`` maps each ``sharing.strategy`` name to its decoder."""
    try:
        return _decode(parameters, strategies)
    except ConfigError as exc:
        raise ConfigError(f"{origin}: {exc}") from None


def _decode(parameters: object, strategies: Mapping[str, SharingDecoder]) -> DeviceConfig:
    if not isinstance(parameters, dict):
        raise ConfigError("parameters: must be an object with apiVersion and kind")
    enum(parameters.get("apiVersion"), "apiVersion", (API_VERSION,))
    kind = enum(parameters.get("kind"), "kind", KINDS)
    raw = obj(parameters, "", ("apiVersion", "kind", "sharing"))
    if raw.get("sharing") is None:
        return DeviceConfig(kind=kind)
    fields = tuple(d.field for d in strategies.values() if kind in d.kinds)
    sharing = obj(raw["sharing"], "sharing", ("strategy", *fields))
    name = enum(sharing.get("strategy"), "sharing.strategy", tuple(strategies))
    for other, decoder in strategies.items():
        if other != name and sharing.get(decoder.field) is not None:
            raise ConfigError(f"sharing.{decoder.field}: only allowed with strategy {other}")
    decoder = strategies[name]
    settings = decoder.decode(sharing.get(decoder.field), f"sharing.{decoder.field}")
    return DeviceConfig(kind=kind, sharing=Sharing(name, settings))
