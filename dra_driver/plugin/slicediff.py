"""What one slice sync must write: the pure half of :mod:`dra_driver.plugin.publishing`.

Given the slices the API server holds and the desired split of the pool,
:func:`plan_sync` decides which slices to delete, update and create, and under
which pool generation, by the generation rule the scheduler expects (see
:mod:`~dra_driver.plugin.publishing`). No I/O, so the rule is read and tested
apart from the threads that carry it out. Also here: comparing what was sent
with what the server stored.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dra_driver.plugin.slices import SliceContent, slice_index, slice_name, slice_object

Obj = dict[str, Any]


@dataclass(frozen=True)
class SyncPlan:
    """The writes of one sync, in the order they are made."""

    generation: int
    count: int
    """Slices in the pool (``resourceSliceCount``)."""
    delete: tuple[Obj, ...] = ()
    update: tuple[Obj, ...] = ()
    """Desired objects carrying the stored ``resourceVersion``."""
    create: tuple[Obj, ...] = ()

    @property
    def in_sync(self) -> bool:
        return not (self.delete or self.update or self.create)


def fingerprint(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def written_fingerprint(obj: Obj) -> str:
    """What we meant to store: spec and owner (the server adds the rest)."""
    return fingerprint(obj["spec"]) + fingerprint(obj["metadata"]["ownerReferences"])


def device_names(obj: Obj) -> list[str]:
    return [str(d.get("name")) for d in obj.get("spec", {}).get("devices") or []]


def content_to_api_view(spec: Obj) -> Obj:
    """The content part of a spec, for comparing what is stored with what we want."""
    return {k: spec[k] for k in ("devices", "sharedCounters") if spec.get(k)}


def holds(have: Obj, want: Obj) -> bool:
    """Whether the stored slice ``have`` holds what ``want`` says (fields the server
    adds aside): it need not be written."""
    spec = have.get("spec", {})
    return (
        spec.get("pool") == want["spec"]["pool"]
        and spec.get("nodeName") == want["spec"]["nodeName"]
        and content_to_api_view(spec) == content_to_api_view(want["spec"])
        and have.get("metadata", {}).get("ownerReferences") == want["metadata"]["ownerReferences"]
    )


def plan_sync(
    items: Sequence[Obj],
    contents: Sequence[SliceContent],
    *,
    driver: str,
    node: str,
    node_uid: str,
    generation: int,
    up_to_date: Callable[[Obj, Obj], bool],
) -> SyncPlan:
    """The writes that make ``items`` (our listed slices) hold ``contents``.

    ``generation``: the highest we wrote so far (-1 at start); ``up_to_date(have,
    want)`` says whether a stored slice already holds what we want. One changed
    slice whose devices keep their names is updated in place under the same
    generation; anything else bumps the generation and rewrites every slice."""
    n = len(contents)
    existing: dict[int, Obj] = {}
    obsolete: list[Obj] = []
    for s in items:
        name = str(s["metadata"]["name"])
        idx = slice_index(name)
        if idx is None or idx >= n or idx in existing or name != slice_name(driver, node, idx):
            obsolete.append(s)
        else:
            existing[idx] = s
    gens = {int(s["spec"]["pool"].get("generation", 0)) for s in items}
    current = max(gens | {generation})

    def desired(gen: int) -> list[Obj]:
        return [
            slice_object(
                driver=driver,
                node_name=node,
                node_uid=node_uid,
                index=i,
                generation=gen,
                count=n,
                content=c,
            )
            for i, c in enumerate(contents)
        ]

    want = desired(current)
    stale = [i for i in existing if not up_to_date(existing[i], want[i])]
    missing = [i for i in range(n) if i not in existing]
    if not stale and not missing and not obsolete:
        return SyncPlan(current, n)
    if (
        not missing
        and not obsolete
        and len(stale) == 1
        and gens == {current}
        and device_names(existing[stale[0]]) == device_names(want[stale[0]])
    ):
        to_update = stale
    else:
        current += 1
        want = desired(current)
        to_update = sorted(existing)
    for i in to_update:
        want[i]["metadata"]["resourceVersion"] = existing[i]["metadata"]["resourceVersion"]
    return SyncPlan(
        current,
        n,
        delete=tuple(obsolete),
        update=tuple(want[i] for i in to_update),
        create=tuple(want[i] for i in missing),
    )


def dropped_fields(sent: Any, stored: Any, path: str = "") -> set[str]:
    """Paths (list indices shown as ``[]``) present in ``sent`` but absent in ``stored``."""
    out: set[str] = set()
    if isinstance(sent, dict) and isinstance(stored, dict):
        for key, value in sent.items():
            sub = f"{path}.{key}" if path else key
            if key not in stored:
                out.add(sub)
            else:
                out |= dropped_fields(value, stored[key], sub)
    elif isinstance(sent, list) and isinstance(stored, list):
        for a, b in zip(sent, stored, strict=False):
            out |= dropped_fields(a, b, f"{path}[]")
        if len(stored) < len(sent):
            out.add(f"{path}[]")
    return out


def has_list_attributes(obj: Obj) -> bool:
    lists = ("ints", "bools", "strings", "versions")
    return any(
        key in value
        for d in obj.get("spec", {}).get("devices") or []
        for value in (d.get("attributes") or {}).values()
        for key in lists
    )
