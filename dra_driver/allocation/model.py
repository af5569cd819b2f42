"""The objects the allocator reads, parsed from resource.k8s.io/v1 JSON into plain dataclasses.

Only what allocation depends on is kept; the raw device JSON stays attached so
CEL conversion and output can use it. Parse errors name the object and field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_driver.quantity import Quantity, QuantityError, parse_quantity

ALLOCATION_RESULTS_MAX = 32
"""resource.k8s.io: at most 32 devices in one claim's allocation."""


class ModelError(ValueError):
    """An input object is malformed: says which object and which field."""


def _quantity(where: str, text: object) -> Quantity:
    try:
        return parse_quantity(str(text))
    except QuantityError as err:
        raise ModelError(f"{where}: {err}") from None


@dataclass(frozen=True)
class DeviceId:
    driver: str
    pool: str
    device: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True)
class CapacityPolicy:
    default: Quantity | None = None
    valid_values: tuple[Quantity, ...] = ()
    range_min: Quantity | None = None
    range_max: Quantity | None = None
    range_step: Quantity | None = None


@dataclass(frozen=True)
class DeviceCapacity:
    value: Quantity
    policy: CapacityPolicy | None = None


@dataclass(eq=False)
class Device:
    name: str
    raw: Mapping[str, Any]
    capacity: dict[str, DeviceCapacity]
    consumes: dict[str, dict[str, Quantity]]
    """counter set -> counter -> amount"""
    taints: tuple[Taint, ...]
    allow_multiple: bool
    binding_conditions: tuple[str, ...]
    node_name: str = ""
    all_nodes: bool = False
    node_selector: Mapping[str, Any] | None = None


@dataclass(eq=False)
class Slice:
    name: str
    driver: str
    pool: str
    generation: int
    slice_count: int
    node_name: str
    all_nodes: bool
    node_selector: Mapping[str, Any] | None
    per_device_node_selection: bool
    devices: list[Device]
    counter_sets: dict[str, dict[str, Quantity]]


@dataclass(frozen=True)
class Node:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class DeviceClass:
    name: str
    selectors: tuple[str, ...]


@dataclass(frozen=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator in ("", "Equal"):
            return self.value == taint.value
        return self.operator == "Exists"


@dataclass(frozen=True)
class Request:
    """An exact request, or one subrequest of a ``firstAvailable`` request."""

    name: str
    device_class: str
    selectors: tuple[str, ...] = ()
    all_devices: bool = False
    count: int = 1
    admin_access: bool = False
    tolerations: tuple[Toleration, ...] = ()
    capacity: Mapping[str, Quantity] | None = None
    parent: str = ""
    """The ``firstAvailable`` request this is a subrequest of."""

    @property
    def result_name(self) -> str:
        return f"{self.parent}/{self.name}" if self.parent else self.name

    @property
    def base_name(self) -> str:
        return self.parent or self.name


@dataclass(frozen=True)
class Constraint:
    requests: frozenset[str]
    match_attribute: str = ""
    distinct_attribute: str = ""

    def applies(self, request: Request) -> bool:
        if not self.requests:
            return True
        return request.base_name in self.requests or (
            bool(request.parent) and request.result_name in self.requests
        )


@dataclass(frozen=True)
class AllocatedDevice:
    request: str
    device: DeviceId
    admin_access: bool = False
    share_id: str = ""
    consumed: Mapping[str, Quantity] = field(default_factory=dict)


@dataclass
class Claim:
    namespace: str
    name: str
    requests: list[list[Request]]
    """One entry per request: [exact] or the firstAvailable subrequests in order."""
    constraints: list[Constraint]
    allocated: list[AllocatedDevice] | None = None
    allocated_node: str = ""
    uid: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


# -- parsing ---------------------------------------------------------------


def _node_choice(spec: Mapping[str, Any]) -> tuple[str, bool, Mapping[str, Any] | None]:
    return (
        str(spec.get("nodeName") or ""),
        bool(spec.get("allNodes", False)),
        spec.get("nodeSelector") or None,
    )


def _capacity(where: str, raw: Mapping[str, Any]) -> DeviceCapacity:
    policy = None
    rp = raw.get("requestPolicy")
    if rp:
        vr = rp.get("validRange") or {}
        policy = CapacityPolicy(
            default=_quantity(f"{where}.requestPolicy.default", rp["default"])
            if rp.get("default") is not None
            else None,
            valid_values=tuple(
                _quantity(f"{where}.requestPolicy.validValues", v)
                for v in rp.get("validValues") or ()
            ),
            range_min=_quantity(f"{where}.validRange.min", vr["min"]) if "min" in vr else None,
            range_max=_quantity(f"{where}.validRange.max", vr["max"]) if "max" in vr else None,
            range_step=_quantity(f"{where}.validRange.step", vr["step"]) if "step" in vr else None,
        )
    return DeviceCapacity(_quantity(f"{where}.value", raw.get("value")), policy)


def parse_device(where: str, raw: Mapping[str, Any]) -> Device:
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise ModelError(f"{where}: device without a name")
    where = f"{where} device {name}"
    node_name, all_nodes, selector = _node_choice(raw)
    return Device(
        name=name,
        raw=raw,
        capacity={
            k: _capacity(f"{where} capacity {k}", v) for k, v in (raw.get("capacity") or {}).items()
        },
        consumes={
            str(c.get("counterSet")): {
                k: _quantity(f"{where} consumesCounters {k}", v.get("value"))
                for k, v in (c.get("counters") or {}).items()
            }
            for c in raw.get("consumesCounters") or ()
        },
        taints=tuple(
            Taint(str(t.get("key", "")), str(t.get("value", "")), str(t.get("effect", "")))
            for t in raw.get("taints") or ()
        ),
        allow_multiple=bool(raw.get("allowMultipleAllocations", False)),
        binding_conditions=tuple(raw.get("bindingConditions") or ()),
        node_name=node_name,
        all_nodes=all_nodes,
        node_selector=selector,
    )


def parse_slice(obj: Mapping[str, Any]) -> Slice:
    name = str(obj.get("metadata", {}).get("name", ""))
    where = f"ResourceSlice {name or '<unnamed>'}"
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise ModelError(f"{where}: no spec")
    pool = spec.get("pool") or {}
    if not spec.get("driver") or not pool.get("name"):
        raise ModelError(f"{where}: spec.driver and spec.pool.name are required")
    node_name, all_nodes, selector = _node_choice(spec)
    return Slice(
        name=name,
        driver=str(spec["driver"]),
        pool=str(pool["name"]),
        generation=int(pool.get("generation", 0)),
        slice_count=int(pool.get("resourceSliceCount", 1)),
        node_name=node_name,
        all_nodes=all_nodes,
        node_selector=selector,
        per_device_node_selection=bool(spec.get("perDeviceNodeSelection", False)),
        devices=[parse_device(where, d) for d in spec.get("devices") or ()],
        counter_sets={
            str(cs.get("name")): {
                k: _quantity(f"{where} sharedCounters {k}", v.get("value"))
                for k, v in (cs.get("counters") or {}).items()
            }
            for cs in spec.get("sharedCounters") or ()
        },
    )


def parse_node(obj: Mapping[str, Any]) -> Node:
    meta = obj.get("metadata") or {}
    return Node(name=str(meta.get("name", "")), labels=dict(meta.get("labels") or {}))


def parse_device_class(obj: Mapping[str, Any]) -> DeviceClass:
    name = str((obj.get("metadata") or {}).get("name", ""))
    selectors = _selectors(f"DeviceClass {name}", (obj.get("spec") or {}).get("selectors"))
    return DeviceClass(name=name, selectors=selectors)


def _selectors(where: str, raw: Sequence[Mapping[str, Any]] | None) -> tuple[str, ...]:
    out = []
    for i, sel in enumerate(raw or ()):
        expr = (sel.get("cel") or {}).get("expression")
        if not isinstance(expr, str):
            raise ModelError(f"{where}: selector #{i} has no cel.expression")
        out.append(expr)
    return tuple(out)


def _request(where: str, raw: Mapping[str, Any], name: str, parent: str = "") -> Request:
    mode = raw.get("allocationMode", "ExactCount")
    if mode not in ("ExactCount", "All"):
        raise ModelError(f"{where}: allocationMode {mode!r}; allowed: ExactCount, All")
    if not raw.get("deviceClassName"):
        raise ModelError(f"{where}: deviceClassName is required")
    capacity = (raw.get("capacity") or {}).get("requests")
    return Request(
        name=name,
        device_class=str(raw["deviceClassName"]),
        selectors=_selectors(where, raw.get("selectors")),
        all_devices=mode == "All",
        count=int(raw.get("count", 1)) if mode == "ExactCount" else 0,
        admin_access=bool(raw.get("adminAccess", False)),
        tolerations=tuple(
            Toleration(
                str(t.get("key", "")),
                str(t.get("operator", "Equal")),
                str(t.get("value", "")),
                str(t.get("effect", "")),
            )
            for t in raw.get("tolerations") or ()
        ),
        capacity={k: _quantity(f"{where} capacity {k}", v) for k, v in capacity.items()}
        if capacity is not None
        else None,
        parent=parent,
    )


def parse_claim_spec(namespace: str, name: str, spec: Mapping[str, Any]) -> Claim:
    where = f"ResourceClaim {namespace}/{name}"
    devices = spec.get("devices") or {}
    requests: list[list[Request]] = []
    for raw in devices.get("requests") or ():
        rname = str(raw.get("name", ""))
        if raw.get("exactly"):
            requests.append([_request(f"{where} request {rname}", raw["exactly"], rname)])
        elif raw.get("firstAvailable"):
            requests.append(
                [
                    _request(
                        f"{where} request {rname}/{sub.get('name')}", sub, str(sub["name"]), rname
                    )
                    for sub in raw["firstAvailable"]
                ]
            )
        else:
            raise ModelError(f"{where} request {rname}: needs exactly or firstAvailable")
    constraints = []
    for i, c in enumerate(devices.get("constraints") or ()):
        if not c.get("matchAttribute") and not c.get("distinctAttribute"):
            raise ModelError(f"{where} constraint #{i}: needs matchAttribute or distinctAttribute")
        constraints.append(
            Constraint(
                frozenset(c.get("requests") or ()),
                str(c.get("matchAttribute") or ""),
                str(c.get("distinctAttribute") or ""),
            )
        )
    return Claim(namespace, name, requests, constraints)


def parse_claim(obj: Mapping[str, Any]) -> Claim:
    meta = obj.get("metadata") or {}
    claim = parse_claim_spec(
        str(meta.get("namespace") or "default"), str(meta.get("name", "")), obj.get("spec") or {}
    )
    claim.uid = str(meta.get("uid", ""))
    allocation = (obj.get("status") or {}).get("allocation")
    if allocation:
        claim.allocated = [
            AllocatedDevice(
                request=str(r.get("request", "")),
                device=DeviceId(str(r["driver"]), str(r["pool"]), str(r["device"])),
                admin_access=bool(r.get("adminAccess", False)),
                share_id=str(r.get("shareID") or ""),
                consumed={
                    k: _quantity("consumedCapacity", v)
                    for k, v in (r.get("consumedCapacity") or {}).items()
                },
            )
            for r in (allocation.get("devices") or {}).get("results") or ()
        ]
        claim.allocated_node = _node_of(allocation.get("nodeSelector"))
    return claim


def _node_of(selector: Mapping[str, Any] | None) -> str:
    """The node a node-local allocation is pinned to (matchFields metadata.name In [node])."""
    for term in (selector or {}).get("nodeSelectorTerms") or ():
        for f in term.get("matchFields") or ():
            if f.get("key") == "metadata.name" and f.get("operator") == "In" and f.get("values"):
                return str(f["values"][0])
    return ""
