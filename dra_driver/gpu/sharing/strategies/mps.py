"""MPS: the pods of a claim share its GPUs through one MPS control daemon, with limits.

Config (GpuConfig and MigDeviceConfig)::

    sharing:
      strategy: MPS
      mpsConfig:
        defaultActiveThreadPercentage: 50                 # 0..100
        defaultPinnedDeviceMemoryLimit: 10Gi              # quantity, 1Mi..8Ei
        defaultPerDevicePinnedMemoryLimit: {<uuid|index>: 5Gi}

One unit per claim and config: one daemon (:mod:`dra_driver.gpu.sharing.mpsdaemons`)
for all its devices. Apply: full GPUs to ``EXCLUSIVE_PROCESS`` (only the MPS
server may use them), the daemon's dirs, its shared-memory tmpfs, the daemon,
its limits. Undo: stop the daemon, unmount, remove the dirs, compute mode back
to DEFAULT; a failing step fails the unprepare. Containers get the pipe dir and
``/dev/shm`` mounted. Record::

    {"daemonId": "<12 hex>", "uuids": [...], "exclusive": [<full GPU uuids>],
     "activeThreadPercentage": 50 | null, "pinnedMemory": {"<uuid>": <bytes>}}
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from dra_driver.gpu.cdi.spec import ContainerEdits
from dra_driver.gpu.checkpoint import Unit
from dra_driver.gpu.config import (
    GPU_CONFIG,
    MIB,
    MIG_CONFIG,
    ConfigError,
    DeviceConfig,
    obj,
    parse_quantity,
)
from dra_driver.gpu.hardware.inventory import Gpu, MigInstance
from dra_driver.gpu.planning import Steps, Target
from dra_driver.gpu.sharing.mpsdaemons import MpsDaemons, mps_id, recorded_id
from dra_driver.gpu.sharing.shares import is_fractional
from dra_driver.gpu.sharing.strategies.base import NodeTools
from dra_driver.gpu.sharing.tools import GpuCommands

NAME = "MPS"


@dataclass(frozen=True)
class Mps:
    active_thread_percentage: int | None = None
    pinned_memory_limit: int | None = None
    """Bytes, for every device of the group."""
    per_device_pinned_memory_limit: dict[str, int] = field(default_factory=dict)
    """Bytes by device UUID or by the device's index within the claim."""


def _pinned(value: object, path: str) -> int:
    limit = parse_quantity(value, path)
    if limit < MIB:
        raise ConfigError(f"{path}: {value!r} is below the minimum of 1Mi")
    return limit


@dataclass(frozen=True)
class MpsDecoder:
    field: str = "mpsConfig"
    kinds: tuple[str, ...] = (GPU_CONFIG, MIG_CONFIG)

    def decode(self, raw: object, path: str) -> Mps:
        fields = (
            "defaultActiveThreadPercentage",
            "defaultPinnedDeviceMemoryLimit",
            "defaultPerDevicePinnedMemoryLimit",
        )
        settings = obj(raw if raw is not None else {}, path, fields)
        pct = settings.get("defaultActiveThreadPercentage")
        if pct is not None and (
            isinstance(pct, bool) or not isinstance(pct, int) or not 0 <= pct <= 100
        ):
            raise ConfigError(
                f"{path}.defaultActiveThreadPercentage: {pct!r}; allowed: integer 0..100"
            )
        default = settings.get("defaultPinnedDeviceMemoryLimit")
        per_raw = settings.get("defaultPerDevicePinnedMemoryLimit") or {}
        if not isinstance(per_raw, dict):
            raise ConfigError(
                f"{path}.defaultPerDevicePinnedMemoryLimit: "
                "must map a device UUID or index to a quantity"
            )
        per = {
            str(k): _pinned(v, f"{path}.defaultPerDevicePinnedMemoryLimit[{k}]")
            for k, v in per_raw.items()
        }
        return Mps(
            active_thread_percentage=pct,
            pinned_memory_limit=_pinned(default, f"{path}.defaultPinnedDeviceMemoryLimit")
            if default is not None
            else None,
            per_device_pinned_memory_limit=per,
        )


def pinned_limits(mps: Mps, uuids: Sequence[str], where: str) -> dict[str, int]:
    """Per-device pinned memory limit in bytes; per-device keys are a UUID or an index."""
    limits = {u: mps.pinned_memory_limit for u in uuids if mps.pinned_memory_limit is not None}
    for key, value in mps.per_device_pinned_memory_limit.items():
        if key in uuids:
            limits[key] = value
        elif key.isdigit() and int(key) < len(uuids):
            limits[uuids[int(key)]] = value
        else:
            allowed = ", ".join([*uuids, *map(str, range(len(uuids)))])
            raise ConfigError(
                f"{where}: sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[{key}]: not a "
                f"device of this claim; allowed keys: {allowed}"
            )
    return limits


def check_pinned_fits(pinned: dict[str, int], targets: Sequence[Target], where: str) -> None:
    """A limit above the device's memory would silently mean no limit at all: refused,
    naming the device and its memory."""
    for target in targets:
        device = target.device
        memory = device.memory_bytes if isinstance(device, Gpu) else None
        if isinstance(device, MigInstance):
            memory = device.profile.memory_bytes
        limit = pinned.get(target.uuid)
        if memory is not None and limit is not None and limit > memory:
            raise ConfigError(
                f"{where}: sharing.mpsConfig: the pinned memory limit of device {target.name} "
                f"({target.uuid}) is {limit // MIB}Mi, more than its {memory // MIB}Mi of "
                "memory; use at most that, or no limit"
            )


class MpsStrategy:
    name = NAME
    config = MpsDecoder()

    selects = frozenset({NAME})

    def __init__(self, node: NodeTools) -> None:
        self._commands: GpuCommands = node.commands
        self._daemons: MpsDaemons = node.daemons

    def wants(self, target: Target, config: DeviceConfig) -> bool:
        """Whole GPUs and MIG devices; a fractional share is
        :mod:`~dra_driver.gpu.sharing.strategies.mpsshares`' (its limits are its allocation)."""
        sharing = config.sharing
        return sharing is not None and sharing.strategy == NAME and not is_fractional(target)

    def plan(self, claim_uid: str, targets: Sequence[Target], config: DeviceConfig) -> list[Unit]:
        assert config.sharing is not None and isinstance(config.sharing.settings, Mps)
        settings = config.sharing.settings
        uuids = list(dict.fromkeys(t.uuid for t in targets))
        exclusive = list(dict.fromkeys(t.uuid for t in targets if t.type == "gpu"))
        daemon_id = mps_id(claim_uid, uuids)
        problem = self._daemons.depth_problem(daemon_id)
        if problem is not None:
            raise ConfigError(f"{config.origin}: MPS is not available on this node: {problem}")
        pinned = pinned_limits(settings, uuids, config.origin)
        check_pinned_fits(pinned, targets, config.origin)
        record = {
            "daemonId": daemon_id,
            "uuids": uuids,
            "exclusive": exclusive,
            "activeThreadPercentage": settings.active_thread_percentage,
            "pinnedMemory": pinned,
        }
        names = tuple(dict.fromkeys(t.name for t in targets))
        return [Unit(NAME, names, gpus=tuple(exclusive), record=record)]

    def apply(self, unit: Unit, steps: Steps) -> None:
        daemon_id = recorded_id(unit.record)
        for uuid in unit.record["exclusive"]:
            self._commands.set_compute_mode(str(uuid), "EXCLUSIVE_PROCESS")
            steps.done(f"compute-mode:{uuid}")
        pct = unit.record.get("activeThreadPercentage")
        self._daemons.bring_up(
            daemon_id,
            [str(u) for u in unit.record["uuids"]],
            active_thread_percentage=int(pct) if pct is not None else None,
            pinned_memory={str(k): int(v) for k, v in unit.record["pinnedMemory"].items()},
            done=steps.done,
        )

    def undo(self, unit: Unit, steps: Steps) -> None:
        self._daemons.tear_down(recorded_id(unit.record), steps.done)
        for uuid in unit.record.get("exclusive", ()):
            self._commands.set_compute_mode(str(uuid), "DEFAULT")
            steps.done(f"compute-mode-reset:{uuid}")

    def edits(self, unit: Unit, device: str, edits: ContainerEdits) -> ContainerEdits:
        return edits.merged(self._daemons.container_edits(recorded_id(unit.record)))

    def forget(self, claim_uid: str) -> None:
        self._daemons.stop_claim(claim_uid)

    def after_reboot(self) -> None:
        self._daemons.remove_all_dirs()
