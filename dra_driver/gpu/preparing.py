"""ClaimPreparer: the one pipeline that prepares claims on this node's GPUs.

Prepare:

1. Plan without side effects (:mod:`dra_driver.gpu.planning`); bad input fails
   here and nothing is written.
2. Fast path, under the checkpoint lock only: a ``Prepared`` entry for the same
   allocation whose CDI spec exists is returned as it is. A claim without an
   entry whose GPUs nobody holds is recorded (step 4) in that same transaction,
   its GPU locks taken without waiting (the common case: one transaction).
3. Else hold the claim's GPU locks (claims on other GPUs go on in parallel). An
   older entry of the claim (an interrupted prepare, an unfinished teardown, a
   vanished spec) is torn down first.
4. Record ``Preparing`` with the devices and every unit, then apply unit by
   unit (shared resources recorded, then acquired), write the CDI spec, record
   ``Prepared``. Any exception after step 4 began rolls everything back (the
   teardown below); a rollback that cannot finish leaves ``Unpreparing``, so
   the claim is never reported prepared and its devices stay reserved.

Unprepare, rollback and the recovery at start are the teardown of
:mod:`dra_driver.gpu.unpreparing`, which :class:`ClaimPreparer` builds on.

Every step reports ``on_step(name)`` after it acted; the crash tests SIGKILL the
process there. The checkpoint's states are documented in
:mod:`dra_driver.gpu.checkpoint`, its file handling in :mod:`dra_driver.gpu.statefile`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from dra_driver.errors import DriverError
from dra_driver.gpu.cdi import spec as cdi
from dra_driver.gpu.cdi.hooks import TOOLKIT_HOOK, HookError
from dra_driver.gpu.cdiedits import ClaimSpecs
from dra_driver.gpu.checkpoint import (
    ACQUIRING,
    PREPARED,
    PREPARING,
    READY,
    ClaimEntry,
    DeviceRecord,
    SharedEntry,
    Unit,
)
from dra_driver.gpu.hardware.consumable import MpsSlots
from dra_driver.gpu.hardware.inventory import Gpu, Inventory, MigInstance
from dra_driver.gpu.hardware.naming import devices_by_name
from dra_driver.gpu.host.files import NodeLocks
from dra_driver.gpu.host.hostpaths import HostPaths
from dra_driver.gpu.planning import (
    ClaimPlan,
    SharedResources,
    SharingStrategy,
    Strategies,
    allocation_key,
    locks_of,
    plan_claim,
)
from dra_driver.gpu.sharing.miginstances import MigInstances
from dra_driver.gpu.sharing.mpsdaemons import MpsDaemons
from dra_driver.gpu.sharing.mpsrunners import DaemonRunner
from dra_driver.gpu.sharing.strategies.builtin import builtin
from dra_driver.gpu.sharing.tools import GpuCommands, GpuTools
from dra_driver.gpu.statefile import (
    CheckpointStore,
    Loaded,
    MoreLocks,
    UnitSteps,
    check_conflicts,
    describe,
)
from dra_driver.gpu.unpreparing import Unpreparer
from dra_driver.logs import ContextLogger
from dra_driver.plugin.claims import Claim, ClaimRef, PreparedDevice, PrepareError


class ClaimPreparer(Unpreparer):
    """The GPU backend's prepare/unprepare; safe for concurrent claims and processes."""

    supports_parallel_claims = True
    hook_problem = ""
    """Why the node cannot run the CDI hook ("" when it can; set by the driver): no claim
    is prepared meanwhile, as its containers would fail to start, less clearly."""

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
        cdi_hook: Path = TOOLKIT_HOOK,
        strategies: Strategies | None = None,
        mig_instances: MigInstances | None = None,
        gpu_lock_timeout_s: float = 30.0,
        on_step: Callable[[str], None] | None = None,
        on_state_problem: Callable[[], None] | None = None,
        mps_slots: MpsSlots | None = None,
        mps_runner: DaemonRunner | None = None,
    ) -> None:
        """``strategies`` defaults to the built-in ones (:func:`strategies.builtin.builtin`), with
        dynamic MIG when ``mig_instances`` is given and MPS slots on the GPUs ``mps_slots``
        selects. ``on_state_problem`` is called when :meth:`state_problem` changes.
        ``mps_runner`` starts MPS daemons (None: as this process's children)."""
        self.kind = cdi.claim_kind(driver_name)
        cdi.validate_kind(self.kind)
        self._inventory = inventory
        self._named: tuple[Inventory, dict[str, Gpu | MigInstance]] | None = None
        """The last inventory seen and its devices by name (kept: names are not rebuilt
        for every claim)."""
        self._cdi_dir = cdi_dir
        self._log = logger
        self._store = CheckpointStore(
            state_dir=state_dir, proc_dir=host.proc(), logger=logger, on_problem=on_state_problem
        )
        self._locks = NodeLocks(state_dir / "locks")
        self._gpu_lock_timeout_s = gpu_lock_timeout_s
        commands = GpuCommands(tools=tools, logger=logger)
        daemons = MpsDaemons(
            root=state_dir / "mps", commands=commands, tools=tools, runner=mps_runner
        )
        self._daemons = daemons
        problem = daemons.depth_problem()
        if problem is not None:  # said at start, not first when an MPS claim arrives
            logger.warning("MPS claims will fail on this node: %s", problem)
        self._strategies = (
            strategies
            if strategies is not None
            else builtin(commands, daemons, inventory, mig_instances, mps_slots)
        )
        self._catalogs = bool(self._strategies.catalogs())
        self._on_step = on_step or (lambda _name: None)
        self._specs = ClaimSpecs(
            kind=self.kind, host=host, runtime_host=runtime_host, hook=cdi_hook
        )

    def warm(self) -> None:
        """Do now, at start, what the first prepare would do for every claim (the node's
        common CDI edits), so the first pod does not wait for it."""
        inventory = self._inventory()
        self._devices_by_name(inventory)
        self._specs.warm(inventory)

    def _devices_by_name(self, inventory: Inventory) -> dict[str, Gpu | MigInstance]:
        named = self._named
        if named is None or named[0] is not inventory:
            named = self._named = (inventory, devices_by_name(inventory))
        return named[1]

    def close(self) -> None:
        self._locks.close()
        self._store.close()

    # -- public API ---------------------------------------------------------------------

    def prepare(self, claim: Claim) -> list[PreparedDevice]:
        if self.hook_problem:
            raise HookError(f"prepare claim {claim.ref}: {self.hook_problem}")
        log = claim.ref.logger(self._log)
        with self._errors(f"prepare claim {claim.ref}"):
            recorded = self.recorded_units() if self._catalogs else []
            inventory = self._inventory()
            plan = plan_claim(
                claim, inventory, self._strategies, recorded, self._devices_by_name(inventory)
            )
            records = plan.device_records(self.kind)
            spec = cdi.transient_spec_path(self._cdi_dir, self.kind, claim.uid)
            locks = set(plan.locks)
            while True:
                # Without waiting for GPU locks: a repeated prepare (every pod sharing the
                # claim) never waits for another claim's work on the same GPU. A new claim
                # whose GPUs are free is recorded in this same transaction (their locks
                # taken without waiting), the common case in one checkpoint transaction.
                with ExitStack() as held:
                    with self._store.transaction() as loaded:
                        self._handle_reboot(loaded)
                        entry = loaded.checkpoint.claims.get(claim.uid)
                        if self._is_prepared(entry, records, spec):
                            assert entry is not None
                            log.debug("claim already prepared")
                            return _result(entry)
                        locks |= locks_of(entry)
                        new = None
                        if entry is None and held.enter_context(self._locks.hold_if_free(locks)):
                            new = self._record(plan, records, loaded)
                    if new is not None:
                        return self._apply(plan, new, log, locks)
                try:
                    with self._hold(locks):
                        return self._prepare_locked(plan, records, spec, locks, log)
                except MoreLocks as more:
                    locks |= more.locks

    def prepared_devices(self, ref: ClaimRef) -> list[PreparedDevice] | None:
        """PreparedLookup: the recorded result of a claim whose UID is prepared here (its
        spec in place); None for anything else, which the full prepare handles."""
        spec = cdi.transient_spec_path(self._cdi_dir, self.kind, ref.uid)
        if not spec.exists():  # not prepared (its spec is written last): no transaction,
            return None  # so a burst of new claims does not queue on the checkpoint lock
        with self._errors(f"look up claim {ref}"), self._store.transaction() as loaded:
            self._handle_reboot(loaded)
            entry = loaded.checkpoint.claims.get(ref.uid)
            if entry is None or entry.state != PREPARED or not spec.exists():
                return None
            if (entry.namespace, entry.name) != (ref.namespace, ref.name):
                raise PrepareError(  # a UID names one claim: a mix-up, never a new pod
                    f"claim UID {ref.uid} is prepared on this node as "
                    f"{entry.namespace}/{entry.name}, not {ref.namespace}/{ref.name}",
                    permanent=True,
                )
            return _result(entry)

    def prepared_claims(self) -> list[ClaimRef]:
        """Every claim with state on this node, prepared or not completely undone."""
        with self._errors("list prepared claims"), self._store.transaction() as loaded:
            self._handle_reboot(loaded)
            return [
                ClaimRef(namespace=e.namespace, name=e.name, uid=uid)
                for uid, e in sorted(loaded.checkpoint.claims.items())
            ]

    def strategies(self) -> dict[str, str]:
        """Claim UID -> name of the sharing strategy of its first unit (usage labels)."""
        with self._errors("read claim strategies"), self._store.transaction() as loaded:
            return {
                uid: (e.units[0].strategy if e.units else "Exclusive")
                for uid, e in loaded.checkpoint.claims.items()
            }

    def recorded_units(self) -> list[Unit]:
        """Every unit in the checkpoint, of every claim and state (what was made, or may
        have been: dynamic MIG tells its own GPU instances from others' by them)."""
        return [u for units in self.recorded_claims().values() for u in units]

    def recorded_claims(self) -> dict[str, list[Unit]]:
        """Claim UID -> its recorded units (dynamic MIG: which claim holds an instance)."""
        with self._errors("read the checkpoint"), self._store.transaction() as loaded:
            self._handle_reboot(loaded)
            return {uid: list(e.units) for uid, e in loaded.checkpoint.claims.items()}

    def state_problem(self) -> str:
        """Why claims cannot be prepared or unprepared now ("" when they can), e.g. a
        corrupt checkpoint; as of the last access to it."""
        return self._store.problem

    def check_state(self) -> str:
        """Read the checkpoint now and return :meth:`state_problem`."""
        try:
            with self._store.transaction():
                pass
        except DriverError:
            pass
        return self._store.problem

    # -- prepare ------------------------------------------------------------------------

    def _prepare_locked(
        self,
        plan: ClaimPlan,
        records: list[DeviceRecord],
        spec: Path,
        locks: set[str],
        log: ContextLogger,
    ) -> list[PreparedDevice]:
        """Under the GPU locks. Units are recorded (``Preparing``) before any is applied;
        a claim without units has nothing to undo but its spec, so it is recorded
        ``Prepared`` at once. The spec is written last: ``Prepared`` without a spec is an
        interrupted prepare, never a prepared claim."""
        claim = plan.claim
        with self._store.transaction() as loaded:
            old = loaded.checkpoint.claims.get(claim.uid)
            if self._is_prepared(old, records, spec):
                assert old is not None
                return _result(old)  # prepared by someone else while we waited
            if not locks_of(old) <= locks:
                raise MoreLocks(locks_of(old))
            if old is None:
                entry = self._record(plan, records, loaded)
        if old is not None:
            log.warning(
                "tearing down what an earlier preparation left first", extra={"state": old.state}
            )
            self._teardown(claim.uid, log, f"prepare claim {claim.ref}", locks)
            with self._store.transaction() as loaded:
                entry = self._record(plan, records, loaded)
        return self._apply(plan, entry, log, locks)

    def _record(self, plan: ClaimPlan, records: list[DeviceRecord], loaded: Loaded) -> ClaimEntry:
        """Record the claim (no entry yet) in the open transaction, under its GPU locks."""
        entry = ClaimEntry(
            state=PREPARING if plan.units else PREPARED,
            namespace=plan.claim.ref.namespace,
            name=plan.claim.ref.name,
            devices=tuple(records),
            units=plan.units,
        )
        check_conflicts(loaded.checkpoint, plan.claim.uid, entry)
        loaded.checkpoint.claims[plan.claim.uid] = entry
        self._store.save(loaded.checkpoint)
        return entry

    def _apply(
        self, plan: ClaimPlan, entry: ClaimEntry, log: ContextLogger, locks: set[str]
    ) -> list[PreparedDevice]:
        """Under the GPU locks, the entry recorded: apply the units, write the spec;
        roll everything back on any exception."""
        claim = plan.claim
        self._on_step(f"checkpoint-{entry.state.lower()}")
        try:
            units = list(plan.units)  # record() updates land here too
            if units:
                for i, unit in enumerate(plan.units):
                    strategy = self._strategy(unit.strategy)
                    for key in unit.shared:
                        self._acquire_shared(key, strategy)
                    strategy.apply(unit, UnitSteps(self, claim.uid, units, i))
                with self._store.transaction() as loaded:
                    claims = loaded.checkpoint.claims
                    claims[claim.uid] = dataclasses.replace(claims[claim.uid], state=PREPARED)
                    self._store.save(loaded.checkpoint)
                self._on_step("checkpoint-prepared")
            content = self._specs.build(
                claim.uid, plan.targets, units, self._inventory(), self._strategy
            )
            cdi.write_spec(self._cdi_dir, claim.uid, content)
            self._on_step("cdi-spec")
        except Exception as exc:
            reason = describe(exc)
            log.error("prepare failed, rolling back: %s", reason)
            try:
                self._teardown(claim.uid, log, "rollback", locks)
            except (PrepareError, MoreLocks) as incomplete:
                raise PrepareError(f"prepare claim {claim.ref}: {reason}; {incomplete}") from exc
            raise PrepareError(
                f"prepare claim {claim.ref}: {reason}; everything applied was rolled back"
            ) from exc
        log.info("claim prepared", extra={"devices": [t.name for t in plan.targets]})
        return _result(entry)

    def _acquire_shared(self, key: str, strategy: SharingStrategy) -> None:
        assert isinstance(strategy, SharedResources)
        with self._store.transaction() as loaded:
            current = loaded.checkpoint.shared.get(key)
            if current is not None and current.state == READY:
                return
            loaded.checkpoint.shared[key] = SharedEntry(strategy.name, ACQUIRING)
            self._store.save(loaded.checkpoint)
        self._on_step(f"shared-acquiring:{key}")
        record = strategy.acquire(key, UnitSteps(self, ""))
        with self._store.transaction() as loaded:
            loaded.checkpoint.shared[key] = SharedEntry(strategy.name, READY, dict(record))
            self._store.save(loaded.checkpoint)
        self._on_step(f"shared-ready:{key}")

    def _is_prepared(self, entry: ClaimEntry | None, records: list[Any], spec: Path) -> bool:
        return (
            entry is not None
            and entry.state == PREPARED
            and allocation_key(entry.devices) == allocation_key(records)
            and spec.exists()
        )


def _result(entry: ClaimEntry) -> list[PreparedDevice]:
    return [
        PreparedDevice(
            request_names=(d.request,),
            pool_name=d.pool,
            device_name=d.device,
            cdi_device_ids=d.cdi_device_ids,
            share_id=d.share_id,
        )
        for d in entry.devices
    ]
