"""The opaque parameters of a ComputeDomain claim, strictly decoded and validated.

The controller writes them into the ResourceClaimTemplates it creates
(``ComputeDomainChannelConfig`` for a workload's channel, ``ComputeDomainDaemonConfig``
for a daemon); a user may write them too. Unknown fields, a wrong kind, a domain ID
that is not a Kubernetes UID or an unknown allocation mode fail with the field's name:
the error reaches the pod's events through the kubelet, and retrying cannot help
(permanent).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from dra_driver.computedomain.names import (
    API_GROUP,
    API_VERSION,
    CHANNEL_CONFIG_KIND,
    DAEMON_CONFIG_KIND,
    AllocationMode,
)
from dra_driver.plugin.claims import Claim, PrepareError

API = f"{API_GROUP}/{API_VERSION}"
_UID = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MODES: tuple[AllocationMode, ...] = ("Single", "All")


@dataclass(frozen=True)
class ChannelConfig:
    domain_id: str
    allocation_mode: AllocationMode = "Single"


@dataclass(frozen=True)
class DaemonConfig:
    domain_id: str


DomainConfig = ChannelConfig | DaemonConfig


def _fail(uid: str, message: str) -> PrepareError:
    return PrepareError(f"claim {uid}: {message}", permanent=True)


def validate_domain_id(value: Any, where: str, uid: str) -> str:
    """A domain ID names a host directory and a label value: a UID, nothing else."""
    if not isinstance(value, str) or len(value) > 63 or not _UID.match(value):
        raise _fail(uid, f"{where}.domainID: {value!r} is not a ComputeDomain UID (lower-case "
                         "letters, digits and '-', at most 63 characters)")  # fmt: skip
    return value


def decode(parameters: dict[str, Any], where: str, uid: str) -> DomainConfig:
    """One opaque ``parameters`` object; ``where`` names it in errors."""
    api, kind = parameters.get("apiVersion"), parameters.get("kind")
    if api != API:
        raise _fail(uid, f"{where}.apiVersion: {api!r}; expected {API!r}")
    allowed = {"apiVersion", "kind", "domainID"}
    if kind == CHANNEL_CONFIG_KIND:
        allowed.add("allocationMode")
    elif kind != DAEMON_CONFIG_KIND:
        raise _fail(uid, f"{where}.kind: {kind!r}; expected {CHANNEL_CONFIG_KIND} or "
                         f"{DAEMON_CONFIG_KIND}")  # fmt: skip
    unknown = sorted(set(parameters) - allowed)
    if unknown:
        raise _fail(uid, f"{where}: unknown field(s) {unknown} in a {kind}; allowed: "
                         f"{sorted(allowed)}")  # fmt: skip
    domain = validate_domain_id(parameters.get("domainID"), where, uid)
    if kind == DAEMON_CONFIG_KIND:
        return DaemonConfig(domain_id=domain)
    mode = parameters.get("allocationMode", "Single")
    if mode not in MODES:
        raise _fail(uid, f"{where}.allocationMode: {mode!r}; allowed: {', '.join(MODES)}")
    return ChannelConfig(domain_id=domain, allocation_mode=mode)


def claim_config(claim: Claim, device_types: dict[str, str]) -> DomainConfig:
    """The one config of a claim's request for ``channel-0`` or ``daemon-0``.

    ``device_types`` maps our device names to ``channel``/``daemon``. A claim holds one of
    our devices, and the config that applies to its request last wins (class configs come
    before claim configs, as the API orders them); its kind must match the device."""
    uid = claim.uid
    if len(claim.devices) != 1:
        names = [d.device for d in claim.devices]
        raise _fail(uid, f"allocated {names}: a ComputeDomain claim holds exactly one device")
    device = claim.devices[0]
    kind = device_types.get(device.device)
    if kind is None:
        raise _fail(uid, f"device {device.device!r} is not published by this plugin "
                         f"({', '.join(sorted(device_types))})")  # fmt: skip
    configs = claim.configs_for(device.request)
    if not configs:
        raise _fail(uid, f"request {device.base_request!r} has no ComputeDomain config "
                         f"({CHANNEL_CONFIG_KIND} or {DAEMON_CONFIG_KIND}); the controller's "
                         "templates carry one")  # fmt: skip
    where = f"config of request {device.base_request!r}"
    config = decode(configs[-1].parameters, where, uid)
    expected = ChannelConfig if kind == "channel" else DaemonConfig
    if not isinstance(config, expected):
        raise _fail(uid, f"{where}: a {type(config).__name__.removesuffix('Config')} config for "
                         f"device {device.device!r}, which is a {kind}")  # fmt: skip
    return config
