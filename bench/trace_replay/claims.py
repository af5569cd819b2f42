"""Pods and their claims, written as users write them: CPU and memory requests, and a
claim from a ResourceClaimTemplate, one template per distinct request.

=============  ==============================================================
``whole``      ``count: N`` GPUs; a share is rounded up to one whole GPU
``consumable`` a share asks ``computeShare`` = ``gpu_milli / 10`` percent (rounded
               up) and ``memory``; whole-GPU pods ask ``count: N`` with no capacity
               request, which on a consumable GPU takes all of it (docs/sharing.md)
=============  ==============================================================

``gpu_spec`` becomes a CEL selector on ``productName``. Memory of a share: a capacity
request is an absolute quantity, so one claim cannot ask for "47 % of whichever GPU it
lands on" on a fleet of GPUs of different sizes. A share asks ``gpu_milli / 1000`` of
the SMALLEST memory among the GPU models it may use (rounded down to 1Mi, so shares
summing to one GPU fit), and ``computeShare`` is what bounds the packing: on a larger
GPU its memory request is below its fraction and never the first to run out. (One
``firstAvailable`` alternative per model would ask the exact fraction, but v1.37's
``DynamicResources`` scorer prefers nodes that satisfy earlier alternatives, which
would steer shares to the model listed first.)
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from bench.fleet.pools import DRIVER
from bench.trace_replay.building import GpuModel, Mode
from bench.trace_replay.trace import TracePod

Obj = dict[str, Any]
GPU_CLASS = "gpu.nvidia.com"
MIB = 1 << 20
ANNOTATION = "trace-replay.dra.example"
"""Prefix of the annotations that carry a pod's trace row and request onto the API."""


class Claims:
    """The claim specs of one replay, deduplicated into named templates."""

    def __init__(self, mode: Mode, models: Mapping[str, GpuModel]) -> None:
        self.mode = mode
        self.models = dict(models)
        self.templates: dict[str, Obj] = {}
        """Template name -> ``ResourceClaim.spec``."""
        self._names: dict[str, str] = {}

    def _selector(self, pod: TracePod) -> str | None:
        if not pod.gpu_spec:
            return None
        names = sorted({self.models[c].product_name for c in pod.gpu_spec if c in self.models})
        listed = ", ".join(f"'{n}'" for n in names)
        return f"device.attributes['{DRIVER}'].productName in [{listed}]"

    def _memory_mib(self, pod: TracePod) -> int:
        codes = [c for c in pod.gpu_spec if c in self.models] or list(self.models)
        smallest = min((self.models[c].memory_bytes for c in codes), default=0)
        return max(1, smallest * pod.gpu_milli // 1000 // MIB)

    def spec(self, pod: TracePod) -> Obj:
        """``ResourceClaim.spec`` of a GPU pod."""
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
        selector = self._selector(pod)
        if selector:
            exactly["selectors"] = [{"cel": {"expression": selector}}]
        return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}

    def template_for(self, pod: TracePod) -> str:
        """The template's name for ``pod`` (registered on first use)."""
        spec = self.spec(pod)
        key = json.dumps(spec, sort_keys=True)
        if key not in self._names:
            kind = pod.kind if self.mode == "consumable" or not pod.is_share else "1"
            name = f"gpu-{kind}-{len(self._names)}"
            self._names[key] = name
            self.templates[name] = spec
        return self._names[key]


def template_object(name: str, namespace: str, spec: Obj) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": spec},
    }


def pod_object(name: str, namespace: str, pod: TracePod, template: str | None) -> Obj:
    """A pod with ``pod``'s CPU and memory requests and, for a GPU pod, its claim; the
    annotations record the trace row and its GPU request for the measurements."""
    requests = {"cpu": f"{pod.cpu_milli}m", "memory": f"{pod.memory_mib}Mi"}
    container: Obj = {
        "name": "main",
        "image": "registry.invalid/pause:1",
        "resources": {"requests": requests},
    }
    spec: Obj = {"containers": [container], "terminationGracePeriodSeconds": 0}
    if template is not None:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
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
