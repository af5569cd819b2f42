"""Small builders for resource.k8s.io/v1 objects in allocation tests."""

from __future__ import annotations

from typing import Any

DRIVER = "gpu.example.com"


def device(name: str, **attrs: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"name": name, "attributes": {}, "capacity": {}}
    for k, v in attrs.items():
        if k == "capacity":
            d["capacity"] = {ck: {"value": cv} for ck, cv in v.items()}
        elif k in ("taints", "consumesCounters", "allowMultipleAllocations"):
            d[k] = v
        elif k == "capacity_policy":
            for ck, pol in v.items():
                d["capacity"][ck]["requestPolicy"] = pol
        elif isinstance(v, bool):
            d["attributes"][k] = {"bool": v}
        elif isinstance(v, int):
            d["attributes"][k] = {"int": v}
        else:
            d["attributes"][k] = {"string": v}
    return d


def rslice(
    node: str,
    devices: list[dict[str, Any]],
    *,
    name: str | None = None,
    pool: str | None = None,
    generation: int = 1,
    count: int = 1,
    counters: list[dict[str, Any]] | None = None,
    driver: str = DRIVER,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "driver": driver,
        "nodeName": node,
        "pool": {"name": pool or node, "generation": generation, "resourceSliceCount": count},
    }
    if counters is not None:
        spec["sharedCounters"] = counters
    else:
        spec["devices"] = devices
    return {"kind": "ResourceSlice", "metadata": {"name": name or f"{node}-slice"}, "spec": spec}


def device_class(name: str = "gpu", expr: str = f'device.driver == "{DRIVER}"') -> dict[str, Any]:
    return {
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": expr}}]},
    }


def exact(name: str, *selectors: str, cls: str = "gpu", **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": cls, **fields}
    if selectors:
        body["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return {"name": name, "exactly": body}


def first_available(name: str, *subs: tuple[str, str]) -> dict[str, Any]:
    return {
        "name": name,
        "firstAvailable": [
            {"name": sub, "deviceClassName": "gpu", "selectors": [{"cel": {"expression": e}}]}
            for sub, e in subs
        ],
    }


def claim(
    name: str, *requests: dict[str, Any], constraints: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = constraints
    return {
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"devices": devices},
    }


def attr(name: str) -> str:
    return f'device.attributes["{DRIVER}"].{name}'
