"""A seeded random corpus of DRA inventories and claims for the differential test.

Each scenario is one node with its own pools (so scenarios never compete)
and one or two phases of pods pinned to it. Together the scenarios cover
every allocator feature and the tricky CEL cases: several slices per pool,
incomplete pools, superseded generations, invalid pools, taints, counters,
shared devices with capacity policies, admin access, ExactCount/All,
firstAvailable, match/distinctAttribute, cross-type numerics, int vs uint,
quantities, semvers, missing domains and selectors that error on some devices.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

DRIVER = "gpu.example.com"
OTHER = "nic.example.com"
NAMESPACE_LABEL = {"resource.kubernetes.io/admin-access": "true"}


def a(name: str) -> str:
    return f'device.attributes["{DRIVER}"].{name}'


def c(name: str) -> str:
    return f'device.capacity["{DRIVER}"].{name}'


CLASSES: dict[str, str] = {
    "any": f'device.driver == "{DRIVER}"',
    "model-a": f'device.driver == "{DRIVER}" && {a("model")} == "a"',
    "fast": f'device.driver == "{DRIVER}" && {a("index")} < 2.5',
    "nic": f'device.driver == "{OTHER}"',
    "unguarded": f'{a("profile")} != "forbidden"',
}

SELECTORS: list[str] = [
    f'{a("model")} == "b"',
    f'{a("model")} in ["a", "c"]',
    f"{a('numa')} == 1",
    f"{a('index')} >= 2",
    f"{a('index')} == 1u",  # int attribute vs uint literal: true where index is 1
    f"{a('index')} < 1.5",  # cross-type numeric comparison
    f'{c("memory")}.compareTo(quantity("40Gi")) >= 0',
    f'{c("memory")}.isLessThan(quantity("30Gi"))',
    f'{a("cc")}.isGreaterThan(semver("8.0.0"))',
    f"{a('cc')}.major() == 9",
    f"{a('flag')}",
    f'has({a("profile")}) && {a("profile")}.startsWith("1g")',
    f'{a("profile")} == "2g"',  # unguarded: a runtime error on devices without profile
    'has(device.attributes["other.example.com"].x)',  # missing domain: false, no error
    '"other.example.com" in device.attributes || true',
    'device.attributes["resource.kubernetes.io"].pcieRoot == "pci0"',
    f'{a("model")}.lowerAscii() != "z" && size({a("model")}) == 1',
    f'cel.bind(m, {a("model")}, m == "a" || m == "c")',
    f'{c("memory")}.compareTo(quantity("1Gi")) > 0 && {a("index")} % 2 == 0',
]

MODELS = ["a", "b", "c"]
MEMORY = ["16Gi", "24Gi", "40Gi", "80Gi"]
VERSIONS = ["7.5.0", "8.0.0", "8.6.0", "9.0.0"]


@dataclass
class Scenario:
    index: int
    node: str
    slices: list[dict[str, Any]] = field(default_factory=list)
    phases: list[list[dict[str, Any]]] = field(default_factory=list)
    """Objects (ResourceClaims then Pods) created per phase, in order."""


class Generator:
    def __init__(self, seed: int, namespace: str, suffix: str) -> None:
        self.rng = random.Random(seed)
        self.namespace = namespace
        self.suffix = suffix

    def device(self, i: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        r = self.rng
        attrs: dict[str, Any] = {
            "model": {"string": r.choice(MODELS)},
            "numa": {"int": r.randint(0, 1)},
            "index": {"int": i},
            "cc": {"version": r.choice(VERSIONS)},
            "flag": {"bool": r.random() < 0.5},
        }
        if r.random() < 0.3:
            attrs["profile"] = {"string": r.choice(["1g", "2g", "3g"])}
        if r.random() < 0.3:
            attrs["resource.kubernetes.io/pcieRoot"] = {"string": r.choice(["pci0", "pci1"])}
        dev: dict[str, Any] = {
            "name": f"dev-{i}",
            "attributes": attrs,
            "capacity": {"memory": {"value": r.choice(MEMORY)}},
        }
        if r.random() < 0.15:
            dev["taints"] = [
                {"key": "health", "value": r.choice(["bad", "flaky"]),
                 "effect": r.choice(["NoSchedule", "NoExecute", "None"])}
            ]  # fmt: skip
        dev.update(extra or {})
        return dev

    def scenario(self, index: int) -> Scenario:
        r = self.rng
        node = f"diff-{index:03d}-{self.suffix}"
        sc = Scenario(index, node)
        kind = r.choices(
            ["plain", "multi-slice", "incomplete", "generations", "counters", "shared",
             "two-drivers", "invalid"],
            weights=[30, 15, 5, 5, 15, 12, 12, 3],
        )[0]  # fmt: skip
        pool = node
        ndev = r.randint(2, 8)
        if kind in ("multi-slice", "incomplete", "invalid"):
            nslices = r.randint(2, 3)
            per = [list(range(k * 8, k * 8 + r.randint(1, 4))) for k in range(nslices)]
            if kind == "invalid":
                per[1][0] = per[0][0]  # duplicate device name in the pool
            published = nslices - 1 if kind == "incomplete" else nslices
            for k in range(published):
                sc.slices.append(
                    self.slice(node, pool, f"{k:02d}", [self.device(i) for i in per[k]], 1, nslices)
                )
        elif kind == "generations":
            sc.slices.append(
                self.slice(node, pool, "old", [self.device(i) for i in range(ndev)], 1, 1)
            )
            sc.slices.append(
                self.slice(node, pool, "new", [self.device(i + 10) for i in range(ndev)], 2, 1)
            )
        elif kind == "counters":
            gpus = r.randint(1, 2)
            counters = {"mem": {"value": "40Gi"}, "slots": {"value": "7"}}
            sets = [{"name": f"gpu-{g}", "counters": counters} for g in range(gpus)]
            devices = []
            i = 0
            for g in range(gpus):
                for size, slots in (
                    ("full", 7),
                    ("half", 3),
                    ("half", 3),
                    ("small", 1),
                    ("small", 1),
                ):
                    mem = {"full": "40Gi", "half": "20Gi", "small": "10Gi"}[size]
                    devices.append(self.device(i, {
                        "consumesCounters": [{"counterSet": f"gpu-{g}", "counters": {
                            "mem": {"value": mem}, "slots": {"value": str(slots)}}}],
                    }))  # fmt: skip
                    devices[-1]["attributes"]["size"] = {"string": size}
                    i += 1
            counter_slice = self.slice(node, pool, "00", [], 1, 2)
            counter_slice["spec"]["sharedCounters"] = sets
            del counter_slice["spec"]["devices"]
            sc.slices += [counter_slice, self.slice(node, pool, "01", devices, 1, 2)]
        elif kind == "shared":
            devices = [self.device(i) for i in range(ndev)]
            for d in devices[: r.randint(1, len(devices))]:
                d["allowMultipleAllocations"] = True
                d["capacity"]["memory"]["requestPolicy"] = r.choice([
                    {"default": "10Gi", "validRange": {"min": "10Gi", "step": "10Gi"}},
                    {"default": "8Gi", "validValues": ["8Gi", "16Gi", "32Gi"]},
                    {"default": "4Gi", "validRange": {"min": "4Gi", "max": "20Gi"}},
                ])  # fmt: skip
                d["capacity"]["memory"]["value"] = "80Gi"
            sc.slices.append(self.slice(node, pool, "00", devices, 1, 1))
        else:
            sc.slices.append(
                self.slice(node, pool, "00", [self.device(i) for i in range(ndev)], 1, 1)
            )
            if kind == "two-drivers":
                nics = [{"name": f"nic-{i}", "attributes": {
                    "numa": {"int": r.randint(0, 1)},
                    f"{DRIVER}/numa": {"int": r.randint(0, 1)},
                }} for i in range(r.randint(1, 3))]  # fmt: skip
                sc.slices.append(self.slice(node, pool, "00", nics, 1, 1, driver=OTHER))
        for phase in range(r.choice([1, 1, 2])):
            objs: list[dict[str, Any]] = []
            for p in range(r.randint(1, 2)):
                claims = [
                    self.claim(f"{node}-p{phase}-{p}-c{k}", kind)
                    for k in range(r.choice([1, 1, 2]))
                ]
                objs += claims
                objs.append(
                    self.pod(f"{node}-p{phase}-{p}", node, [x["metadata"]["name"] for x in claims])
                )
            sc.phases.append(objs)
        return sc

    def slice(
        self,
        node: str,
        pool: str,
        tag: str,
        devices: list[dict[str, Any]],
        gen: int,
        count: int,
        driver: str = DRIVER,
    ) -> dict[str, Any]:
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{driver.split('.')[0]}-{tag}"},
            "spec": {
                "driver": driver,
                "nodeName": node,
                "pool": {"name": pool, "generation": gen, "resourceSliceCount": count},
                "devices": devices,
            },
        }

    def request_body(self, kind: str, sub: bool) -> dict[str, Any]:
        r = self.rng
        cls = r.choices(["any", "model-a", "fast", "unguarded"], weights=[75, 10, 10, 2])[0]
        body: dict[str, Any] = {"deviceClassName": f"diff-{cls}"}
        if r.random() < 0.5:
            body["selectors"] = [
                {"cel": {"expression": s}} for s in r.sample(SELECTORS, r.choice([1, 1, 2]))
            ]
        if not sub and r.random() < 0.12:
            body["allocationMode"] = "All"
        elif r.random() < 0.3:
            body["count"] = r.randint(2, 3)
        if not sub and r.random() < 0.06:
            body["adminAccess"] = True
        if r.random() < 0.2:
            body["tolerations"] = [r.choice([
                # An empty effect would also tolerate NoExecute for the scheduler, but the
                # device-taint-eviction controller then evicts the pod (simulate warns).
                {"key": "health", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "health", "operator": "Equal", "value": "flaky", "effect": "NoSchedule"},
                {"operator": "Exists", "effect": "NoExecute"},
            ])]  # fmt: skip
        if kind == "shared" and r.random() < 0.7:
            body["capacity"] = {"requests": {"memory": r.choice(["5Gi", "10Gi", "15Gi", "30Gi"])}}
        elif r.random() < 0.05:
            body["capacity"] = {"requests": {"memory": "30Gi"}}
        if kind == "counters" and r.random() < 0.6:
            size = r.choice(["full", "half", "small"])
            body.setdefault("selectors", []).append(
                {"cel": {"expression": f'{a("size")} == "{size}"'}}
            )
        return body

    def claim(self, name: str, kind: str) -> dict[str, Any]:
        r = self.rng
        requests = []
        for k in range(r.choice([1, 1, 1, 1, 2, 3])):
            if r.random() < 0.2:
                subs = [
                    {"name": f"s{j}", **self.request_body(kind, True)}
                    for j in range(r.randint(2, 3))
                ]
                requests.append({"name": f"r{k}", "firstAvailable": subs})
            else:
                requests.append({"name": f"r{k}", "exactly": self.request_body(kind, False)})
        if kind == "two-drivers" and r.random() < 0.5:
            requests.append({"name": "nic", "exactly": {"deviceClassName": "diff-nic"}})
        spec: dict[str, Any] = {"devices": {"requests": requests}}
        if r.random() < 0.25:
            attribute = r.choice(
                [f"{DRIVER}/numa", f"{DRIVER}/model", "resource.kubernetes.io/pcieRoot"]
            )
            constraint: dict[str, Any] = {
                r.choice(["matchAttribute", "matchAttribute", "distinctAttribute"]): attribute
            }
            if len(requests) > 1 and r.random() < 0.5:
                constraint["requests"] = [x["name"] for x in r.sample(requests, 2)]
            spec["devices"]["constraints"] = [constraint]
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": spec,
        }

    def pod(self, name: str, node: str, claims: list[str]) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node},
                "resourceClaims": [
                    {"name": f"c{i}", "resourceClaimName": n} for i, n in enumerate(claims)
                ],
                "containers": [{
                    "name": "main", "image": "registry.invalid/pause:1",
                    "resources": {"claims": [{"name": f"c{i}"} for i in range(len(claims))]},
                }],
                "terminationGracePeriodSeconds": 0,
            },
        }  # fmt: skip


def device_classes() -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": f"diff-{name}"},
            "spec": {"selectors": [{"cel": {"expression": expr}}]},
        }
        for name, expr in CLASSES.items()
    ]
