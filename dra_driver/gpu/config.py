"""Opaque device configs: strict decoding, normalisation, validation, precedence.

Compatible with NVIDIA's ``resource.nvidia.com/v1beta1`` kinds so claims written
for their driver keep working::

    apiVersion: resource.nvidia.com/v1beta1
    kind: GpuConfig                  # or MigDeviceConfig
    sharing:
      strategy: TimeSlicing          # or MPS
      timeSlicingConfig:             # GpuConfig only
        interval: Default            # Default | Short | Medium | Long
      mpsConfig:
        defaultActiveThreadPercentage: 50                 # 0..100
        defaultPinnedDeviceMemoryLimit: 10Gi              # Quantity, >= 1Mi
        defaultPerDevicePinnedMemoryLimit: {<uuid|index>: 5Gi}

Decoding is strict: an unknown apiVersion, kind, field or enum value fails the
claim with the field path and the allowed values, before anything is written.
Precedence follows NVIDIA: class configs, then claim configs, the later one
replaces the earlier for a device; a config without ``requests`` applies to all
devices of its type, one that names a request whose device has the other type
is an error. No config means no sharing change (the GPU is left as it is).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from dra_driver.plugin.claims import Claim

API_VERSION = "resource.nvidia.com/v1beta1"
GPU_CONFIG = "GpuConfig"
MIG_CONFIG = "MigDeviceConfig"
KINDS = (GPU_CONFIG, MIG_CONFIG)
INTERVALS = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}
"""Interval name -> ``nvidia-smi compute-policy --set-timeslice`` argument."""
MIB = 1024 * 1024

DeviceType = Literal["gpu", "mig"]


class ConfigError(ValueError):
    """An opaque config is invalid; the message names the field and what is allowed."""


@dataclass(frozen=True)
class TimeSlicing:
    interval: str = "Default"


@dataclass(frozen=True)
class Mps:
    active_thread_percentage: int | None = None
    pinned_memory_limit: int | None = None
    """Bytes, for every device of the group."""
    per_device_pinned_memory_limit: dict[str, int] = field(default_factory=dict)
    """Bytes by device UUID or by the device's index within the claim."""


@dataclass(frozen=True)
class DeviceConfig:
    kind: str
    sharing: TimeSlicing | Mps | None = None
    origin: str = "default"
    """Where it came from, for messages (e.g. ``config[1] FromClaim``)."""


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


def parse_quantity(value: object, path: str) -> int:
    """A Kubernetes quantity (``10Gi``, ``1.5G``, ``1e9``, ``512``) as whole bytes, rounded up."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ConfigError(f"{path}: must be a quantity such as 8Gi or 4096Mi, got {value!r}")
    m = _QUANTITY.match(str(value).strip())
    if not m:
        raise ConfigError(f"{path}: {value!r} is not a quantity (examples: 8Gi, 4096Mi, 1e9)")
    try:
        number = Decimal(m.group(1))
        suffix = m.group(2) or ""
        scale = Decimal(10) ** int(suffix[1:]) if suffix[:1] in ("e", "E") else _SUFFIX[suffix]
    except (InvalidOperation, ValueError) as exc:
        raise ConfigError(f"{path}: {value!r} is not a quantity") from exc
    total = number * scale
    return int(total.to_integral_value(rounding="ROUND_CEILING"))


def _obj(value: object, path: str, allowed: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: must be an object with fields {', '.join(allowed)}")
    for key in value:
        if key not in allowed:
            raise ConfigError(
                f"{path}.{key}: unknown field; allowed: {', '.join(allowed)}".lstrip(".")
            )
    return value


def _enum(value: object, path: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ConfigError(f"{path}: unsupported value {value!r}; allowed: {', '.join(allowed)}")
    return str(value)


def _pinned(value: object, path: str) -> int:
    limit = parse_quantity(value, path)
    if limit < MIB:
        raise ConfigError(f"{path}: {value!r} is below the minimum of 1Mi")
    return limit


def _decode_mps(raw: object, path: str) -> Mps:
    fields = (
        "defaultActiveThreadPercentage",
        "defaultPinnedDeviceMemoryLimit",
        "defaultPerDevicePinnedMemoryLimit",
    )
    obj = _obj(raw if raw is not None else {}, path, fields)
    pct = obj.get("defaultActiveThreadPercentage")
    if pct is not None and (
        isinstance(pct, bool) or not isinstance(pct, int) or not 0 <= pct <= 100
    ):
        raise ConfigError(f"{path}.defaultActiveThreadPercentage: {pct!r}; allowed: integer 0..100")
    default = obj.get("defaultPinnedDeviceMemoryLimit")
    per_raw = obj.get("defaultPerDevicePinnedMemoryLimit") or {}
    if not isinstance(per_raw, dict):
        raise ConfigError(
            f"{path}.defaultPerDevicePinnedMemoryLimit: "
            "must map a device UUID or index to a quantity"
        )
    per = {
        str(k): _pinned(v, f"{path}.defaultPerDevicePinnedMemoryLimit[{k}]")
        for k, v in per_raw.items()
    }
    return Mps(
        active_thread_percentage=pct,
        pinned_memory_limit=_pinned(default, f"{path}.defaultPinnedDeviceMemoryLimit")
        if default is not None
        else None,
        per_device_pinned_memory_limit=per,
    )


def decode(parameters: object, origin: str) -> DeviceConfig:
    """Strictly decode one opaque ``parameters`` object; ``origin`` prefixes messages."""
    try:
        return _decode(parameters)
    except ConfigError as exc:
        raise ConfigError(f"{origin}: {exc}") from None


def _decode(parameters: object) -> DeviceConfig:
    if not isinstance(parameters, dict):
        raise ConfigError("parameters: must be an object with apiVersion and kind")
    _enum(parameters.get("apiVersion"), "apiVersion", (API_VERSION,))
    kind = _enum(parameters.get("kind"), "kind", KINDS)
    obj = _obj(parameters, "", ("apiVersion", "kind", "sharing"))
    if obj.get("sharing") is None:
        return DeviceConfig(kind=kind)
    is_gpu = kind == GPU_CONFIG
    sharing_fields = (
        ("strategy", "timeSlicingConfig", "mpsConfig") if is_gpu else ("strategy", "mpsConfig")
    )
    sharing = _obj(obj["sharing"], "sharing", sharing_fields)
    strategy = _enum(sharing.get("strategy"), "sharing.strategy", ("TimeSlicing", "MPS"))
    if strategy == "TimeSlicing":
        if sharing.get("mpsConfig") is not None:
            raise ConfigError("sharing.mpsConfig: only allowed with strategy MPS")
        ts = _obj(
            sharing.get("timeSlicingConfig") or {}, "sharing.timeSlicingConfig", ("interval",)
        )
        interval = _enum(
            ts.get("interval", "Default"), "sharing.timeSlicingConfig.interval", tuple(INTERVALS)
        )
        return DeviceConfig(kind=kind, sharing=TimeSlicing(interval))
    if sharing.get("timeSlicingConfig") is not None:
        raise ConfigError("sharing.timeSlicingConfig: only allowed with strategy TimeSlicing")
    return DeviceConfig(
        kind=kind, sharing=_decode_mps(sharing.get("mpsConfig"), "sharing.mpsConfig")
    )


def kind_for(device_type: DeviceType) -> str:
    return GPU_CONFIG if device_type == "gpu" else MIG_CONFIG


def resolve(claim: Claim, types: dict[str, DeviceType]) -> dict[tuple[str, str], DeviceConfig]:
    """Effective config per allocated ``(request, device)``; raises :class:`ConfigError`.

    ``types`` maps each allocated device name to ``gpu`` or ``mig``.
    """
    decoded = [
        (cfg, decode(cfg.parameters, f"config[{i}] ({cfg.source})"))
        for i, cfg in enumerate(claim.configs)
    ]
    out: dict[tuple[str, str], DeviceConfig] = {}
    for dev in claim.devices:
        wanted = kind_for(types[dev.device])
        effective = DeviceConfig(kind=wanted)
        for i, (raw, cfg) in enumerate(decoded):
            if not raw.applies_to(dev.request):
                continue
            if cfg.kind != wanted:
                if raw.requests:
                    raise ConfigError(
                        f"config[{i}] ({raw.source}): kind {cfg.kind} names request "
                        f"{dev.base_request!r}, whose device {dev.device} needs kind {wanted}"
                    )
                continue
            effective = DeviceConfig(kind=cfg.kind, sharing=cfg.sharing, origin=f"config[{i}]")
        out[(dev.request, dev.device)] = effective
    return out
