"""From an allocated claim to a plan: targets, strategy units, locks. Pure, no side effects.

Bad input fails here, before anything is recorded or applied: a device this
node does not have, an invalid opaque config, settings a strategy cannot apply
to these devices, two strategies that would change one GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dra_driver.gpu import cdi
from dra_driver.gpu.checkpoint import UNPREPARING, Checkpoint, ClaimEntry, DeviceRecord
from dra_driver.gpu.config import ConfigError, DeviceConfig, DeviceType, resolve
from dra_driver.gpu.inventory import Gpu, Inventory, MigInstance
from dra_driver.gpu.naming import devices_by_name, gpu_name_of
from dra_driver.gpu.partitions import MigPartition
from dra_driver.gpu.strategies.base import (
    ClaimCheck,
    SharedResources,
    SharingStrategy,
    Strategies,
    Target,
    Unit,
)
from dra_driver.plugin.claims import Claim, PrepareError


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
    inventory: Inventory, strategies: Strategies, recorded: Sequence[Unit] = ()
) -> dict[str, Gpu | MigInstance | MigPartition]:
    """Every device name a claim may hold here: the inventory's, then the ones strategies
    create at prepare (:class:`DeviceCatalog`), which win for a shared name."""
    known: dict[str, Gpu | MigInstance | MigPartition] = dict(devices_by_name(inventory))
    for name, catalog in strategies.catalogs():
        known.update(catalog.devices(inventory, [u for u in recorded if u.strategy == name]))
    return known


def plan_claim(
    claim: Claim, inventory: Inventory, strategies: Strategies, recorded: Sequence[Unit] = ()
) -> ClaimPlan:
    """Raises :class:`PrepareError` (permanent: retrying cannot help) for bad input.

    ``recorded``: every unit in the checkpoint (strategies that create devices tell
    theirs from others' by them)."""
    known = known_devices(inventory, strategies, recorded)
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


def check_conflicts(cp: Checkpoint, uid: str, entry: ClaimEntry) -> None:
    """A device another claim holds is refused, unless either side has admin access or
    both are shares (consumable capacity); an unfinished teardown still holds it. A
    shared resource belongs to one strategy at a time: another strategy's unit naming
    it waits (retried) until the last claim using it is gone."""
    for unit in entry.units:
        for key in unit.shared:
            held = cp.shared.get(key)
            if held is not None and held.strategy != unit.strategy:
                users = [f"{cp.claims[u].namespace}/{cp.claims[u].name}" for u in cp.users_of(key)
                         if u != uid]  # fmt: skip
                raise PrepareError(
                    f"{key} is in use by strategy {held.strategy} (claims: "
                    f"{', '.join(users) or 'none; being released'}); a {unit.strategy} unit "
                    "cannot use it until they are unprepared; retried"
                )
    mine = {d.device: d for d in entry.devices}
    for other_uid, other in cp.claims.items():
        if other_uid == uid:
            continue
        for dev in other.devices:
            own = mine.get(dev.device)
            if own is None or dev.admin_access or own.admin_access:
                continue
            if dev.share_id is not None and own.share_id is not None:
                continue  # two shares of one device (consumable capacity)
            who = f"{other.namespace}/{other.name} ({other_uid})"
            if other.state == UNPREPARING:
                raise PrepareError(
                    f"device {dev.device!r} is still held by claim {who}, whose unprepare "
                    f"has not finished ({other.error or 'in progress'}); retried"
                )
            raise PrepareError(
                f"device {dev.device!r} is already prepared for claim {who}; a device is "
                "shared only with admin access"
            )
