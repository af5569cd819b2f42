"""Why a claim gets these devices, or why it stays pending: per node, request and device.

The verdict per node comes from the allocator itself (the same search the
scheduler runs). The explanation beside it checks every device on its own, in
the scheduler's order of checks, and names the first thing that rules it out:
a pool that is incomplete or invalid, the device being in use, a selector
that is false or fails (with the CEL error and a fix), per-device node
selection, capacity, counters, a taint. When enough devices qualify one by
one but no combination does, it says which constraint or counter is the
obstacle.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from dra_driver.allocation import capacity as cap
from dra_driver.allocation.allocator import Attempt, Choice
from dra_driver.allocation.constraints import lookup_attribute, taint_blocks
from dra_driver.allocation.inventory import AllocationFailed, Inventory
from dra_driver.allocation.model import Claim, Device, DeviceId, Node, Request
from dra_driver.allocation.pools import Pool, device_on_node
from dra_driver.allocation.state import AllocatedState
from dra_driver.cel import CelCompileError, CelError

_ATTR_REF = re.compile(r"""device\.attributes\[\s*["']([^"']+)["']\s*\]\s*\.\s*(\w+)""")


@dataclass
class DeviceVerdict:
    device: str
    qualifies: bool
    reason: str = ""
    fix: str = ""


@dataclass
class RequestReport:
    name: str
    wanted: str
    verdicts: list[DeviceVerdict] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)

    @property
    def qualifying(self) -> int:
        return sum(v.qualifies for v in self.verdicts)


@dataclass
class NodeReport:
    node: str
    fits: bool
    summary: str
    devices: dict[str, list[str]] = field(default_factory=dict)
    pools: list[str] = field(default_factory=list)
    requests: list[RequestReport] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "fits": self.fits,
            "summary": self.summary,
            "devices": self.devices,
            "pools": self.pools,
            "hints": self.hints,
            "requests": [
                {
                    "name": r.name,
                    "wanted": r.wanted,
                    "qualifying": r.qualifying,
                    "hints": r.hints,
                    "devices": [v.__dict__ for v in r.verdicts],
                }
                for r in self.requests
            ],
        }


def suggest_fix(expression: str, error: CelError, device: Device, driver: str) -> str:
    """A concrete change to the selector for the common CEL mistakes."""
    text = str(error)
    missing = re.search(r"no such key: (\S+)", text)
    if missing:
        key = missing.group(1)
        for domain, ident in _ATTR_REF.findall(expression):
            if ident != key:
                continue
            elsewhere = [
                name for name in (device.raw.get("attributes") or {}) if name.split("/")[-1] == key
            ]
            qualified = [n for n in elsewhere if "/" in n and n.split("/")[0] != domain]
            if qualified:
                dom = qualified[0].split("/")[0]
                return (
                    f"the attribute is published as {qualified[0]}: use "
                    f'device.attributes["{dom}"].{key}'
                )
            ref = f'device.attributes["{domain}"].{key}'
            return (
                f"not every device has {domain}/{key}: guard the lookup, "
                f'has({ref}) && ..., or use device.attributes["{domain}"].?{key}.orValue(...)'
            )
    if "kubernetes.Quantity" in text or re.search(r"capacity\[[^]]+\]\.\w+\s*[<>=!]=?", expression):
        return 'compare quantities with compareTo: ...memory.compareTo(quantity("40Gi")) >= 0'
    if "kubernetes.Semver" in text or ("no such overload" in text and "version" in expression):
        return 'compare versions as semvers: ...isGreaterThan(semver("9.0.0"))'
    if "no such overload" in text:
        return "the two sides have different types; check the attribute's type in the slice"
    if isinstance(error, CelCompileError):
        return "the expression does not compile in the scheduler's CEL environment"
    return ""


class Explainer:
    def __init__(self, inventory: Inventory, state: AllocatedState) -> None:
        self.inv = inventory
        self.state = state

    def node(self, node: Node, claims: list[Claim], target: Claim) -> NodeReport:
        """Explain ``target`` (one of ``claims``, allocated together) on ``node``."""
        try:
            result = Attempt(self.inv, self.state, node, claims).run()
        except AllocationFailed as err:
            report = NodeReport(
                node.name, False, f"error (the scheduler aborts the attempt): {err}"
            )
            result = None
        else:
            if result is None:
                report = NodeReport(node.name, False, "does not fit")
            else:
                chosen: list[Choice] = result[claims.index(target)]
                devices: dict[str, list[str]] = {}
                for c in chosen:
                    devices.setdefault(c.request.result_name, []).append(c.device_id.device)
                report = NodeReport(node.name, True, "fits", devices)
        pools = self.inv.pools(node)
        for p in pools:
            state = "incomplete (being republished)" if p.incomplete else p.invalid or "ok"
            report.pools.append(f"{p.id}: {state}")
        if not pools:
            report.hints.append("no ResourceSlice targets this node")
        for alternatives in target.requests:
            for request in alternatives:
                report.requests.append(self._request(node, pools, target, request))
        if not report.fits and result is None and "error" not in report.summary:
            report.hints += self._combination_hints(report, target)
        return report

    def _request(
        self, node: Node, pools: list[Pool], claim: Claim, request: Request
    ) -> RequestReport:
        wanted = "all matching devices" if request.all_devices else f"{request.count} device(s)"
        report = RequestReport(request.result_name, f"{wanted} of class {request.device_class}")
        cls = self.inv.classes.get(request.device_class)
        if cls is None:
            report.hints.append(f"device class {request.device_class} does not exist")
            return report
        for pool in pools:
            for slice_ in pool.slices:
                for device in slice_.devices:
                    verdict = self._device(
                        node,
                        pool,
                        slice_.per_device_node_selection,
                        claim,
                        request,
                        cls.name,
                        cls.selectors,
                        device,
                    )
                    report.verdicts.append(verdict)
        report.hints += self._value_hints(request, cls.selectors, pools)
        return report

    def _device(
        self,
        node: Node,
        pool: Pool,
        per_device: bool,
        claim: Claim,
        request: Request,
        cls_name: str,
        cls_selectors: tuple[str, ...],
        device: Device,
    ) -> DeviceVerdict:
        name = device.name
        if pool.incomplete:
            return DeviceVerdict(name, False, f"pool {pool.id} is incomplete")
        if pool.invalid:
            return DeviceVerdict(name, False, f"pool {pool.id} is invalid: {pool.invalid}")
        device_id = DeviceId(pool.driver, pool.name, name)
        holder = self.state.in_use.get(device_id)
        if holder and holder != claim.key and not request.admin_access:
            return DeviceVerdict(name, False, f"in use by claim {holder}")
        for owner, selectors in (
            (f"class {cls_name}", cls_selectors),
            ("claim", request.selectors),
        ):
            failing = self.inv.first_failing_selector(owner, selectors, pool.driver, device)
            if failing is None:
                continue
            index, outcome = failing
            expr = selectors[index]
            if isinstance(outcome, CelError):
                kind = "compile" if isinstance(outcome, CelCompileError) else "runtime"
                return DeviceVerdict(
                    name,
                    False,
                    f"{owner} selector #{index} fails (CEL {kind} error: {outcome}); "
                    "the scheduler aborts the whole attempt on this",
                    suggest_fix(expr, outcome, device, pool.driver),
                )
            return DeviceVerdict(name, False, f"{owner} selector #{index} is false: {expr}")
        if per_device and not device_on_node(device, node):
            return DeviceVerdict(name, False, "the device is not available on this node")
        if request.capacity and any(k not in device.capacity for k in request.capacity):
            missing = [k for k in request.capacity if k not in device.capacity]
            return DeviceVerdict(name, False, f"has no capacity {', '.join(missing)}")
        used = self.state.shared_capacity(device_id)
        if not cap.fits(request.capacity, device.capacity, used):
            free = {
                k: str(c.value.value - used.get(k, Fraction(0))) for k, c in device.capacity.items()
            }
            return DeviceVerdict(name, False, f"not enough capacity left (free: {free})")
        short = self._counters_short(pool, device)
        if short:
            return DeviceVerdict(name, False, short)
        if taint_blocks(device, request):
            taints = ", ".join(
                f"{t.key}={t.value}:{t.effect}" for t in device.taints if t.effect != "None"
            )
            return DeviceVerdict(
                name,
                False,
                f"tainted {taints}, not tolerated",
                "add a matching toleration to the request",
            )
        return DeviceVerdict(name, True, "qualifies")

    def _counters_short(self, pool: Pool, device: Device) -> str:
        if not device.consumes:
            return ""
        left: dict[str, dict[str, Fraction]] = {
            s: {c: q.value for c, q in counters.items()}
            for s, counters in pool.counter_sets.items()
        }
        for s in pool.slices + pool.other_slices:
            for d in s.devices:
                if self.state.allocated(DeviceId(pool.driver, pool.name, d.name)):
                    for set_name, counters in d.consumes.items():
                        for c, q in counters.items():
                            left[set_name][c] -= q.value
        for set_name, counters in device.consumes.items():
            for c, q in counters.items():
                if left[set_name][c] < q.value:
                    return (
                        f"counter {set_name}/{c}: needs {q}, {left[set_name][c]} left "
                        "(taken by allocated partitions of the same device)"
                    )
        return ""

    def _value_hints(
        self, request: Request, cls_selectors: tuple[str, ...], pools: list[Pool]
    ) -> list[str]:
        hints = []
        for expr in (*cls_selectors, *request.selectors):
            for domain, ident in _ATTR_REF.findall(expr):
                values: Counter[str] = Counter()
                for pool in pools:
                    for s in pool.slices:
                        for d in s.devices:
                            v = lookup_attribute(d, pool.driver, f"{domain}/{ident}")
                            if v is not None:
                                values[str(next(iter(v.values())))] += 1
                if values:
                    shown = ", ".join(f"{v} ({n})" for v, n in values.most_common(6))
                    hints.append(f"{domain}/{ident} on this node: {shown}")
                else:
                    hints.append(f"no device on this node has {domain}/{ident}")
        return sorted(set(hints))

    def _constraint_values(self, report: NodeReport, claim: Claim, constraint: Any) -> str:
        qualifying = {
            v.device for r in report.requests for v in r.verdicts if v.qualifies
            if constraint.applies(self._request_named(claim, r.name))
        }  # fmt: skip
        attribute = constraint.match_attribute or constraint.distinct_attribute
        values: Counter[str] = Counter()
        for pool in self.inv.pools(Node(report.node)):
            for s in pool.slices:
                for d in s.devices:
                    if d.name in qualifying:
                        v = lookup_attribute(d, pool.driver, attribute)
                        if v is not None:
                            values[str(next(iter(v.values())))] += 1
        return ", ".join(f"{v} ({n} devices)" for v, n in values.most_common(8))

    @staticmethod
    def _request_named(claim: Claim, name: str) -> Request:
        return next(x for a in claim.requests for x in a if x.result_name == name)

    def _combination_hints(self, report: NodeReport, claim: Claim) -> list[str]:
        hints = []
        for r in report.requests:
            alternatives = next(
                a for a in claim.requests if any(x.result_name == r.name for x in a)
            )
            request = next(x for x in alternatives if x.result_name == r.name)
            if not request.all_devices and r.qualifying < request.count:
                hints.append(
                    f"request {r.name}: {r.qualifying} device(s) qualify, {request.count} needed"
                )
        if hints:
            return hints
        for constraint in claim.constraints:
            attribute = constraint.match_attribute or constraint.distinct_attribute
            kind = "matchAttribute" if constraint.match_attribute else "distinctAttribute"
            among = ", ".join(sorted(constraint.requests)) or "all"
            values = self._constraint_values(report, claim, constraint)
            hints.append(
                f"enough devices qualify one by one, but {kind} {attribute} "
                f"(requests: {among}) rules out every combination; values among the "
                f"qualifying devices: {values or 'none have the attribute'}"
            )
        if not hints:
            hints.append(
                "enough devices qualify one by one, but not together: shared counters or "
                "capacity run out, or the requests compete for the same devices"
            )
        return hints
