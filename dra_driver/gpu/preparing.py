"""ClaimPreparer: the one pipeline that prepares and unprepares claims on this node's GPUs.

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

Unprepare (teardown): hold the GPU locks, record ``Unpreparing``, undo the
units in reverse, release shared resources no other claim uses, remove the
spec, drop the entry. A claim without units whose GPUs nobody holds has only
its spec removed and its entry dropped in the transaction that found it. A step
that fails fails the unprepare and keeps the entry; the kubelet retries, every
step being idempotent. An unknown claim's leftovers (files named after its UID)
are removed, so unprepare is safe after the checkpoint was moved aside.

Every step reports ``on_step(name)`` after it acted; the crash tests SIGKILL the
process there. After a restart, :meth:`ClaimPreparer.recover` finishes every
teardown and rolls back every prepare that was interrupted, and releases shared
resources no claim uses. The checkpoint's states are documented in
:mod:`dra_driver.gpu.checkpoint`, its file handling in :mod:`dra_driver.gpu.statefile`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from dra_driver.errors import DriverError
from dra_driver.gpu import cdi
from dra_driver.gpu.cdihook import TOOLKIT_HOOK
from dra_driver.gpu.checkpoint import (
    ACQUIRING,
    PREPARED,
    PREPARING,
    READY,
    RELEASING,
    UNPREPARING,
    ClaimEntry,
    DeviceRecord,
    SharedEntry,
)
from dra_driver.gpu.claimspec import ClaimSpecs
from dra_driver.gpu.hostpaths import HostPaths
from dra_driver.gpu.inventory import Inventory
from dra_driver.gpu.locks import LockTimeout, NodeLocks
from dra_driver.gpu.miginstances import MigInstances
from dra_driver.gpu.mpsdaemons import MpsDaemons
from dra_driver.gpu.naming import gpu_name_of
from dra_driver.gpu.planning import ClaimPlan, allocation_key, check_conflicts, plan_claim
from dra_driver.gpu.sharing import GpuCommands, GpuTools
from dra_driver.gpu.statefile import CheckpointStore, Loaded
from dra_driver.gpu.strategies.base import (
    SharedResources,
    SharingStrategy,
    Strategies,
    Unit,
)
from dra_driver.gpu.strategies.builtin import builtin
from dra_driver.logs import ContextLogger, claim_logger
from dra_driver.plugin.backend import PreparedDevice, PrepareError
from dra_driver.plugin.claims import Claim, ClaimRef


class _Steps:
    """A strategy's view of the pipeline while it acts on one unit."""

    def __init__(
        self, preparer: ClaimPreparer, uid: str, units: list[Unit] | None = None, index: int = 0
    ) -> None:
        self._p, self._uid, self._units, self._index = preparer, uid, units, index

    def done(self, name: str) -> None:
        self._p._on_step(name)

    def record(self, record: Mapping[str, Any]) -> None:
        if self._units is None:
            raise ValueError("only apply() records; acquire() returns its record")
        with self._p._store.transaction() as loaded:
            claims = loaded.checkpoint.claims
            entry = claims[self._uid]
            unit = dataclasses.replace(entry.units[self._index], record=dict(record))
            units = list(entry.units)
            units[self._index] = self._units[self._index] = unit
            claims[self._uid] = dataclasses.replace(entry, units=tuple(units))
            self._p._store.save(loaded.checkpoint)
        self._p._on_step(f"record:{unit.strategy}")


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
        cdi_hook: Path = TOOLKIT_HOOK,
        strategies: Strategies | None = None,
        mig_instances: MigInstances | None = None,
        gpu_lock_timeout_s: float = 30.0,
        on_step: Callable[[str], None] | None = None,
        on_state_problem: Callable[[], None] | None = None,
    ) -> None:
        """``strategies`` defaults to the built-in ones (:func:`strategies.builtin.builtin`), with
        dynamic MIG when ``mig_instances`` is given. ``on_state_problem`` is called when
        :meth:`state_problem` changes."""
        self.kind = cdi.claim_kind(driver_name)
        cdi.validate_kind(self.kind)
        self._inventory = inventory
        self._cdi_dir = cdi_dir
        self._log = logger
        self._store = CheckpointStore(
            state_dir=state_dir, proc_dir=host.proc(), logger=logger, on_problem=on_state_problem
        )
        self._locks = NodeLocks(state_dir / "locks")
        self._gpu_lock_timeout_s = gpu_lock_timeout_s
        commands = GpuCommands(tools=tools, logger=logger)
        daemons = MpsDaemons(root=state_dir / "mps", commands=commands, tools=tools)
        problem = daemons.depth_problem()
        if problem is not None:  # said at start, not first when an MPS claim arrives
            logger.warning("MPS claims will fail on this node: %s", problem)
        self._strategies = (
            strategies
            if strategies is not None
            else builtin(commands, daemons, inventory, mig_instances)
        )
        self._catalogs = bool(self._strategies.catalogs())
        self._on_step = on_step or (lambda _name: None)
        self._specs = ClaimSpecs(
            kind=self.kind, host=host, runtime_host=runtime_host, hook=cdi_hook
        )

    def close(self) -> None:
        self._locks.close()
        self._store.close()

    # -- public API ---------------------------------------------------------------------

    def prepare(self, claim: Claim) -> list[PreparedDevice]:
        log = claim_logger(self._log, claim.uid, claim.ref.namespace, claim.ref.name)
        with self._errors(f"prepare claim {claim.ref}"):
            recorded = self.recorded_units() if self._catalogs else []
            plan = plan_claim(claim, self._inventory(), self._strategies, recorded)
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
                        locks |= _locks_of(entry)
                        new = None
                        if entry is None and held.enter_context(self._locks.hold_if_free(locks)):
                            new = self._record(plan, records, loaded)
                    if new is not None:
                        return self._apply(plan, new, log, locks)
                try:
                    with self._hold(locks):
                        return self._prepare_locked(plan, records, spec, locks, log)
                except _MoreLocks as more:
                    locks |= more.locks

    def unprepare(self, ref: ClaimRef) -> None:
        log = claim_logger(self._log, ref.uid, ref.namespace, ref.name)
        what = f"unprepare claim {ref}"
        with self._errors(what):
            while True:
                with ExitStack() as held:
                    with self._store.transaction() as loaded:
                        self._handle_reboot(loaded)
                        entry = loaded.checkpoint.claims.get(ref.uid)
                        if entry is None:
                            self._forget(ref.uid)  # under the lock: no prepare records it
                            return
                        locks = _locks_of(entry)
                        # Only a spec to remove, and nobody working on its GPUs (a prepare
                        # of this claim between its record and its spec): done right here.
                        quick = not entry.units and held.enter_context(
                            self._locks.hold_if_free(locks)
                        )
                        if quick:
                            self._drop_spec_and_entry(ref.uid, loaded, log, what)
                    if quick:
                        self._on_step("checkpoint-removed")
                        log.info("claim unprepared")
                        return
                try:
                    with self._hold(locks):
                        self._teardown(ref.uid, log, what, locks)
                except _MoreLocks:
                    continue  # the entry changed while we waited: look again
                log.info("claim unprepared")
                return

    def prepared_devices(self, ref: ClaimRef) -> list[PreparedDevice] | None:
        """PreparedLookup: the recorded result of a claim whose UID is prepared here (its
        spec in place); None for anything else, which the full prepare handles."""
        spec = cdi.transient_spec_path(self._cdi_dir, self.kind, ref.uid)
        with self._errors(f"look up claim {ref}"), self._store.transaction() as loaded:
            self._handle_reboot(loaded)
            entry = loaded.checkpoint.claims.get(ref.uid)
            if entry is None or entry.state != PREPARED or not spec.exists():
                return None
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
        with self._errors("read the checkpoint"), self._store.transaction() as loaded:
            self._handle_reboot(loaded)
            return [u for e in loaded.checkpoint.claims.values() for u in e.units]

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

    def recover(self) -> None:
        """At start: finish interrupted teardowns, roll back interrupted prepares (a claim
        whose CDI spec is missing is not prepared), release shared resources without
        users. Failures are logged; the claim's next call retries."""
        self._store.remove_temp_files()
        with self._store.transaction() as loaded:
            self._handle_reboot(loaded)
            cp = loaded.checkpoint
            pending = [
                (uid, _locks_of(e))
                for uid, e in cp.claims.items()
                if e.state != PREPARED or not self._spec_path(uid).exists()
            ]
            orphans = [k for k in cp.shared if not cp.users_of(k)]
        for uid, locks in pending:
            log = claim_logger(self._log, uid)
            try:
                with self._hold(locks):
                    with self._store.transaction() as loaded:
                        entry = loaded.checkpoint.claims.get(uid)
                    if entry is None or (entry.state == PREPARED and self._spec_path(uid).exists()):
                        continue  # finished by someone else meanwhile
                    log.warning("finishing an interrupted %s", entry.state.lower())
                    self._teardown(uid, log, "clean up at start", locks)
            except (DriverError, _MoreLocks) as exc:
                log.error("could not clean up the claim at start: %s", exc)
        for key in orphans:
            try:
                with self._hold([key.split("/", 1)[0]]):
                    self._release_shared(key, None, self._log)
            except DriverError as exc:
                self._log.error("could not release shared resource %s: %s", key, exc)

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
            if not _locks_of(old) <= locks:
                raise _MoreLocks(_locks_of(old))
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
                    strategy.apply(unit, _Steps(self, claim.uid, units, i))
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
            reason = _describe(exc)
            log.error("prepare failed, rolling back: %s", reason)
            try:
                self._teardown(claim.uid, log, "rollback", locks)
            except (PrepareError, _MoreLocks) as incomplete:
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
        record = strategy.acquire(key, _Steps(self, ""))
        with self._store.transaction() as loaded:
            loaded.checkpoint.shared[key] = SharedEntry(strategy.name, READY, dict(record))
            self._store.save(loaded.checkpoint)
        self._on_step(f"shared-ready:{key}")

    # -- teardown -----------------------------------------------------------------------

    def _teardown(self, uid: str, log: ContextLogger, what: str, locks: set[str]) -> None:
        """Undo everything recorded for ``uid`` and drop its entry; the caller holds
        ``locks``, and :class:`_MoreLocks` says the entry needs more. Raises
        :class:`PrepareError` (entry kept, ``Unpreparing``) when a step failed; its
        message starts with ``what``. A claim without units has only its spec to
        remove, so no ``Unpreparing`` record precedes that: the spec is removed and the
        entry dropped in the one transaction that found it (spec first, so a crash in
        between leaves a ``Prepared`` entry without a spec, which is torn down)."""
        with self._store.transaction() as loaded:
            entry = loaded.checkpoint.claims.get(uid)
            if entry is None:
                return
            if not _locks_of(entry) <= locks:
                raise _MoreLocks(_locks_of(entry))
            if not entry.units:
                self._drop_spec_and_entry(uid, loaded, log, what)
            elif entry.state != UNPREPARING:
                loaded.checkpoint.claims[uid] = dataclasses.replace(entry, state=UNPREPARING)
                self._store.save(loaded.checkpoint)
        if not entry.units:
            self._on_step("checkpoint-removed")
            return
        self._on_step("checkpoint-unpreparing")
        errors = []
        for unit in reversed(entry.units):
            try:
                self._strategy(unit.strategy).undo(unit, _Steps(self, uid))
            except Exception as exc:
                errors.append(f"{unit.strategy}: {_describe(exc)}")
        for key in sorted(entry.shared_keys()):
            try:
                self._release_shared(key, uid, log)
            except Exception as exc:
                errors.append(f"release {key}: {_describe(exc)}")
        try:
            cdi.remove_spec(self._cdi_dir, self.kind, uid)
            self._on_step("cdi-spec-removed")
        except cdi.CdiError as exc:
            errors.append(str(exc))
        with self._store.transaction() as loaded:
            cp = loaded.checkpoint
            if errors:
                if uid in cp.claims:
                    cp.claims[uid] = dataclasses.replace(
                        cp.claims[uid], state=UNPREPARING, error="; ".join(errors)
                    )
                    self._store.save(cp)
                log.error("teardown incomplete, retried with the next call: %s", "; ".join(errors))
                raise PrepareError(
                    f"{what}: undo incomplete, retried with the next call: {'; '.join(errors)}"
                )
            cp.claims.pop(uid, None)
            self._store.save(cp)
        self._on_step("checkpoint-removed")

    def _drop_spec_and_entry(self, uid: str, loaded: Loaded, log: ContextLogger, what: str) -> None:
        """A claim without units, inside the transaction that found it (a file unlink
        under the checkpoint lock, no GPU tool)."""
        try:
            cdi.remove_spec(self._cdi_dir, self.kind, uid)
        except cdi.CdiError as exc:
            claims = loaded.checkpoint.claims
            claims[uid] = dataclasses.replace(claims[uid], state=UNPREPARING, error=str(exc))
            self._store.save(loaded.checkpoint)
            log.error("teardown incomplete, retried with the next call: %s", exc)
            raise PrepareError(
                f"{what}: undo incomplete, retried with the next call: {exc}"
            ) from exc
        self._on_step("cdi-spec-removed")
        del loaded.checkpoint.claims[uid]
        self._store.save(loaded.checkpoint)

    def _release_shared(self, key: str, releasing_uid: str | None, log: Any) -> None:
        """Release ``key`` unless a claim other than ``releasing_uid`` still uses it."""
        with self._store.transaction() as loaded:
            cp = loaded.checkpoint
            shared = cp.shared.get(key)
            if shared is None or [u for u in cp.users_of(key) if u != releasing_uid]:
                return
            if shared.state != RELEASING:
                cp.shared[key] = dataclasses.replace(shared, state=RELEASING)
                self._store.save(cp)
        strategy = self._strategy(shared.strategy)
        if not isinstance(strategy, SharedResources):
            raise PrepareError(f"strategy {shared.strategy} cannot release shared resources")
        strategy.release(key, shared.record, _Steps(self, ""))
        self._on_step(f"shared-released:{key}")
        with self._store.transaction() as loaded:
            loaded.checkpoint.shared.pop(key, None)
            self._store.save(loaded.checkpoint)
        log.info("released shared resource %s", key)

    def _forget(self, uid: str) -> None:
        cdi.remove_spec(self._cdi_dir, self.kind, uid)
        for strategy in self._strategies:
            strategy.forget(uid)

    def _handle_reboot(self, loaded: Loaded) -> None:
        """State of a previous boot was discarded: remove its files (never signal a PID)."""
        if not loaded.rebooted:
            return
        vendor, cls = self.kind.split("/", 1)
        if self._cdi_dir.is_dir():
            for spec in self._cdi_dir.glob(f"{vendor}-{cls}_*"):
                spec.unlink(missing_ok=True)
        for strategy in self._strategies:
            strategy.after_reboot()
        self._store.save(loaded.checkpoint)
        loaded.rebooted = False

    # -- helpers ------------------------------------------------------------------------

    def _spec_path(self, uid: str) -> Path:
        return cdi.transient_spec_path(self._cdi_dir, self.kind, uid)

    def _is_prepared(self, entry: ClaimEntry | None, records: list[Any], spec: Path) -> bool:
        return (
            entry is not None
            and entry.state == PREPARED
            and allocation_key(entry.devices) == allocation_key(records)
            and spec.exists()
        )

    def _strategy(self, name: str) -> SharingStrategy:
        strategy = self._strategies.get(name)
        if strategy is None:
            raise PrepareError(f"the checkpoint names strategy {name!r}, which this plugin lacks")
        return strategy

    @contextmanager
    def _hold(self, names: Any) -> Iterator[None]:
        try:
            with self._locks.hold(names, timeout_s=self._gpu_lock_timeout_s):
                yield
        except LockTimeout as exc:
            raise PrepareError(
                f"GPU {exc.name} is busy: {exc}; another claim's prepare or unprepare on it is "
                "still running. The kubelet retries"
            ) from exc

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """Our own errors as :class:`PrepareError` naming the claim; others pass through."""
        try:
            yield
        except PrepareError:
            raise
        except DriverError as exc:
            raise PrepareError(f"{what}: {exc}") from exc


class _MoreLocks(Exception):
    """The claim's entry names GPUs the caller does not hold (it changed while we waited):
    retry holding these too."""

    def __init__(self, locks: set[str]) -> None:
        super().__init__(f"the claim now needs GPU locks {sorted(locks)}")
        self.locks = locks


def _locks_of(entry: ClaimEntry | None) -> set[str]:
    return {gpu_name_of(d.device) for d in entry.devices} if entry is not None else set()


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


def _describe(exc: BaseException) -> str:
    """An error for the kubelet: ours as they are, others with their type."""
    return str(exc) if isinstance(exc, DriverError) else f"{type(exc).__name__}: {exc}"
