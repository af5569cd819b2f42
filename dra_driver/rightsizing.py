"""Which allocated GPUs were barely used, and what smaller allocation would have fit.

Input: per (namespace, claim, pod, device) the samples of a window (utilization
and memory used, from the ``dra_driver_claim_*`` metrics) and what the device is
(product, MIG profile, memory allocated). A device is *under-used* when its
95th-percentile utilization stayed below the threshold (for MIG devices, where
NVML gives no utilization, when its peak memory stayed below the threshold of
what it was given). For each under-used device the smallest allocation that
would have held the peak with headroom is suggested:

* a MIG profile of the same board (from the known boards' MIG tables), when the
  board has MIG: memory >= peak x headroom and compute slices / 7 >=
  peak utilization x headroom;
* otherwise a share of the GPU (MPS): active-thread percentage and pinned
  memory limit covering the peak x headroom, rounded up (10 % steps, whole GiB).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from dra_driver.emulation.hardware import EmulatedMigProfile
from dra_driver.emulation.profile import load_models

GIB = 2**30
_FULL_SLICES = 7


@dataclass(frozen=True)
class DeviceWindow:
    namespace: str
    claim: str
    pod: str
    device: str
    product: str
    profile: str
    sharing: str
    allocated_bytes: int
    utilization: tuple[float, ...]
    """0..1 samples; empty for MIG devices (NVML reports none)."""
    memory_used: tuple[int, ...]


@dataclass(frozen=True)
class Finding:
    namespace: str
    claim: str
    pod: str
    device: str
    product: str
    allocated: str
    samples: int
    utilization_p95: float | None
    utilization_max: float | None
    memory_peak_bytes: int
    memory_allocated_bytes: int
    under_used: bool
    suggestion: str
    """E.g. ``MIG 1g.10gb`` or ``MPS share: 20% threads, 8Gi``; empty if none is smaller."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def mig_tables() -> dict[str, tuple[EmulatedMigProfile, ...]]:
    """Product name -> MIG profiles (memory, compute slices) of the boards we know."""
    return {m.product_name: m.mig_profiles for m in load_models().values() if m.mig_profiles}


def _fits(p: EmulatedMigProfile, memory: float, util: float) -> bool:
    return p.memory_mib * 2**20 >= memory and p.slices / _FULL_SLICES >= util


def suggest(
    w: DeviceWindow,
    *,
    headroom: float,
    tables: Mapping[str, tuple[EmulatedMigProfile, ...]],
) -> str:
    need_mem = max(w.memory_used, default=0) * headroom
    need_util = max(w.utilization, default=0.0) * headroom
    current = next((p for p in tables.get(w.product, ()) if p.name == w.profile), None)
    candidates = sorted(
        (
            p
            for p in tables.get(w.product, ())
            if "+" not in p.name and _fits(p, need_mem, need_util)
        ),
        key=lambda p: (p.slices, p.memory_mib),
    )
    if current is not None:
        candidates = [
            p for p in candidates if (p.slices, p.memory_mib) < (current.slices, current.memory_mib)
        ]
    if candidates:
        return f"MIG {candidates[0].name}"
    if w.profile or w.sharing == "mps":
        return ""  # already a MIG device with nothing smaller, or already a share
    threads = min(100, max(10, math.ceil(need_util * 10) * 10))
    memory = max(1, math.ceil(need_mem / GIB))
    if threads >= 100 and memory * GIB >= w.allocated_bytes:
        return ""
    return f"MPS share: {threads}% threads, {memory}Gi"


def _allocation(w: DeviceWindow) -> str:
    if w.profile:
        return f"MIG {w.profile}"
    return "full GPU" if w.sharing == "exclusive" else w.sharing


def analyse(
    windows: Sequence[DeviceWindow],
    *,
    threshold: float = 0.3,
    headroom: float = 1.2,
    tables: Mapping[str, tuple[EmulatedMigProfile, ...]] | None = None,
) -> list[Finding]:
    """One finding per device window, the under-used ones first (lowest use first)."""
    tables = mig_tables() if tables is None else tables
    out = []
    for w in windows:
        peak = max(w.memory_used, default=0)
        p95 = percentile(w.utilization, 0.95) if w.utilization else None
        if p95 is not None:
            under = p95 < threshold
        else:
            under = bool(w.allocated_bytes) and peak < threshold * w.allocated_bytes
        out.append(
            Finding(
                namespace=w.namespace, claim=w.claim, pod=w.pod, device=w.device,
                product=w.product,
                allocated=_allocation(w),
                samples=max(len(w.utilization), len(w.memory_used)),
                utilization_p95=p95,
                utilization_max=max(w.utilization) if w.utilization else None,
                memory_peak_bytes=peak, memory_allocated_bytes=w.allocated_bytes,
                under_used=under,
                suggestion=suggest(w, headroom=headroom, tables=tables) if under else "",
            )
        )  # fmt: skip
    return sorted(
        out, key=lambda f: (not f.under_used, f.utilization_p95 or 0.0, f.namespace, f.claim, f.pod)
    )
