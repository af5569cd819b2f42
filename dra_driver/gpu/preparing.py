"""ClaimPreparer: prepare and unprepare allocated claims on this node.

Prepare, under the node-wide checkpoint lock:

1. A ``PrepareCompleted`` entry returns its stored result (idempotent, no work).
   A ``PrepareStarted`` entry (a crash mid-prepare) is rolled back first.
2. Plan without side effects: map device names to the inventory, decode and
   validate opaque configs, refuse devices another claim holds (unless either
   side has admin access). Bad input fails here and nothing is written.
3. Record ``PrepareStarted`` with the plan and the devices, then apply: compute
   mode and time-slice, MPS dirs, shm tmpfs, daemon and limits, then the
   claim's CDI spec.
4. Record ``PrepareCompleted`` with the result.

Any failure in 3 rolls back everything planned and drops the entry. Unprepare
undoes the recorded plan (MPS, time-slice, compute mode, CDI spec) and also
removes leftovers whose paths derive from the claim UID, so it is safe for
unknown claims and after the checkpoint was moved aside.

Every step calls ``on_step(name)`` after it completes; the crash tests use it
to SIGKILL the process at each step.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_driver.gpu import cdi
from dra_driver.gpu.cdiedits import EditsBuilder, read_majors
from dra_driver.gpu.checkpoint import (
    COMPLETED,
    STARTED,
    Checkpoint,
    CheckpointError,
    CheckpointStore,
    devices_from_json,
    devices_to_json,
)
from dra_driver.gpu.config import INTERVALS, ConfigError, DeviceType, Mps, TimeSlicing, resolve
from dra_driver.gpu.hostpaths import HostPaths
from dra_driver.gpu.inventory import Gpu, Inventory, MigInstance
from dra_driver.gpu.naming import devices_by_name
from dra_driver.gpu.sharing import (
    GpuCommands,
    GpuTools,
    MpsDaemons,
    ToolError,
    is_mps_id_of,
    mps_id,
    pinned_limits,
)
from dra_driver.logs import ContextLogger, claim_logger
from dra_driver.plugin.backend import PreparedDevice, PrepareError
from dra_driver.plugin.claims import Claim, ClaimRef

_UID = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


@dataclass
class _MpsGroup:
    daemon_id: str
    uuids: list[str]
    mps: Mps
    limits: dict[str, int]


@dataclass
class _Plan:
    devices: dict[str, Gpu | MigInstance] = field(default_factory=dict)
    admin: dict[str, bool] = field(default_factory=dict)
    timeslice: dict[str, int] = field(default_factory=dict)
    """GPU uuid -> nvidia-smi timeslice value."""
    exclusive: list[str] = field(default_factory=list)
    """GPU uuids switched to EXCLUSIVE_PROCESS for MPS."""
    mps: list[_MpsGroup] = field(default_factory=list)
    mps_of: dict[str, str] = field(default_factory=dict)
    """Device name -> MPS daemon id."""

    def applied_json(self, spec: Path) -> dict[str, Any]:
        return {
            "cdiSpec": str(spec),
            "timeSlicing": sorted(self.timeslice),
            "computeMode": sorted({*self.timeslice, *self.exclusive}),
            "mps": [{"id": g.daemon_id, "uuids": g.uuids} for g in self.mps],
        }


class ClaimPreparer:
    """The GPU backend's prepare/unprepare; safe for concurrent claims and processes."""

    supports_parallel_claims = True

    def __init__(
        self,
        *,
        driver_name: str,
        inventory: Callable[[], Inventory],
        host: HostPaths,
        cdi_dir: Path,
        state_dir: Path,
        logger: logging.Logger,
        tools: GpuTools,
        runtime_host: HostPaths | None = None,
        lock_timeout: float = 10.0,
        on_step: Callable[[str], None] | None = None,
    ) -> None:
        self._driver = driver_name
        self.kind = cdi.claim_kind(driver_name)
        cdi.validate_kind(self.kind)
        self._inventory = inventory
        self._host = host
        self._runtime_host = runtime_host
        self._cdi_dir = cdi_dir
        self._log = logger
        self._store = CheckpointStore(
            state_dir=state_dir,
            boot_id_path=host.proc("sys", "kernel", "random", "boot_id"),
            lock_timeout=lock_timeout,
        )
        self._commands = GpuCommands(tools=tools, logger=logger)
        self._mps = MpsDaemons(root=state_dir / "mps", commands=self._commands, tools=tools)
        problem = self._mps.depth_problem()
        if problem is not None:  # said at start, not first when an MPS claim arrives
            logger.warning("MPS claims will fail on this node: %s", problem)
        self._on_step = on_step or (lambda _name: None)
        self._builder_cache: EditsBuilder | None = None

    # -- public API -------------------------------------------------------------------

    def prepare(self, claim: Claim) -> list[PreparedDevice]:
        log = claim_logger(self._log, claim.uid, claim.ref.namespace, claim.ref.name)
        _check_uid(claim.uid)
        try:
            with self._store.locked() as cp:
                self._drop_stale(cp, log)
                entry = cp.claims.get(claim.uid)
                spec = cdi.transient_spec_path(self._cdi_dir, self.kind, claim.uid)
                if entry is not None and entry.get("state") == COMPLETED:
                    if spec.exists():
                        log.debug("claim already prepared")
                        return devices_from_json(entry)
                    log.warning("CDI spec %s vanished; preparing the claim again", spec)
                elif entry is not None:
                    log.warning("rolling back an interrupted prepare")
                if entry is not None:
                    self._undo(claim.uid, entry, log)
                    del cp.claims[claim.uid]
                    self._store.save(cp)
                return self._prepare_locked(claim, cp, log)
        except (CheckpointError, cdi.CdiError, ToolError, OSError) as exc:
            raise PrepareError(f"prepare claim {claim.uid}: {exc}") from exc

    def unprepare(self, ref: ClaimRef) -> None:
        log = claim_logger(self._log, ref.uid, ref.namespace, ref.name)
        _check_uid(ref.uid)
        try:
            with self._store.locked() as cp:
                self._drop_stale(cp, log)
                entry = cp.claims.get(ref.uid, {})
                self._undo(ref.uid, entry, log)
                if ref.uid in cp.claims:
                    del cp.claims[ref.uid]
                    self._store.save(cp)
                    log.info("claim unprepared")
        except (CheckpointError, cdi.CdiError, ToolError, OSError) as exc:
            raise PrepareError(f"unprepare claim {ref.uid}: {exc}") from exc

    def prepared_claims(self) -> list[ClaimRef]:
        """Every claim with state on this node, completed or interrupted."""
        with self._store.locked() as cp:
            return [
                ClaimRef(namespace=e.get("namespace", ""), name=e.get("name", ""), uid=uid)
                for uid, e in sorted(cp.claims.items())
            ]

    # -- prepare ------------------------------------------------------------------

    def _prepare_locked(
        self, claim: Claim, cp: Checkpoint, log: ContextLogger
    ) -> list[PreparedDevice]:
        inventory = self._inventory()
        plan = self._plan(claim, inventory, cp)
        spec_path = cdi.transient_spec_path(self._cdi_dir, self.kind, claim.uid)
        result = self._result(claim)
        entry: dict[str, Any] = {
            "state": STARTED,
            "namespace": claim.ref.namespace,
            "name": claim.ref.name,
            # Devices are recorded before anything is applied so that another claim can
            # never take them while this one waits for its rollback.
            "devices": devices_to_json(result, plan.admin),
            "applied": plan.applied_json(spec_path),
        }
        cp.claims[claim.uid] = entry
        self._store.save(cp)
        self._on_step("checkpoint-started")
        try:
            self._apply(claim, plan)
            spec = self._build_spec(claim, plan, inventory)
            cdi.write_spec(self._cdi_dir, claim.uid, spec)
            self._on_step("cdi-spec")
            entry["state"] = COMPLETED
            self._store.save(cp)
            self._on_step("checkpoint-completed")
        except (cdi.CdiError, ToolError, CheckpointError, OSError) as exc:
            log.error("prepare failed, rolling back: %s", exc)
            self._rollback_failed(claim.uid, cp, log)
            raise PrepareError(f"prepare claim {claim.uid}: {exc}") from exc
        log.info("claim prepared", extra={"devices": sorted(plan.devices)})
        return result

    def _rollback_failed(self, uid: str, cp: Checkpoint, log: ContextLogger) -> None:
        try:
            self._undo(uid, cp.claims[uid], log)
            del cp.claims[uid]
            self._store.save(cp)
        except (cdi.CdiError, CheckpointError, ToolError, OSError) as exc:
            log.error("rollback incomplete, the next call retries it: %s", exc)

    def _plan(self, claim: Claim, inventory: Inventory, cp: Checkpoint) -> _Plan:
        known = devices_by_name(inventory)
        plan = _Plan()
        types: dict[str, DeviceType] = {}
        for dev in claim.devices:
            obj = known.get(dev.device)
            if obj is None:
                raise PrepareError(
                    f"device {dev.device!r} (request {dev.request!r}, pool {dev.pool!r}) is not "
                    f"on this node; this node has: {', '.join(sorted(known)) or 'no devices'}",
                    permanent=True,
                )
            plan.devices[dev.device] = obj
            plan.admin[dev.device] = plan.admin.get(dev.device, False) or dev.admin_access
            types[dev.device] = "gpu" if isinstance(obj, Gpu) else "mig"
        self._check_conflicts(claim, cp, plan)
        try:
            configs = resolve(claim, types)
            groups: dict[str, tuple[Mps, list[str], list[str]]] = {}
            for (_request, name), cfg in configs.items():
                obj = plan.devices[name]
                if plan.admin[name] or cfg.sharing is None:
                    continue
                if isinstance(cfg.sharing, TimeSlicing):
                    if isinstance(obj, Gpu):
                        plan.timeslice[obj.uuid] = INTERVALS[cfg.sharing.interval]
                    continue
                mps, uuids, names = groups.setdefault(cfg.origin, (cfg.sharing, [], []))
                if obj.uuid not in uuids:
                    uuids.append(obj.uuid)
                    names.append(name)
                if isinstance(obj, Gpu):
                    plan.exclusive.append(obj.uuid)
            for origin, (mps, uuids, names) in groups.items():
                group = _MpsGroup(
                    mps_id(claim.uid, uuids), uuids, mps, pinned_limits(mps, uuids, origin)
                )
                plan.mps.append(group)
                plan.mps_of.update(dict.fromkeys(names, group.daemon_id))
        except ConfigError as exc:
            raise PrepareError(f"invalid opaque config: {exc}", permanent=True) from exc
        overlap = set(plan.timeslice) & set(plan.exclusive)
        if overlap:
            raise PrepareError(
                f"devices {sorted(overlap)} get both TimeSlicing and MPS from different configs; "
                "give each device one sharing strategy",
                permanent=True,
            )
        return plan

    def _check_conflicts(self, claim: Claim, cp: Checkpoint, plan: _Plan) -> None:
        for uid, other in cp.claims.items():
            if uid == claim.uid:
                continue
            for dev in other.get("devices", ()):
                name = dev.get("deviceName")
                if name in plan.devices and not (plan.admin[name] or dev.get("adminAccess")):
                    raise PrepareError(
                        f"device {name!r} is already prepared for claim "
                        f"{other.get('namespace')}/{other.get('name')} ({uid}); a device is "
                        "shared only with admin access"
                    )

    def _apply(self, claim: Claim, plan: _Plan) -> None:
        for uuid, value in sorted(plan.timeslice.items()):
            self._commands.set_compute_mode(uuid, "DEFAULT")
            self._on_step(f"compute-mode:{uuid}")
            self._commands.set_timeslice(uuid, value)
            self._on_step(f"timeslice:{uuid}")
        for uuid in plan.exclusive:
            self._commands.set_compute_mode(uuid, "EXCLUSIVE_PROCESS")
            self._on_step(f"compute-mode:{uuid}")
        for group in plan.mps:
            self._mps.make_dirs(group.daemon_id)
            self._on_step(f"mps-dirs:{group.daemon_id}")
            self._mps.mount_shm(group.daemon_id)
            self._on_step(f"mps-shm:{group.daemon_id}")
            self._mps.start(group.daemon_id, group.uuids)
            self._on_step(f"mps-daemon:{group.daemon_id}")
            self._mps.set_limits(group.daemon_id, group.uuids, group.mps, group.limits)
            self._on_step(f"mps-limits:{group.daemon_id}")

    def _builder(self, inventory: Inventory) -> EditsBuilder:
        """Edits builder, rebuilt when the driver version or the device majors change."""
        majors = read_majors(self._host)
        key = (inventory.driver_version, tuple(sorted(majors.items())))
        builder = self._builder_cache
        if builder is None or builder.key != key:
            builder = EditsBuilder(
                host=self._host,
                driver_version=inventory.driver_version,
                runtime_host=self._runtime_host,
                majors=majors,
            )
            self._builder_cache = builder
        return builder

    def _build_spec(self, claim: Claim, plan: _Plan, inventory: Inventory) -> cdi.Spec:
        builder = self._builder(inventory)
        devices = []
        for name, obj in plan.devices.items():
            edits = builder.gpu(obj) if isinstance(obj, Gpu) else builder.mig(obj)
            if name in plan.mps_of:
                edits = edits.merged(self._mps.container_edits(plan.mps_of[name]))
            devices.append(cdi.CdiDevice(name=f"{claim.uid}-{name}", edits=edits))
        return cdi.Spec(kind=self.kind, devices=tuple(devices), edits=builder.common())

    def _result(self, claim: Claim) -> list[PreparedDevice]:
        return [
            PreparedDevice(
                request_names=(dev.base_request,),
                pool_name=dev.pool,
                device_name=dev.device,
                cdi_device_ids=(cdi.qualified_name(self.kind, f"{claim.uid}-{dev.device}"),),
                share_id=dev.share_id,
            )
            for dev in claim.devices
        ]

    # -- undo ---------------------------------------------------------------------

    def _undo(self, uid: str, entry: dict[str, Any], log: ContextLogger) -> None:
        """Undo a claim's plan and remove UID-derived leftovers; every step is idempotent."""
        applied = entry.get("applied") or {}
        ids = {m.get("id") for m in applied.get("mps", ()) if isinstance(m, dict)}
        for daemon_id in sorted({*filter(None, ids), *self._mps.ids_for_claim(uid)}):
            if is_mps_id_of(daemon_id, uid):
                self._mps.stop(daemon_id)
        for uuid in applied.get("timeSlicing", ()):
            self._best_effort(log, self._commands.set_timeslice, uuid, 0)
        for uuid in applied.get("computeMode", ()):
            self._best_effort(log, self._commands.set_compute_mode, uuid, "DEFAULT")
        cdi.remove_spec(self._cdi_dir, self.kind, uid)

    @staticmethod
    def _best_effort(log: ContextLogger, fn: Callable[[str, Any], None], uuid: str, v: Any) -> None:
        try:
            fn(uuid, v)
        except ToolError as exc:
            log.warning("could not reset GPU %s: %s", uuid, exc)

    def _drop_stale(self, cp: Checkpoint, log: logging.Logger | ContextLogger) -> None:
        """After a reboot: remove files of pre-reboot claims; never signal old PIDs."""
        if not cp.stale:
            return
        for uid in sorted(cp.stale):
            if _UID.match(uid):
                cdi.remove_spec(self._cdi_dir, self.kind, uid)
                for daemon_id in self._mps.ids_for_claim(uid):
                    self._mps.stop(daemon_id)
        log.warning("node rebooted; dropped %d claims prepared before", len(cp.stale))
        cp.stale.clear()
        self._store.save(cp)


def _check_uid(uid: str) -> None:
    """Claim UIDs become file and directory names: allow only what Kubernetes issues."""
    if not _UID.match(uid):
        raise PrepareError(
            f"claim UID {uid!r} is not a lower-case alphanumeric/dash name of at most 63 "
            "characters",
            permanent=True,
        )
