"""The claim shapes of ``--claim``, written as users write them, and what each allows.

Each shape is the ``spec`` of a ResourceClaim (in a ResourceClaimTemplate, or
pre-created), a Python predicate that says whether an allocation satisfies it
(for the CI check: every pod bound to devices its claim allows), and its form
for ``--shape minimal`` (:class:`Minimal`): the same request with the
DeviceClass's test and the selector rewritten onto the one attribute a minimal
device carries. How many claims a node holds is :mod:`bench.fleet.capacity`'s.

=================  ==========================================================
``whole``          one GPU (class ``gpu.nvidia.com``) with at least 40Gi memory
``mig:PROFILE``    one MIG device (``mig.nvidia.com``) whose ``profile`` is PROFILE
``share:MEM,CPT``  ``memory: MEM`` and ``computeShare: CPT`` of a consumable GPU
                   (nodes published with ``--consumable-gpus``)
``eight-aligned``  eight GPUs with ``matchAttribute`` on a topology attribute
``first-available`` ``firstAvailable``: a GPU with 80Gi, else any GPU, else a MIG device
=================  ==========================================================

On the minimal pool the DeviceClasses select only ``device.driver``
(:func:`bench.fleet.minimal.minimal_classes`): a class reading ``type`` would
force a second attribute on ``mig:`` devices. ``eight-aligned`` has no minimal
form: it needs ``type`` and the aligned attribute.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.fleet.pools import DRIVER
from dra_driver.quantity import parse

Obj = dict[str, Any]
GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
ALIGN_CANDIDATES = (
    f"{DRIVER}/nvlinkDomain",
    "resource.kubernetes.io/numaNode",
    "resource.kubernetes.io/pcieRoot",
    f"{DRIVER}/productName",
)
"""``eight-aligned`` matches the first of these that eight GPUs of a node share
(dgx-h100 has no NVLink domain and 4+4 NUMA: it falls back to productName)."""


def _attr(device: Obj, name: str) -> Any:
    short = name.removeprefix(f"{DRIVER}/")
    value = (device.get("attributes") or {}).get(short)
    return None if value is None else next(iter(value.values()))


def _memory(device: Obj) -> int:
    cap = (device.get("capacity") or {}).get("memory")
    return int(parse(cap["value"])) if cap else 0


def _is(device: Obj, kind: str) -> bool:
    return bool(_attr(device, "type") == kind)


def _memory_at_least(quantity: str) -> Callable[[Obj], bool]:
    floor = int(parse(quantity))
    return lambda d: _is(d, "gpu") and _memory(d) >= floor


TYPE = f"device.attributes['{DRIVER}'].type"


def _memory_selector(quantity: str) -> str:
    return f"device.capacity['{DRIVER}'].memory.compareTo(quantity('{quantity}')) >= 0"


@dataclass(frozen=True)
class Minimal:
    """A shape on the minimal pool: every device carries only ``attribute``."""

    attribute: str
    """The one driver-domain attribute (``type`` or ``profile``) kept on every device."""
    spec: Obj
    """``ResourceClaim.spec`` with the selectors rewritten onto ``attribute``."""
    only_type: str | None = None
    """Devices of another ``type`` carry ``attribute`` empty, so ``profile == 'P'``
    rejects a GPU whose driver ``profile`` is P (dynamic MIG) as the mig class did."""
    capacities: tuple[str, ...] = ()
    """Capacities the selectors read; kept on exclusive devices (shared ones keep all)."""


@dataclass(frozen=True)
class Shape:
    """One ``--claim`` value."""

    name: str
    spec: Obj
    """``ResourceClaim.spec``."""
    allows: Callable[[Sequence[Obj], Sequence[Obj]], bool]
    """``(allocation results, the driver's devices of those names)`` -> satisfied."""
    minimal: Minimal | None
    """Its ``--shape minimal`` form; None where one attribute cannot express it."""
    note: str = ""


def _exactly(cls: str, *, selector: str | None = None, count: int = 1, **extra: Any) -> Obj:
    exactly: Obj = {"deviceClassName": cls, **extra}
    if count != 1:
        exactly["count"] = count
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return exactly


def _one(name: str, exactly: Obj, constraints: Sequence[Obj] = ()) -> Obj:
    devices: Obj = {"requests": [{"name": name, "exactly": exactly}]}
    if constraints:
        devices["constraints"] = list(constraints)
    return {"devices": devices}


def whole() -> Shape:
    ok = _memory_at_least("40Gi")
    sel = _memory_selector("40Gi")
    minimal = _exactly(GPU_CLASS, selector=f"{TYPE} == 'gpu' && {sel}")
    return Shape(
        "whole",
        _one("gpu", _exactly(GPU_CLASS, selector=sel)),
        allows=lambda results, devs: len(devs) == 1 and ok(devs[0]),
        minimal=Minimal("type", _one("gpu", minimal), capacities=("memory",)),
    )


def mig(profile: str) -> Shape:
    def ok(d: Obj) -> bool:
        return _is(d, "mig") and _attr(d, "profile") == profile

    sel = f"device.attributes['{DRIVER}'].profile == '{profile}'"
    spec = _one("mig", _exactly(MIG_CLASS, selector=sel))
    return Shape(
        f"mig:{profile}",
        spec,
        allows=lambda results, devs: len(devs) == 1 and ok(devs[0]),
        minimal=Minimal("profile", spec, only_type="mig"),
    )


def share(memory: str, compute: str) -> Shape:
    want = {"memory": memory, "computeShare": compute}

    def fits(d: Obj) -> int:
        caps = d.get("capacity") or {}
        if not (_is(d, "gpu") and d.get("allowMultipleAllocations") and "computeShare" in caps):
            return 0
        return min(int(parse(caps[k]["value"]) // parse(v)) for k, v in want.items())

    def allows(results: Sequence[Obj], devs: Sequence[Obj]) -> bool:
        if len(devs) != 1 or not fits(devs[0]):
            return False
        used = results[0].get("consumedCapacity") or {}
        return all(parse(used.get(k, "0")) >= parse(v) for k, v in want.items())

    minimal = _exactly(GPU_CLASS, selector=f"{TYPE} == 'gpu'", capacity={"requests": dict(want)})
    return Shape(
        f"share:{memory},{compute}",
        _one("gpu", _exactly(GPU_CLASS, capacity={"requests": dict(want)})),
        allows=allows,
        minimal=Minimal("type", _one("gpu", minimal)),
        note="needs --consumable-gpus",
    )


def align_attribute(devices: Sequence[Obj], count: int = 8) -> str | None:
    """The first of :data:`ALIGN_CANDIDATES` whose value ``count`` GPUs share."""
    gpus = [d for d in devices if _is(d, "gpu")]
    for name in ALIGN_CANDIDATES:
        values = Counter(v for d in gpus if (v := _attr(d, name)) is not None)
        if values and max(values.values()) >= count:
            return name
    return None


def eight_aligned(devices: Sequence[Obj]) -> Shape:
    attr = align_attribute(devices) or ALIGN_CANDIDATES[0]

    def allows(results: Sequence[Obj], devs: Sequence[Obj]) -> bool:
        names = {d["name"] for d in devs}
        values = {_attr(d, attr) for d in devs}
        return len(names) == 8 and all(_is(d, "gpu") for d in devs) and len(values) == 1

    constraint = {"requests": ["gpus"], "matchAttribute": attr}
    return Shape(
        "eight-aligned",
        _one("gpus", _exactly(GPU_CLASS, count=8), [constraint]),
        allows=allows,
        minimal=None,
        note=f"matchAttribute {attr}",
    )


def first_available() -> Shape:
    big = _memory_at_least("80Gi")
    subrequests = [
        {"name": "big", **_exactly(GPU_CLASS, selector=_memory_selector("80Gi"))},
        {"name": "any", **_exactly(GPU_CLASS)},
        {"name": "mig", **_exactly(MIG_CLASS)},
    ]
    minimal = [
        {"name": "big", **_exactly(GPU_CLASS, selector=(
            f"{TYPE} == 'gpu' && {_memory_selector('80Gi')}"))},
        {"name": "any", **_exactly(GPU_CLASS, selector=f"{TYPE} == 'gpu'")},
        {"name": "mig", **_exactly(MIG_CLASS, selector=f"{TYPE} == 'mig'")},
    ]  # fmt: skip
    checks: dict[str, Callable[[Obj], bool]] = {
        "big": big,
        "any": lambda d: _is(d, "gpu"),
        "mig": lambda d: _is(d, "mig"),
    }

    def allows(results: Sequence[Obj], devs: Sequence[Obj]) -> bool:
        if len(devs) != 1:
            return False
        sub = str(results[0].get("request", "")).partition("/")[2]
        return sub in checks and checks[sub](devs[0])

    def spec(alternatives: list[Obj]) -> Obj:
        return {"devices": {"requests": [{"name": "gpu", "firstAvailable": alternatives}]}}

    return Shape(
        "first-available",
        spec(subrequests),
        allows=allows,
        minimal=Minimal("type", spec(minimal), capacities=("memory",)),
    )


def shape(text: str, devices: Sequence[Obj]) -> Shape:
    """The shape for a ``--claim`` value on a fleet of nodes publishing ``devices``;
    raises ValueError naming the allowed forms."""
    kind, _, arg = text.partition(":")
    if kind == "whole" and not arg:
        return whole()
    if kind == "mig" and arg:
        return mig(arg)
    if kind == "share" and arg.count(",") == 1:
        memory, compute = arg.split(",")
        return share(memory, compute)
    if kind == "eight-aligned" and not arg:
        return eight_aligned(devices)
    if kind == "first-available" and not arg:
        return first_available()
    raise ValueError(
        f"--claim {text!r}: want whole, mig:PROFILE, share:MEM,COMPUTE, eight-aligned "
        "or first-available"
    )
