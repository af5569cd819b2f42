"""Pods and their claims, written as users write them: CPU and memory requests, and a
claim from a ResourceClaimTemplate (one template per distinct request), or, with
time-slicing, a ResourceClaim that several pods share.

================  ===========================================================================
``whole``         ``count: N`` GPUs; a share is rounded up to one whole GPU
``consumable``    a share asks ``computeShare`` = ``gpu_milli / 10`` percent (rounded up) and
                  ``memory``; whole-GPU pods ask ``count: N`` with no capacity request, which
                  on a consumable GPU takes all of it (docs/sharing.md)
``slots``         a share takes the k slots that cover it: k requests of one slot each (a
                  request without capacity gets one slot), held on one GPU by a
                  ``matchAttribute`` on ``uuid``; N whole GPUs are N groups of all slots
``time-slicing``  shares fill shared claims of one whole GPU each, in draw order, first fit,
                  up to 1000 thousandths per claim; the pod names the claim, whose config
                  asks ``sharing.strategy: TimeSlicing``; whole-GPU pods as ``whole``
``mig``           a share asks the smallest MIG profile that covers its fraction of the
                  GPU's memory and SMs (class ``mig.nvidia.com``, a selector on
                  ``profile``); N whole GPUs ask ``count: N`` of ``gpu.nvidia.com``
================  ===========================================================================

``gpu_spec`` becomes a CEL selector on ``productName``. Memory of a consumable share: a
capacity request is an absolute quantity, so one claim cannot ask for "47 % of whichever
GPU it lands on" on a fleet of GPUs of different sizes. A share asks ``gpu_milli / 1000``
of the SMALLEST memory among the GPU models it may use (rounded down to 1Mi, so shares
summing to one GPU fit), and ``computeShare`` is what bounds the packing. (One
``firstAvailable`` alternative per model would ask the exact fraction, but v1.37's
``DynamicResources`` scorer prefers nodes that satisfy earlier alternatives, which would
steer shares to the model listed first.) With ``slots``, a pod whose models have
different slot counts takes the count of the most models and is held to them by the
selector; with ``mig``, the profile that covers the share on each of its models.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dra_driver.workload.modes import GpuModel, Mode, may_use, slots_of
from dra_driver.workload.pools import DRIVER
from dra_driver.workload.trace import TracePod

Obj = dict[str, Any]
GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
MIB = 1 << 20
ANNOTATION = "trace-replay.dra.example"
"""Prefix of the annotations that carry a pod's trace row and request onto the API."""
CONFIG_API = "resource.nvidia.com/v1beta1"
FULL = 1000


@dataclass(frozen=True)
class ClaimRef:
    """Which claim a pod uses: a template's (one claim per pod) or a shared claim."""

    name: str
    shared: bool = False


class Claims:
    """The claim specs of one replay: templates, deduplicated by request, and the shared
    claims of ``time-slicing``."""

    def __init__(self, mode: Mode, models: Mapping[str, GpuModel]) -> None:
        self.mode = mode
        self.models = dict(models)
        self.templates: dict[str, Obj] = {}
        """Template name -> ``ResourceClaim.spec``."""
        self.shared: dict[str, Obj] = {}
        """``time-slicing``: shared claim name -> ``ResourceClaim.spec``."""
        self._names: dict[str, str] = {}
        self._open: list[tuple[str, tuple[str, ...], int]] = []
        """``time-slicing``: shared claims with room, (name, gpu_spec, thousandths held)."""

    def _codes(self, pod: TracePod) -> list[str]:
        return [c for c in sorted(self.models) if may_use(pod, c)]

    def _selector(self, codes: list[str] | None) -> str | None:
        if codes is None:
            return None
        names = sorted({self.models[c].product_name for c in codes})
        listed = ", ".join(f"'{n}'" for n in names)
        return f"device.attributes['{DRIVER}'].productName in [{listed}]"

    def _spec_codes(self, pod: TracePod) -> list[str] | None:
        """The models a selector must name: None when the pod may use any."""
        return self._codes(pod) if pod.gpu_spec else None

    def _memory_mib(self, pod: TracePod) -> int:
        codes = self._codes(pod) or list(self.models)
        smallest = min((self.models[c].memory_bytes for c in codes), default=0)
        return max(1, smallest * pod.gpu_milli // 1000 // MIB)

    def spec(self, pod: TracePod) -> Obj:
        """``ResourceClaim.spec`` of a GPU pod."""
        if self.mode == "slots":
            return self._slot_spec(pod)
        if self.mode == "mig" and pod.is_share:
            return self._mig_spec(pod)
        exactly: Obj = {"deviceClassName": GPU_CLASS}
        if self.mode == "consumable" and pod.is_share:
            exactly["capacity"] = {
                "requests": {
                    "memory": f"{self._memory_mib(pod)}Mi",
                    "computeShare": str(math.ceil(pod.gpu_milli / 10)),
                }
            }
        elif pod.num_gpu > 1:
            exactly["count"] = pod.num_gpu
        selector = self._selector(self._spec_codes(pod))
        if selector:
            exactly["selectors"] = [{"cel": {"expression": selector}}]
        spec: Obj = {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}
        if self.mode == "time-slicing" and pod.is_share:
            spec["devices"]["config"] = [_time_slicing_config()]
        return spec

    def _by_majority(self, pod: TracePod, key: Any) -> tuple[Any, list[str] | None]:
        """The value of ``key(model)`` most of the pod's models share, and the models a
        selector must then name (None: all models agree and the pod may use any)."""
        codes = self._codes(pod)
        if not codes:
            raise ValueError(f"pod {pod.name}: no GPU model of the cluster in its gpu_spec")
        votes = Counter(key(self.models[c]) for c in codes)
        value = max(votes, key=lambda v: (votes[v], str(v)))
        chosen = [c for c in codes if key(self.models[c]) == value]
        return value, None if (len(chosen) == len(self.models) and not pod.gpu_spec) else chosen

    def _slot_spec(self, pod: TracePod) -> Obj:
        n, codes = self._by_majority(pod, lambda m: m.slots)
        if not n:
            raise ValueError(f"pod {pod.name}: its GPU models are not split into slots")
        selectors = [f"device.attributes['{DRIVER}'].mpsSlots == {n}"]
        if codes is not None:
            selectors.append(str(self._selector(codes)))
        exactly = {
            "deviceClassName": GPU_CLASS,
            "selectors": [{"cel": {"expression": s}} for s in selectors],
        }
        groups = [slots_of(pod.gpu_milli, n)] if pod.is_share else [n] * pod.num_gpu
        requests, constraints = [], []
        for g, size in enumerate(groups):
            names = [f"g{g}s{s}" for s in range(size)]
            requests += [{"name": name, "exactly": exactly} for name in names]
            if size > 1:
                constraints.append({"requests": names, "matchAttribute": f"{DRIVER}/uuid"})
        devices: Obj = {"requests": requests}
        if constraints:
            devices["constraints"] = constraints
        return {"devices": devices}

    def mig_profile(self, pod: TracePod) -> str:
        """The smallest profile covering the share on every model it may land on (the
        profile names are the same on A100 and H100 80GB; their fractions differ)."""
        need = pod.gpu_milli / FULL
        chosen = ""
        for code in self._codes(pod):
            profiles = self.models[code].mig_profiles
            order = [p.name for p in profiles]
            fits = [p.name for p in profiles if p.memory >= need and p.compute >= need]
            if fits and (not chosen or order.index(fits[0]) > order.index(chosen)):
                chosen = fits[0]
        return chosen

    def _mig_spec(self, pod: TracePod) -> Obj:
        chosen = self.mig_profile(pod)
        selectors = [f"device.attributes['{DRIVER}'].profile == '{chosen}'"]
        selector = self._selector(self._spec_codes(pod))
        if selector:
            selectors.append(selector)
        exactly = {
            "deviceClassName": MIG_CLASS,
            "selectors": [{"cel": {"expression": s}} for s in selectors],
        }
        return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}

    def claim_for(self, pod: TracePod) -> ClaimRef:
        """The claim ``pod`` uses (a template registered, or a shared claim filled, on
        first use)."""
        if self.mode == "time-slicing" and pod.is_share:
            return ClaimRef(self._shared_for(pod), shared=True)
        return ClaimRef(self.template_for(pod))

    def _shared_for(self, pod: TracePod) -> str:
        for i, (name, spec, held) in enumerate(self._open):
            if spec == pod.gpu_spec and held + pod.gpu_milli <= FULL:
                self._open[i] = (name, spec, held + pod.gpu_milli)
                return name
        name = f"ts-{len(self.shared)}"
        self.shared[name] = self.spec(pod)
        self._open.append((name, pod.gpu_spec, pod.gpu_milli))
        self._open = [o for o in self._open if o[2] < FULL]
        return name

    def template_for(self, pod: TracePod) -> str:
        """The template's name for ``pod`` (registered on first use)."""
        spec = self.spec(pod)
        key = json.dumps(spec, sort_keys=True)
        if key not in self._names:
            kind = pod.kind if self.mode != "whole" or not pod.is_share else "1"
            name = f"gpu-{kind}-{len(self._names)}"
            self._names[key] = name
            self.templates[name] = spec
        return self._names[key]


def _time_slicing_config() -> Obj:
    parameters = {"apiVersion": CONFIG_API, "kind": "GpuConfig",
                  "sharing": {"strategy": "TimeSlicing"}}  # fmt: skip
    return {"opaque": {"driver": DRIVER, "parameters": parameters}}


def template_object(name: str, namespace: str, spec: Obj) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": spec},
    }


def claim_object(name: str, namespace: str, spec: Obj) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def pod_object(name: str, namespace: str, pod: TracePod, claim: ClaimRef | None) -> Obj:
    """A pod with ``pod``'s CPU and memory requests and, for a GPU pod, its claim; the
    annotations record the trace row and its GPU request for the measurements."""
    requests = {"cpu": f"{pod.cpu_milli}m", "memory": f"{pod.memory_mib}Mi"}
    container: Obj = {
        "name": "main",
        "image": "registry.invalid/pause:1",
        "resources": {"requests": requests},
    }
    spec: Obj = {"containers": [container], "terminationGracePeriodSeconds": 0}
    if claim is not None:
        key = "resourceClaimName" if claim.shared else "resourceClaimTemplateName"
        spec["resourceClaims"] = [{"name": "gpu", key: claim.name}]
        container["resources"]["claims"] = [{"name": "gpu"}]
    annotations = {
        f"{ANNOTATION}/pod": pod.name,
        f"{ANNOTATION}/kind": pod.kind,
        f"{ANNOTATION}/gpu-milli": str(pod.gpu_request_milli),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": spec,
    }
