"""From an allocated claim to a plan: targets, strategy units, locks. Pure, no side effects.

A claim's devices are resolved against the inventory into :class:`Target`\\ s, each
gets its effective opaque config (:func:`resolve`), and the :class:`Strategies` a
config selects plan their units (:mod:`dra_driver.gpu.sharing.strategies.base`). A device no
strategy wants is used as it is: nothing is changed on the GPU (its compute mode and
time-slice stay what the admin set), the claim's CDI spec alone grants it, and the
scheduler never gives a device without ``allowMultipleAllocations`` to two claims.

Bad input fails here, before anything is recorded or applied: a device this
node does not have, an invalid opaque config, settings a strategy cannot apply
to these devices, two strategies that would change one GPU.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from dra_driver.gpu.cdi import spec as cdi
from dra_driver.gpu.checkpoint import ClaimEntry, DeviceRecord, Unit
from dra_driver.gpu.config import (
    GPU_CONFIG,
    MIG_CONFIG,
    ConfigError,
    DeviceConfig,
    DeviceType,
    SharingDecoder,
    decode,
)
from dra_driver.gpu.hardware.inventory import Gpu, Inventory, MigInstance
from dra_driver.gpu.hardware.naming import devices_by_name
from dra_driver.gpu.hardware.partitions import MigPartition
from dra_driver.plugin.claims import Claim, PrepareError

_GPU_PREFIX = re.compile(r"^(gpu-[0-9]+)(?:-|$)")
_NO_CONFIG: dict[DeviceType, DeviceConfig] = {
    "gpu": DeviceConfig(kind=GPU_CONFIG),
    "mig": DeviceConfig(kind=MIG_CONFIG),
}
"""The effective config of a device no opaque config applies to (no sharing)."""


@dataclass(frozen=True)
class Target:
    """One allocated device of a claim, resolved against the inventory."""

    name: str
    """Published device name, e.g. ``gpu-3``."""
    request: str
    device: Gpu | MigInstance | MigPartition
    """What exists, or (a partition) what a strategy creates at prepare."""
    admin_access: bool = False
    share_id: str | None = None
    consumed_capacity: Mapping[str, str] = field(default_factory=dict)

    @property
    def type(self) -> DeviceType:
        if isinstance(self.device, MigPartition):
            return "gpu" if self.device.whole_gpu else "mig"
        return "gpu" if isinstance(self.device, Gpu) else "mig"

    @property
    def uuid(self) -> str:
        """The device's UUID; empty for a partition (it has one only once created)."""
        return "" if isinstance(self.device, MigPartition) else self.device.uuid

    @property
    def gpu_uuid(self) -> str:
        """The physical GPU's UUID (a MIG device's parent)."""
        if isinstance(self.device, MigPartition):
            return self.device.parent.uuid
        return self.device.uuid if isinstance(self.device, Gpu) else self.device.parent_uuid


class Steps(Protocol):
    """What a strategy reports to the pipeline while it acts."""

    def done(self, name: str) -> None:
        """One side effect took place (crash tests kill the process here)."""
        ...

    def record(self, record: Mapping[str, Any]) -> None:
        """Replace the unit's record in the checkpoint now (e.g. a hardware-assigned ID
        undo will need), before the next step can fail."""
        ...


class SharingStrategy(Protocol):
    """One way of preparing devices; the contract is in
    :mod:`dra_driver.gpu.sharing.strategies.base`."""

    @property
    def name(self) -> str:
        """Stable: stored in the checkpoint, and the ``sharing.strategy`` value if
        :attr:`config` is set."""
        ...

    @property
    def config(self) -> SharingDecoder | None:
        """Its settings decoder; None when no opaque config selects this strategy."""
        ...

    def wants(self, target: Target, config: DeviceConfig) -> bool:
        """Whether this strategy acts on ``target`` given its effective config."""
        ...

    def plan(self, claim_uid: str, targets: Sequence[Target], config: DeviceConfig) -> list[Unit]:
        """Units for ``targets`` (all wanted, all with ``config``); pure, raises
        ``ConfigError`` for settings that do not fit these devices."""
        ...

    def apply(self, unit: Unit, steps: Steps) -> None: ...

    def undo(self, unit: Unit, steps: Steps) -> None:
        """Idempotent; raises when a step did not take effect."""
        ...

    def edits(self, unit: Unit, device: str, edits: cdi.ContainerEdits) -> cdi.ContainerEdits:
        """``device``'s container edits with this unit's additions (after :meth:`apply`)."""
        ...

    def forget(self, claim_uid: str) -> None:
        """Remove what this strategy may have left for a claim the checkpoint does not know."""
        ...

    def after_reboot(self) -> None:
        """Remove every file this strategy keeps; state from the previous boot is gone."""
        ...


@runtime_checkable
class SharedResources(Protocol):
    """Optional ability: per-node resources shared by several claims' units."""

    def acquire(self, key: str, steps: Steps) -> Mapping[str, Any]:
        """Create the resource (the pipeline has recorded the key); returns its record."""
        ...

    def release(self, key: str, record: Mapping[str, Any], steps: Steps) -> None:
        """Idempotent undo of :meth:`acquire`, from the record (possibly empty: the
        process died before acquire returned)."""
        ...


@runtime_checkable
class ClaimCheck(Protocol):
    """Optional ability: a rule over all of a claim's targets a strategy wants, whatever
    config each came with (:meth:`SharingStrategy.plan` sees one config's targets)."""

    def check_claim(self, targets: Sequence[Target]) -> None:
        """Raises ``ConfigError`` when the claim cannot be prepared as a whole."""
        ...


@runtime_checkable
class DeviceCatalog(Protocol):
    """Optional ability: devices that do not exist yet but may be allocated (partitions
    a strategy creates at prepare), by published name. They take precedence over the
    inventory's devices of the same name."""

    def devices(self, inventory: Inventory, recorded: Sequence[Unit]) -> Mapping[str, MigPartition]:
        """``recorded``: this strategy's units in the checkpoint (what it made so far)."""
        ...


class Strategies:
    """The strategies of one preparer, in apply order (undo runs in reverse)."""

    def __init__(self, strategies: Sequence[SharingStrategy]) -> None:
        self._all = tuple(strategies)
        self._by_name = {s.name: s for s in self._all}
        if len(self._by_name) != len(self._all):
            raise ValueError("two strategies with the same name")
        # Once: isinstance against a runtime-checkable protocol inspects the class each
        # time (5 % of a prepare's CPU when it ran per claim).
        self._catalogs = tuple((s.name, s) for s in self._all if isinstance(s, DeviceCatalog))
        self._asked: dict[tuple[str | None, bool], tuple[SharingStrategy, ...]] = {}

    def __iter__(self) -> Any:
        return iter(self._all)

    def asked(self, sharing: str | None, shared: bool) -> tuple[SharingStrategy, ...]:
        """The strategies that may want a target whose config names ``sharing`` (None: no
        sharing config) and that has a share ID (``shared``), in apply order: those whose
        ``selects`` and ``shares_only`` allow it, and every one that declares neither."""
        key = (sharing, shared)
        found = self._asked.get(key)
        if found is None:
            found = self._asked[key] = tuple(
                s
                for s in self._all
                if sharing in getattr(s, "selects", (sharing,))
                and (shared or not getattr(s, "shares_only", False))
            )
        return found

    def get(self, name: str) -> SharingStrategy | None:
        return self._by_name.get(name)

    def catalogs(self) -> tuple[tuple[str, DeviceCatalog], ...]:
        """Name and strategy of those that create devices at prepare (:class:`DeviceCatalog`)."""
        return self._catalogs

    def decoders(self) -> dict[str, SharingDecoder]:
        """``sharing.strategy`` value -> settings decoder, in registration order."""
        return {s.name: s.config for s in self._all if s.config is not None}


@dataclass(frozen=True)
class ClaimPlan:
    claim: Claim
    targets: tuple[Target, ...]
    """One per allocation result, in allocation order."""
    units: tuple[Unit, ...]
    """In apply order; undo runs them in reverse."""
    locks: frozenset[str]
    """GPU names to hold while acting (a MIG device locks its GPU)."""

    def device_records(self, kind: str) -> list[DeviceRecord]:
        uid = self.claim.uid
        return [
            DeviceRecord(
                request=d.request,
                pool=d.pool,
                device=d.device,
                admin_access=d.admin_access,
                share_id=d.share_id,
                consumed_capacity=dict(d.consumed_capacity),
                cdi_device_ids=(cdi.qualified_name(kind, f"{uid}-{d.device}"),),
            )
            for d in self.claim.devices
        ]


def allocation_key(records: Sequence[DeviceRecord]) -> list[tuple[object, ...]]:
    """What makes two preparations of a claim the same (its allocation)."""
    return [(d.request, d.pool, d.device, d.admin_access, d.share_id) for d in records]


def known_devices(
    inventory: Inventory,
    strategies: Strategies,
    recorded: Sequence[Unit] = (),
    named: Mapping[str, Gpu | MigInstance] | None = None,
) -> dict[str, Gpu | MigInstance | MigPartition]:
    """Every device name a claim may hold here: the inventory's (``named``, when the
    caller keeps them by name), then the ones strategies create at prepare
    (:class:`DeviceCatalog`), which win for a shared name."""
    known: dict[str, Gpu | MigInstance | MigPartition] = dict(
        named if named is not None else devices_by_name(inventory)
    )
    for name, catalog in strategies.catalogs():
        known.update(catalog.devices(inventory, [u for u in recorded if u.strategy == name]))
    return known


def plan_claim(
    claim: Claim,
    inventory: Inventory,
    strategies: Strategies,
    recorded: Sequence[Unit] = (),
    named: Mapping[str, Gpu | MigInstance] | None = None,
) -> ClaimPlan:
    """Raises :class:`PrepareError` (permanent: retrying cannot help) for bad input.

    ``recorded``: every unit in the checkpoint (strategies that create devices tell
    theirs from others' by them); ``named``: the inventory's devices by name, if kept."""
    known = known_devices(inventory, strategies, recorded, named)
    targets = []
    for dev in claim.devices:
        found = known.get(dev.device)
        if found is None:
            raise PrepareError(
                f"device {dev.device!r} (request {dev.request!r}, pool {dev.pool!r}) is not "
                f"on this node; this node has: {', '.join(sorted(known)) or 'no devices'}",
                permanent=True,
            )
        targets.append(
            Target(
                name=dev.device,
                request=dev.request,
                device=found,
                admin_access=dev.admin_access,
                share_id=dev.share_id,
                consumed_capacity=dict(dev.consumed_capacity),
            )
        )
    types: dict[str, DeviceType] = {t.name: t.type for t in targets}
    try:
        configs = resolve(claim, types, strategies.decoders())
    except ConfigError as exc:
        raise PrepareError(f"invalid opaque config: {exc}", permanent=True) from exc
    try:
        units = _units(claim.uid, targets, configs, strategies)
    except ConfigError as exc:
        raise PrepareError(f"cannot prepare as allocated: {exc}", permanent=True) from exc
    locks = frozenset(gpu_name_of(t.name) for t in targets)
    for unit in units:
        for key in unit.shared:
            if key.split("/", 1)[0] not in locks:
                raise PrepareError(
                    f"{unit.strategy}: shared key {key!r} is not on a GPU of this claim"
                )
    return ClaimPlan(claim=claim, targets=tuple(targets), units=tuple(units), locks=locks)


def resolve(
    claim: Claim, types: dict[str, DeviceType], strategies: Mapping[str, SharingDecoder]
) -> dict[tuple[str, str], DeviceConfig]:
    """Effective config per allocated ``(request, device)``; raises :class:`ConfigError`.

    ``types`` maps each allocated device name to ``gpu`` or ``mig``. Precedence follows
    NVIDIA: class configs, then claim configs; the later one replaces the earlier for a
    device. A config without ``requests`` applies to every device of its kind; one that
    names a request whose device has the other kind is an error.
    """
    decoded = [
        (cfg, decode(cfg.parameters, f"config[{i}] ({cfg.source})", strategies))
        for i, cfg in enumerate(claim.configs)
    ]
    out: dict[tuple[str, str], DeviceConfig] = {}
    for dev in claim.devices:
        effective = _NO_CONFIG[types[dev.device]]
        for i, (raw, cfg) in enumerate(decoded):
            if not raw.applies_to(dev.request):
                continue
            if cfg.kind != effective.kind:
                if raw.requests:
                    raise ConfigError(
                        f"config[{i}] ({raw.source}): kind {cfg.kind} names request "
                        f"{dev.base_request!r}, whose device {dev.device} needs kind "
                        f"{effective.kind}"
                    )
                continue
            effective = DeviceConfig(kind=cfg.kind, sharing=cfg.sharing, origin=f"config[{i}]")
        out[(dev.request, dev.device)] = effective
    return out


def _units(
    claim_uid: str,
    targets: list[Target],
    configs: dict[tuple[str, str], DeviceConfig],
    strategies: Strategies,
) -> list[Unit]:
    groups: dict[tuple[str, str], tuple[SharingStrategy, DeviceConfig, list[Target]]] = {}
    checked: dict[str, tuple[ClaimCheck, list[Target]]] = {}
    for target in targets:
        if target.admin_access:
            continue  # monitoring access to a device in use: device nodes only, no changes
        config = configs[(target.request, target.name)]
        sharing = config.sharing.strategy if config.sharing is not None else None
        for strategy in strategies.asked(sharing, target.share_id is not None):
            if strategy.wants(target, config):
                _, _, members = groups.setdefault(
                    (strategy.name, config.origin), (strategy, config, [])
                )
                if target not in members:
                    members.append(target)
                if isinstance(strategy, ClaimCheck):
                    checked.setdefault(strategy.name, (strategy, []))[1].append(target)
    for check, wanted in checked.values():
        check.check_claim(wanted)
    units: list[Unit] = []
    changed: dict[str, Unit] = {}
    origins: dict[int, str] = {}
    for strategy in strategies:
        for (name, origin), (_, config, members) in groups.items():
            if name != strategy.name:
                continue
            for unit in strategy.plan(claim_uid, members, config):
                if unit.shared and not isinstance(strategy, SharedResources):
                    raise ConfigError(f"{name}: shared resources need the SharedResources ability")
                for uuid in unit.gpus:
                    other = changed.get(uuid)
                    if other is not None:
                        raise ConfigError(
                            f"GPU {uuid} would be changed by {other.strategy} "
                            f"({origins[id(other)]}) and by {unit.strategy} ({origin}) from "
                            "different configs; give each device one sharing strategy"
                        )
                    changed[uuid] = unit
                origins[id(unit)] = origin
                units.append(unit)
    return units


def gpu_name_of(device_name: str) -> str:
    """The full GPU a device name belongs to (``gpu-7-mig-...`` -> ``gpu-7``): what
    preparing locks, so claims on different GPUs never wait for each other."""
    m = _GPU_PREFIX.match(device_name)
    return m.group(1) if m else device_name


def locks_of(entry: ClaimEntry | None) -> set[str]:
    """The GPU locks a recorded claim's devices need."""
    return {gpu_name_of(d.device) for d in entry.devices} if entry is not None else set()
