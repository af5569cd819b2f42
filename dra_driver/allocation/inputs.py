"""Turn a mix of Kubernetes objects (in the order given) into an inventory and workloads.

Accepted kinds: ResourceSlice, Node, DeviceClass, ResourceClaim,
ResourceClaimTemplate, Pod, and Lists of them. Claims a pod uses are allocated
when the pod comes, together with the pod's other claims; other unallocated
claims at their own position. A template claim is named ``<pod>-<claim>``
(the controller adds a random suffix). Without Node objects, nodes are implied
by the slices' ``nodeName``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dra_driver.allocation.model import (
    Claim,
    DeviceClass,
    ModelError,
    Node,
    Slice,
    parse_claim,
    parse_claim_spec,
    parse_device_class,
    parse_node,
    parse_slice,
)
from dra_driver.allocation.simulation import Workload

KINDS = ("ResourceSlice", "Node", "DeviceClass", "ResourceClaim", "ResourceClaimTemplate", "Pod")


@dataclass
class Inputs:
    slices: list[Slice] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    classes: dict[str, DeviceClass] = field(default_factory=dict)
    claims: list[Claim] = field(default_factory=list)
    """Every claim, in order, including already allocated ones (they hold devices)."""
    workloads: list[Workload] = field(default_factory=list)

    def implied_nodes(self) -> list[Node]:
        if self.nodes:
            return self.nodes
        names = {s.node_name for s in self.slices if s.node_name}
        names |= {d.node_name for s in self.slices for d in s.devices if d.node_name}
        return [Node(n, {"kubernetes.io/hostname": n}) for n in sorted(names)]


def flatten(objects: Iterable[Any]) -> list[Mapping[str, Any]]:
    out: list[Mapping[str, Any]] = []
    for obj in objects:
        if obj is None:
            continue
        if not isinstance(obj, Mapping):
            raise ModelError(f"expected a Kubernetes object (a mapping), got {type(obj).__name__}")
        kind = obj.get("kind", "")
        if isinstance(kind, str) and kind.endswith("List") and "items" in obj:
            item_kind = kind.removesuffix("List")
            out.extend(
                flatten({"kind": item_kind, **i} if item_kind in KINDS else i for i in obj["items"])
            )
        else:
            out.append(obj)
    return out


def build(objects: Iterable[Any], default_namespace: str = "default") -> Inputs:
    items = flatten(objects)
    inputs = Inputs()
    templates: dict[tuple[str, str], Mapping[str, Any]] = {}
    claims: dict[tuple[str, str], Claim] = {}
    order: list[tuple[str, Any]] = []
    used_by_pods: set[tuple[str, str]] = set()
    for obj in items:
        kind = obj.get("kind")
        meta = obj.get("metadata") or {}
        ns = str(meta.get("namespace") or default_namespace)
        if kind == "ResourceSlice":
            inputs.slices.append(parse_slice(obj))
        elif kind == "Node":
            inputs.nodes.append(parse_node(obj))
        elif kind == "DeviceClass":
            cls = parse_device_class(obj)
            inputs.classes[cls.name] = cls
        elif kind == "ResourceClaim":
            claim = parse_claim({**obj, "metadata": {**meta, "namespace": ns}})
            claims[(ns, claim.name)] = claim
            inputs.claims.append(claim)
            order.append(("claim", claim))
        elif kind == "ResourceClaimTemplate":
            templates[(ns, str(meta.get("name", "")))] = obj
        elif kind == "Pod":
            order.append(("pod", obj))
            for ref in (obj.get("spec") or {}).get("resourceClaims") or ():
                if ref.get("resourceClaimName"):
                    used_by_pods.add((ns, str(ref["resourceClaimName"])))
        else:
            raise ModelError(
                f"unsupported object kind {kind!r} ({meta.get('name', '?')}); "
                f"accepted: {', '.join(KINDS)} and Lists of them"
            )
    for what, item in order:
        if what == "claim":
            if item.allocated is None and (item.namespace, item.name) not in used_by_pods:
                inputs.workloads.append(Workload([item]))
            continue
        inputs.workloads.append(_pod_workload(item, claims, templates, inputs, default_namespace))
    return inputs


def _pod_workload(
    pod: Mapping[str, Any],
    claims: Mapping[tuple[str, str], Claim],
    templates: Mapping[tuple[str, str], Mapping[str, Any]],
    inputs: Inputs,
    default_namespace: str,
) -> Workload:
    meta = pod.get("metadata") or {}
    ns = str(meta.get("namespace") or default_namespace)
    name = str(meta.get("name", ""))
    spec = pod.get("spec") or {}
    workload = Workload(
        claims=[],
        pod=name,
        node_name=str(spec.get("nodeName") or ""),
        node_selector=dict(spec.get("nodeSelector") or {}),
        node_affinity=(spec.get("affinity") or {}).get("nodeAffinity"),
    )
    for ref in spec.get("resourceClaims") or ():
        if ref.get("resourceClaimName"):
            claim = claims.get((ns, str(ref["resourceClaimName"])))
            if claim is None:
                raise ModelError(
                    f"Pod {ns}/{name}: resourceClaimName {ref['resourceClaimName']!r} "
                    "is not among the given ResourceClaims"
                )
        elif ref.get("resourceClaimTemplateName"):
            template = templates.get((ns, str(ref["resourceClaimTemplateName"])))
            if template is None:
                raise ModelError(
                    f"Pod {ns}/{name}: resourceClaimTemplateName "
                    f"{ref['resourceClaimTemplateName']!r} is not among the given templates"
                )
            claim = parse_claim_spec(
                ns, f"{name}-{ref.get('name', '')}", (template.get("spec") or {}).get("spec") or {}
            )
            inputs.claims.append(claim)
        else:
            raise ModelError(f"Pod {ns}/{name}: resourceClaims entry without a claim or template")
        if claim.allocated is not None:
            workload.pinned_node = claim.allocated_node or workload.pinned_node
        elif claim not in workload.claims:
            workload.claims.append(claim)
    return workload
