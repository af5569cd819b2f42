"""How each sharing mode publishes a trace's GPUs: the emulated board of each trace model,
the daemon flags of the mode, and what a node of each shape publishes under them.

=================  ==========================================================================
``whole``          every GPU exclusive (no sharing flag)
``consumable``     ``--consumable-gpus all``: ``memory`` and ``computeShare`` capacities
``slots``          ``--mps-slots <product>=<N>``, N per model: :func:`choose_slots`
``time-slicing``   every GPU exclusive: time-slicing is a claim config
                   (``sharing.strategy: TimeSlicing``) that lets the pods of ONE claim take
                   turns on its GPU; the scheduler counts no capacity
``mig``            the same nodes re-declared as MIG-mode A100 80GB (G1-G3: H100 80GB) with
                   ``--mig-mode dynamic``: every profile x placement over shared counters
=================  ==========================================================================

Trace models map to emulator boards in ``models.yaml`` (:data:`MODELS`). ``G1``-``G3``
are undisclosed internal boards: they get a stand-in, the figures of :data:`STAND_IN`
(A100 80GB PCIe) without MIG, under their own product name (``Alibaba G2 (stand-in)``),
so ``gpu_spec`` can still tell them apart. Every share is a fraction of its GPU, so the
stand-in's figures cannot change an allocation rate. A live cluster's nodes
(``plan --from-cluster``) carry a board's own name as their model.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml

from dra_driver.gpu.hardware.consumable import MAX_SLOTS, MIN_SLOTS, ConsumableGpus, MpsSlots
from dra_driver.gpu.sharing.slots import Slot
from dra_driver.plugin.resources import Pool
from dra_driver.quantity import parse
from dra_driver.workload.pools import DriverFlags, api_slices, node_pool
from dra_driver.workload.trace import TraceNode, TracePod

Mode = Literal["whole", "consumable", "slots", "time-slicing", "mig"]
MODES: tuple[Mode, ...] = ("whole", "consumable", "slots", "time-slicing", "mig")

MODELS = {
    "T4": "T4",
    "P100": "P100-PCIE-16GB",
    "V100M16": "V100-SXM2-16GB",
    "V100M32": "V100-SXM2-32GB",
    "A10": "A10",
}
STAND_INS = ("G1", "G2", "G3")
STAND_IN = "A100-PCIE-80GB"
MIG_BOARD = "A100-SXM4-80GB"
MIG_STAND_IN_BOARD = "H100-SXM5-80GB"
"""``mig`` mode: what every GPU becomes (the G1-G3 stand-ins, 80 GB boards already,
become H100s, the older boards A100s; both have the same profile names)."""
MAX_RESULTS = 32
"""resource.k8s.io: at most 32 devices in one claim's allocation (bounds N slots)."""
Obj = dict[str, Any]


def mode_of(text: str) -> Mode:
    """``text`` as a mode; raises ValueError naming the modes."""
    for mode in MODES:
        if text == mode:
            return mode
    raise ValueError(f"mode {text!r} is unknown; known: {', '.join(MODES)}")


@functools.cache
def _models_yaml() -> dict[str, Any]:
    """The emulator's boards, parsed once (``board_of`` runs per node shape and mode);
    callers only read it."""
    text = resources.files("dra_driver.emulation").joinpath("profiles", "models.yaml")
    return dict(yaml.safe_load(text.read_text()))


def board_of(code: str, mode: Mode) -> str:
    """The emulator board a node of trace model ``code`` has in ``mode``."""
    boards = _models_yaml()
    if code not in MODELS and code not in STAND_INS and code not in boards:
        known = sorted([*MODELS, *STAND_INS, *boards])
        raise ValueError(f"GPU model {code!r} of the node list is unknown; known: {known}")
    if mode == "mig":
        if code in boards and boards[code].get("migProfiles"):
            return code  # a live cluster's MIG-capable board stays itself
        return MIG_STAND_IN_BOARD if code in STAND_INS else MIG_BOARD
    return MODELS.get(code, code)


def profile_yaml(code: str, gpus: int, mode: Mode = "whole") -> str:
    """An emulator profile of one node of ``gpus`` GPUs of trace model ``code``."""
    board = board_of(code, mode)
    profile: Obj = {
        "name": f"trace-{code.lower()}-x{gpus}",
        "driverVersion": "580.95.05",
        "cudaDriverVersion": 13000,
        "gpus": [
            {
                "model": board,
                "busId": f"0000:{0x10 + i:02x}:00.0",
                "pcieRoot": f"pci0000:{i // 4:02x}",
                "numaNode": i * 2 // gpus,
                **({"migEnabled": True} if mode == "mig" else {}),
            }
            for i in range(gpus)
        ],
    }
    if code in STAND_INS and mode != "mig":
        base = dict(_models_yaml()[STAND_IN])
        base.pop("migProfiles", None)
        profile["models"] = {code: {**base, "productName": f"Alibaba {code} (stand-in)"}}
    return yaml.safe_dump(profile, sort_keys=False)


@dataclass(frozen=True)
class MigProfile:
    """A MIG profile as its devices publish it, in fractions of the whole GPU."""

    name: str
    memory: float
    compute: float


@dataclass(frozen=True)
class GpuModel:
    """What a trace model code became in the slices."""

    code: str
    product_name: str
    memory_bytes: int
    slots: int = 0
    """``slots`` mode: N, the model's MPS slots (0: not split)."""
    mig_profiles: tuple[MigProfile, ...] = ()
    """``mig`` mode: the profiles, smallest first."""


@dataclass(frozen=True)
class ShapePool:
    """What every node of one shape (trace model, GPU count) publishes."""

    code: str
    gpus: int
    pool: Pool
    slices: tuple[Obj, ...]
    """Slice specs as the API holds them, without node and pool name."""


def _attr(device: Obj, name: str) -> Any:
    return next(iter(device["attributes"][name].values()))


def _mig_profiles(devices: Sequence[Obj]) -> tuple[MigProfile, ...]:
    whole = next(d for d in devices if _attr(d, "type") == "gpu")
    total = {k: float(parse(whole["capacity"][k]["value"])) for k in ("memory", "multiprocessors")}
    out: dict[str, MigProfile] = {}
    for d in devices:
        name = str(_attr(d, "profile")) if "profile" in d["attributes"] else ""
        if _attr(d, "type") != "mig" or "+" in name:  # +me: the same, with media engines
            continue
        cap = {k: float(parse(d["capacity"][k]["value"])) for k in total}
        out[name] = MigProfile(
            name, cap["memory"] / total["memory"], cap["multiprocessors"] / total["multiprocessors"]
        )
    return tuple(sorted(out.values(), key=lambda p: (p.compute, p.memory, p.name)))


def slots_of(milli: int, n: int) -> int:
    """The slots of a GPU split in ``n`` that cover a share of ``milli`` thousandths."""
    return math.ceil(milli * n / 1000)


def slot_waste(milli: Iterable[int], n: int) -> float:
    """Thousandths of a GPU lost when each share takes the slots that cover it."""
    return sum(slots_of(m, n) * 1000 / n - m for m in milli)


def choose_slots(memory_bytes: int, pods: Iterable[TracePod]) -> int:
    """N slots for a model that ``pods`` may use: the N that wastes least (the fewest
    slots on a tie) among those where every pod's claim fits in :data:`MAX_RESULTS`
    devices (a pod of g whole GPUs takes g x N slots), and the GPU splits exactly;
    0 when no N qualifies."""
    pods = list(pods)
    shares = [p.gpu_milli for p in pods if p.is_share]
    widest = max((p.num_gpu for p in pods if not p.is_share and p.num_gpu), default=1)
    best: tuple[float, int] | None = None
    for n in range(MIN_SLOTS, MAX_SLOTS + 1):
        if widest * n > MAX_RESULTS or not Slot(count=n, gpu_memory=memory_bytes).exact:
            continue
        if any(slots_of(m, n) > MAX_RESULTS for m in shares):
            continue
        waste = slot_waste(shares, n)
        if best is None or waste < best[0] - 1e-9:
            best = (waste, n)
    return best[1] if best else 0


def may_use(pod: TracePod, code: str) -> bool:
    return not pod.gpu_spec or code in pod.gpu_spec


@dataclass
class Published:
    """Every shape's pool and every model's facts for one mode and one set of nodes."""

    mode: Mode
    shapes: dict[tuple[str, int], ShapePool] = field(default_factory=dict)
    models: dict[str, GpuModel] = field(default_factory=dict)

    @property
    def flags(self) -> DriverFlags:
        """The daemon flags of this mode."""
        if self.mode == "consumable":
            return DriverFlags(consumable=ConsumableGpus(all=True))
        if self.mode == "mig":
            return DriverFlags(mig_mode="dynamic")
        if self.mode == "slots":
            counts = {m.product_name: m.slots for m in self.models.values() if m.slots}
            return DriverFlags(slots=MpsSlots(counts=tuple(sorted(counts.items()))))
        return DriverFlags()

    def settings(self) -> Obj:
        """What an admin sets for this mode: daemon flags and chart values."""
        flags = self.flags
        out: Obj = {}
        if flags.consumable:
            out["flags"] = ["--consumable-gpus=all"]
            out["chart"] = {"consumableGpus": "all"}
        elif flags.mig_mode == "dynamic":
            out["flags"] = ["--mig-mode=dynamic"]
            out["chart"] = {"migMode": "dynamic"}
            out["gpus"] = "MIG mode on (nvidia-smi -mig 1); A100 80GB / H100 80GB boards"
        elif flags.slots:
            text = ",".join(f"{name}={n}" for name, n in flags.slots.counts)
            out["flags"] = [f"--mps-slots={text}"]
            out["chart"] = {"mpsSlots": text}
        else:
            out["flags"] = []
        if self.mode == "time-slicing":
            out["claim_config"] = {"sharing": {"strategy": "TimeSlicing"}}
        return out


def publish_shapes(
    nodes: Sequence[TraceNode], mode: Mode, pods: Sequence[TracePod], workdir: Path
) -> Published:
    """Build each node shape's pool in ``mode`` with the driver's code (on an emulated node
    written under ``workdir``); ``pods`` (the drawn ones) choose the slot counts."""
    out = Published(mode)
    shapes = sorted({(n.model, n.gpus) for n in nodes if n.gpus})
    workdir.mkdir(parents=True, exist_ok=True)
    facts: dict[str, tuple[str, int, tuple[MigProfile, ...]]] = {}
    for code, _ in shapes:  # first pass: what each model is, unsplit
        if code in facts:
            continue
        path = workdir / f"{mode}-{code}-x1.yaml"
        path.write_text(profile_yaml(code, 1, mode))
        devices = [
            d for s in api_slices(node_pool(path, _base_flags(mode))) for d in s.get("devices", [])
        ]
        gpu = next(d for d in devices if _attr(d, "type") == "gpu")
        memory = int(parse(gpu["capacity"]["memory"]["value"]))
        profiles = _mig_profiles(devices) if mode == "mig" else ()
        facts[code] = (str(_attr(gpu, "productName")), memory, profiles)
    for code, (product, memory, profiles) in facts.items():
        n = choose_slots(memory, (p for p in pods if may_use(p, code))) if mode == "slots" else 0
        out.models[code] = GpuModel(code, product, memory, n, profiles)
    for code, count in shapes:
        path = workdir / f"{mode}-{code}-x{count}.yaml"
        path.write_text(profile_yaml(code, count, mode))
        pool = node_pool(path, out.flags)
        out.shapes[(code, count)] = ShapePool(code, count, pool, tuple(api_slices(pool)))
    return out


def _base_flags(mode: Mode) -> DriverFlags:
    return DriverFlags(mig_mode="dynamic") if mode == "mig" else DriverFlags()


def product_names(models: Mapping[str, GpuModel]) -> dict[str, str]:
    return {c: m.product_name for c, m in sorted(models.items())}
