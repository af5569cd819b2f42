"""Claims as the plugin layer hands them to a backend: validated once, typed, filtered.

The kubelet names a claim by namespace, name and UID (:class:`ClaimRef`); all
three are checked here, once, with Kubernetes' own rules, before they reach a
URL path, a file name or a log line (:func:`validate_ref`). The claim object
fetched from the API server is reduced by :func:`claim_from_object` to what
*this* driver allocated *on this node's pool*: results and opaque configs of
other drivers are dropped, a result from another pool is an error, and every
field is type-checked so a malformed object fails with the field's path.

What comes back is here too: a backend returns a list of :class:`PreparedDevice`, or raises
:class:`PrepareError` for the one claim that failed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Literal

from dra_driver.errors import DriverError
from dra_driver.logs import ContextLogger
from dra_driver.plugin.k8snames import is_dns_label, is_dns_subdomain

ConfigSource = Literal["FromClass", "FromClaim"]


class ClaimError(DriverError):
    """A claim reference or object cannot be prepared; the message goes to the kubelet."""


@dataclass(frozen=True)
class ClaimRef:
    """What the kubelet sends for a claim: enough to fetch it, not its content."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    def logger(self, base: logging.Logger) -> ContextLogger:
        """For lines about this claim: ``claim_uid`` always, namespace and name when known."""
        fields = {"claim_uid": self.uid}
        if self.namespace:
            fields["claim_namespace"] = self.namespace
        if self.name:
            fields["claim_name"] = self.name
        return ContextLogger(base, fields)


def validate_ref(ref: ClaimRef) -> None:
    """UID and namespace are DNS labels, the name a DNS subdomain (what the API server
    accepts); raises :class:`ClaimError` naming the field. Backends key files by UID
    and the client puts namespace and name into URL paths, so nothing else gets through."""
    if not is_dns_label(ref.uid):
        raise ClaimError(
            f"claim uid {ref.uid!r} is invalid: expected lower-case letters, digits and '-', "
            "starting and ending with a letter or digit, at most 63 characters"
        )
    if not is_dns_label(ref.namespace):
        raise ClaimError(
            f"claim {ref.uid}: namespace {ref.namespace!r} is invalid: expected a DNS label "
            "(lower-case letters, digits and '-', at most 63 characters)"
        )
    if not is_dns_subdomain(ref.name):
        raise ClaimError(
            f"claim {ref.uid}: name {ref.name!r} is invalid: expected a DNS subdomain "
            "(lower-case letters, digits, '-' and '.', at most 253 characters)"
        )


@dataclass(frozen=True)
class AllocatedDevice:
    """One ``status.allocation.devices.results[]`` entry of our driver."""

    request: str
    """Request name as allocated, possibly ``req/sub`` for firstAvailable."""
    pool: str
    device: str
    admin_access: bool = False
    share_id: str | None = None
    consumed_capacity: dict[str, str] = field(default_factory=dict)

    @property
    def base_request(self) -> str:
        """The top-level request name; the kubelet filters CDI IDs by this."""
        return self.request.split("/", 1)[0]


@dataclass(frozen=True)
class OpaqueConfig:
    """One opaque config of our driver, class configs first, claim configs after."""

    source: ConfigSource
    requests: tuple[str, ...]
    """Request names it applies to; empty means every request of the claim."""
    parameters: dict[str, Any]

    def applies_to(self, request: str) -> bool:
        base = request.split("/", 1)[0]
        return not self.requests or request in self.requests or base in self.requests


@dataclass(frozen=True)
class Claim:
    """An allocated claim, reduced to what our driver must prepare on this node."""

    ref: ClaimRef
    devices: tuple[AllocatedDevice, ...]
    configs: tuple[OpaqueConfig, ...] = ()
    uid: str = field(init=False, repr=False, compare=False)
    """``ref.uid``, as data: read on every step of a prepare."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "uid", self.ref.uid)

    def configs_for(self, request: str) -> list[OpaqueConfig]:
        """Configs for one request in precedence order (later overrides earlier)."""
        return [c for c in self.configs if c.applies_to(request)]


def _field(obj: dict[str, Any], key: str, kind: type, path: str, *, required: bool = True) -> Any:
    value = obj.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise ClaimError(f"{path}.{key}: expected {kind.__name__}, got {value!r}")
    return value


def claim_from_object(obj: dict[str, Any], ref: ClaimRef, *, driver: str, pool: str) -> Claim:
    """Typed view of an API ResourceClaim: our driver's results (all from ``pool``) and
    opaque configs; raises :class:`ClaimError` naming the claim and the field."""
    where = f"claim {ref}"
    uid = (obj.get("metadata") or {}).get("uid")
    if uid != ref.uid:
        raise ClaimError(
            f"{where} has UID {uid}, the kubelet asked for {ref.uid} (claim was re-created)"
        )
    allocation = (obj.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError(f"{where} is not allocated")
    if not isinstance(allocation, dict) or not isinstance(allocation.get("devices") or {}, dict):
        raise ClaimError(f"{where}: status.allocation.devices is not an object")
    devices = allocation.get("devices") or {}
    raw_results = devices.get("results") or []
    raw_configs = devices.get("config") or []
    if not isinstance(raw_results, list) or not isinstance(raw_configs, list):
        raise ClaimError(f"{where}: status.allocation.devices.results/config must be lists")
    results = []
    for i, r in enumerate(raw_results):
        path = f"{where}: status.allocation.devices.results[{i}]"
        if not isinstance(r, dict):
            raise ClaimError(f"{path}: expected an object")
        if r.get("driver") != driver:
            continue
        device = _field(r, "device", str, path)
        request = _field(r, "request", str, path)
        result_pool = _field(r, "pool", str, path)
        if result_pool != pool:
            raise ClaimError(
                f"{where}: device {device!r} (request {request!r}) was allocated from pool "
                f"{result_pool!r}, but this node's pool is {pool!r}; it cannot be prepared here"
            )
        capacity = _field(r, "consumedCapacity", dict, path, required=False) or {}
        results.append(
            AllocatedDevice(
                request=request,
                pool=result_pool,
                device=device,
                admin_access=bool(_field(r, "adminAccess", bool, path, required=False)),
                share_id=_field(r, "shareID", str, path, required=False),
                consumed_capacity={str(k): str(v) for k, v in capacity.items()},
            )
        )
    if not results:
        raise ClaimError(f"{where} has no devices allocated by driver {driver}")
    configs = []
    for i, c in enumerate(raw_configs):
        path = f"{where}: status.allocation.devices.config[{i}]"
        if not isinstance(c, dict) or not isinstance(c.get("opaque") or {}, dict):
            raise ClaimError(f"{path}: expected an object with an opaque object")
        opaque = c.get("opaque") or {}
        if opaque.get("driver") != driver:
            continue
        requests = _field(c, "requests", list, path, required=False) or []
        if not all(isinstance(r, str) for r in requests):
            raise ClaimError(f"{path}.requests: expected a list of request names")
        source = c.get("source", "FromClaim")
        if source not in ("FromClass", "FromClaim"):
            raise ClaimError(f"{path}.source: {source!r}; allowed: FromClass, FromClaim")
        parameters = _field(opaque, "parameters", dict, f"{path}.opaque")
        configs.append(OpaqueConfig(source=source, requests=tuple(requests), parameters=parameters))
    return Claim(ref=ref, devices=tuple(results), configs=tuple(configs))


class PrepareError(DriverError):
    """A claim cannot be prepared or unprepared; the message goes to the kubelet."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent
        """True when retrying cannot help (bad config), False for transient faults."""


@dataclass(frozen=True)
class PreparedDevice:
    """One device of a prepared claim, as the kubelet needs it."""

    request_names: tuple[str, ...]
    """As allocated (``req`` or ``req/sub``); the plugin layer sends base names."""
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None
