"""Pool -> ResourceSlice objects: validation, splitting and conversion (pure, no I/O).

Everything the API server would reject is caught here first, with the field
path, the bad value and what is allowed, so a bad pool never reaches the
server half-written. Limits (docs/dra-spec.md section 4): 128 devices per slice,
64 when any device in it has taints or consumes counters; counter sets live in
their own slices, at most 8 per slice; at most 32 attributes + capacities per
device; strings and versions at most 64 characters; versions strict semver.

Slice names start with a 5-digit hex index so listing order equals device
order (the scheduler walks slices by name) and existing slices can be matched
to desired ones by that prefix.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from dra_driver.plugin.k8snames import is_dns_label, is_dns_subdomain, is_label_value
from dra_driver.plugin.requestpolicy import capacity_problems
from dra_driver.plugin.resources import Capacity, CounterSet, Device, ListValue, Pool, Version

MAX_DEVICES = 128
MAX_DEVICES_RESTRICTED = 64
MAX_COUNTER_SETS_PER_SLICE = 8
MAX_COUNTERS_PER_SET = 32
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_STRING = 64
MAX_TAINTS = 16
MAX_CONSUMES_COUNTERS = 2
MAX_LIST_VALUES = 48
"""List-typed attribute values per device, all lists together (KEP-5491)."""
_TAINT_EFFECTS = ("None", "NoSchedule", "NoExecute")
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")

_C_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)
_INDEX_PREFIX = re.compile(r"^([0-9a-f]{5})-")


class SliceValidationError(ValueError):
    """The pool breaks API rules; ``problems`` lists each as ``field: what is wrong``."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid pool:\n  " + "\n  ".join(problems))
        self.problems = problems


def _qualified_name(name: str) -> str | None:
    """None if ``name`` is a valid attribute/capacity name, else why not."""
    domain, _, ident = name.rpartition("/")
    if domain and not is_dns_subdomain(domain, 63):
        return "domain must be a DNS subdomain of at most 63 characters"
    if len(ident) > 32 or not _C_IDENT.match(ident):
        return "name must be a C identifier of at most 32 characters, optionally domain/ prefixed"
    return None


def _validate_device(i: int, d: Device, sets: dict[str, CounterSet], problems: list[str]) -> None:
    at = f"devices[{i}]"
    if not is_dns_label(d.name):
        problems.append(f"{at}.name: {d.name!r} is not a DNS label (a-z, 0-9, '-', <= 63)")
    if len(d.attributes) + len(d.capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
        problems.append(
            f"{at} ({d.name}): {len(d.attributes)} attributes + {len(d.capacity)} capacities; "
            f"at most {MAX_ATTRIBUTES_AND_CAPACITIES} in total"
        )
    list_values = 0
    for key, value in d.attributes.items():
        if why := _qualified_name(key):
            problems.append(f"{at}.attributes[{key!r}]: {why}")
        if isinstance(value, ListValue):
            list_values += len(value.values)
            if not value.values or len({type(v) for v in value.values}) != 1:
                problems.append(
                    f"{at}.attributes[{key!r}]: a list attribute needs at least one value, "
                    "all of one type"
                )
        elif isinstance(value, Version):
            if len(value.value) > MAX_STRING or not _SEMVER.match(value.value):
                problems.append(
                    f"{at}.attributes[{key!r}]: version {value.value!r} is not strict semver "
                    f"(e.g. 1.2.3) of at most {MAX_STRING} characters"
                )
        elif isinstance(value, str) and len(value) > MAX_STRING:
            problems.append(
                f"{at}.attributes[{key!r}]: string is {len(value)} characters; at most {MAX_STRING}"
            )
    for key, cap in d.capacity.items():
        if why := _qualified_name(key):
            problems.append(f"{at}.capacity[{key!r}]: {why}")
        problems.extend(
            capacity_problems(f"{at}.capacity[{key!r}]", cap, d.allow_multiple_allocations)
        )
    if list_values > MAX_LIST_VALUES:
        problems.append(
            f"{at}.attributes: {list_values} list values; at most {MAX_LIST_VALUES} per device"
        )
    if len(d.taints) > MAX_TAINTS:
        problems.append(f"{at}.taints: {len(d.taints)} taints; at most {MAX_TAINTS}")
    for j, t in enumerate(d.taints):
        where = f"{at}.taints[{j}]"
        prefix, _, name = t.key.rpartition("/")
        if (prefix and not is_dns_subdomain(prefix)) or not name or not is_label_value(name):
            problems.append(f"{where}.key: {t.key!r} is not a label key ([prefix/]name)")
        if not is_label_value(t.value):
            problems.append(f"{where}.value: {t.value!r} is not a label value (<= 63 chars)")
        if t.effect not in _TAINT_EFFECTS:
            problems.append(f"{where}.effect: {t.effect!r}; allowed: {', '.join(_TAINT_EFFECTS)}")
        if t.time_added is not None and not _RFC3339.match(t.time_added):
            problems.append(f"{where}.timeAdded: {t.time_added!r} is not RFC 3339 UTC seconds")
    if len(d.consumes_counters) > MAX_CONSUMES_COUNTERS:
        problems.append(f"{at}.consumesCounters: at most {MAX_CONSUMES_COUNTERS} entries")
    seen: set[str] = set()
    for j, use in enumerate(d.consumes_counters):
        where = f"{at}.consumesCounters[{j}]"
        if use.counter_set in seen:
            problems.append(f"{where}.counterSet: {use.counter_set!r} listed twice")
        seen.add(use.counter_set)
        if not 1 <= len(use.counters) <= MAX_COUNTERS_PER_SET:
            problems.append(
                f"{where}.counters: {len(use.counters)} counters; allowed 1..{MAX_COUNTERS_PER_SET}"
            )
        target = sets.get(use.counter_set)
        if target is None:
            problems.append(
                f"{where}.counterSet: {use.counter_set!r} is not a counter set of the pool"
            )
            continue
        for counter in use.counters:
            if counter not in target.counters:
                problems.append(
                    f"{where}.counters[{counter!r}]: set {use.counter_set!r} has no such counter"
                )


def validate_pool(pool: Pool) -> None:
    """Raise :class:`SliceValidationError` listing every problem, or return None."""
    problems: list[str] = []
    sets: dict[str, CounterSet] = {}
    for i, cs in enumerate(pool.counter_sets):
        at = f"counterSets[{i}]"
        if not is_dns_label(cs.name):
            problems.append(f"{at}.name: {cs.name!r} is not a DNS label")
        if cs.name in sets:
            problems.append(f"{at}.name: {cs.name!r} is used twice; set names must be unique")
        sets[cs.name] = cs
        if not 1 <= len(cs.counters) <= MAX_COUNTERS_PER_SET:
            problems.append(f"{at}.counters: {len(cs.counters)} counters; allowed 1..32")
        for name in cs.counters:
            if not is_dns_label(name):
                problems.append(f"{at}.counters[{name!r}]: not a DNS label")
    names: set[str] = set()
    for i, d in enumerate(pool.devices):
        if d.name in names:
            problems.append(f"devices[{i}].name: {d.name!r} is used twice; must be unique in pool")
        names.add(d.name)
        _validate_device(i, d, sets, problems)
    if problems:
        raise SliceValidationError(problems)


@dataclass(frozen=True)
class SliceContent:
    """What one slice carries: devices or counter sets, never both (API >= 1.35)."""

    devices: tuple[Device, ...] = ()
    counter_sets: tuple[CounterSet, ...] = ()


def _restricted(d: Device) -> bool:
    """Devices with taints, counters or list attributes: 64 per slice, not 128."""
    return bool(
        d.taints
        or d.consumes_counters
        or any(isinstance(v, ListValue) for v in d.attributes.values())
    )


def split_pool(pool: Pool) -> list[SliceContent]:
    """Counter-set slices first, then device slices in device order; one empty slice
    for an empty pool ("driver up, no devices")."""
    out = [
        SliceContent(counter_sets=pool.counter_sets[i : i + MAX_COUNTER_SETS_PER_SLICE])
        for i in range(0, len(pool.counter_sets), MAX_COUNTER_SETS_PER_SLICE)
    ]
    chunk: list[Device] = []
    restricted = False
    for d in pool.devices:
        limit = MAX_DEVICES_RESTRICTED if restricted or _restricted(d) else MAX_DEVICES
        if len(chunk) + 1 > limit:
            out.append(SliceContent(devices=tuple(chunk)))
            chunk, restricted = [], False
        chunk.append(d)
        restricted = restricted or _restricted(d)
    if chunk:
        out.append(SliceContent(devices=tuple(chunk)))
    return out or [SliceContent()]


_LIST_KEYS = {bool: "bools", int: "ints", str: "strings", Version: "versions"}


def _attribute(value: Any) -> dict[str, Any]:
    if isinstance(value, ListValue):
        kind = type(value.values[0])
        items = [v.value if isinstance(v, Version) else v for v in value.values]
        return {_LIST_KEYS[kind]: items}
    if isinstance(value, Version):
        return {"version": value.value}
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    return {"string": value}


def _capacity(c: Capacity) -> dict[str, Any]:
    out: dict[str, Any] = {"value": c.value}
    p = c.policy
    if p is not None:
        policy: dict[str, Any] = {}
        if p.default is not None:
            policy["default"] = p.default
        if p.valid_values:
            policy["validValues"] = list(p.valid_values)
        if p.valid_range_min is not None:
            rng = {"min": p.valid_range_min}
            if p.valid_range_max is not None:
                rng["max"] = p.valid_range_max
            if p.valid_range_step is not None:
                rng["step"] = p.valid_range_step
            policy["validRange"] = rng
        out["requestPolicy"] = policy
    return out


def device_to_api(d: Device) -> dict[str, Any]:
    out: dict[str, Any] = {"name": d.name}
    if d.attributes:
        out["attributes"] = {k: _attribute(v) for k, v in d.attributes.items()}
    if d.capacity:
        out["capacity"] = {k: _capacity(v) for k, v in d.capacity.items()}
    if d.consumes_counters:
        out["consumesCounters"] = [
            {
                "counterSet": c.counter_set,
                "counters": {k: {"value": v} for k, v in c.counters.items()},
            }
            for c in d.consumes_counters
        ]
    if d.taints:
        out["taints"] = [
            {
                "key": t.key,
                "effect": t.effect,
                **({"value": t.value} if t.value else {}),
                **({"timeAdded": t.time_added} if t.time_added else {}),
            }
            for t in d.taints
        ]
    if d.allow_multiple_allocations:
        out["allowMultipleAllocations"] = True
    return out


def content_to_api(content: SliceContent) -> dict[str, Any]:
    """The ``spec`` fields that carry the content (devices or sharedCounters)."""
    if content.counter_sets:
        return {
            "sharedCounters": [
                {"name": cs.name, "counters": {k: {"value": v} for k, v in cs.counters.items()}}
                for cs in content.counter_sets
            ]
        }
    if not content.devices:  # "driver up, no devices": the server would drop an empty list
        return {}
    return {"devices": [device_to_api(d) for d in content.devices]}


def slice_name(driver: str, node: str, index: int) -> str:
    name = f"{index:05x}-{driver}-{node}"
    if len(name) > 253:
        name = f"{index:05x}-{hashlib.sha256(f'{driver}/{node}'.encode()).hexdigest()[:32]}"
    return name


def slice_index(name: str) -> int | None:
    """Index encoded in one of our slice names, or None for a foreign name."""
    m = _INDEX_PREFIX.match(name)
    return int(m.group(1), 16) if m else None


def slice_object(
    *,
    driver: str,
    node_name: str,
    node_uid: str,
    index: int,
    generation: int,
    count: int,
    content: SliceContent,
) -> dict[str, Any]:
    """A complete ResourceSlice (resource.k8s.io/v1) for one node-local slice."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": slice_name(driver, node_name, index),
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": node_name,
                    "uid": node_uid,
                    "controller": True,
                }
            ],
        },
        "spec": {
            "driver": driver,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": generation, "resourceSliceCount": count},
            **content_to_api(content),
        },
    }


def validate_names(driver: str, node: str) -> None:
    problems = []
    if not is_dns_subdomain(driver, 63):
        problems.append(f"driver: {driver!r} must be a DNS subdomain of at most 63 characters")
    if not is_dns_subdomain(node):
        problems.append(f"node name: {node!r} must be a DNS subdomain")
    if problems:
        raise SliceValidationError(problems)
