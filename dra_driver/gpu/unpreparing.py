"""Unprepare: the teardown of claims, and the undo of whatever a previous process left.

Teardown: hold the GPU locks, record ``Unpreparing``, undo the units in reverse,
release shared resources no other claim uses, remove the spec, drop the entry. A
claim without units whose GPUs nobody holds has only its spec removed and its entry
dropped in the transaction that found it. A step that fails fails the unprepare and
keeps the entry; the kubelet retries, every step being idempotent. An unknown
claim's leftovers (files named after its UID) are removed, so unprepare is safe
after the checkpoint was moved aside. The same teardown rolls back a prepare that
failed (:mod:`dra_driver.gpu.preparing`).

Every step reports ``on_step(name)`` after it acted; the crash tests SIGKILL the
process there. After a restart, :meth:`Unpreparer.recover` finishes every teardown
and rolls back every prepare that was interrupted, and releases shared resources no
claim uses. The checkpoint's states are documented in
:mod:`dra_driver.gpu.checkpoint`, its file handling in :mod:`dra_driver.gpu.statefile`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from contextlib import ExitStack
from typing import Any

from dra_driver.errors import DriverError
from dra_driver.gpu.cdi import spec as cdi
from dra_driver.gpu.checkpoint import PREPARED, READY, RELEASING, UNPREPARING, Checkpoint
from dra_driver.gpu.planning import SharedResources, locks_of
from dra_driver.gpu.sharing.mpsdaemons import is_mps_id
from dra_driver.gpu.statefile import ClaimRecords, Loaded, MoreLocks, UnitSteps, describe
from dra_driver.logs import ContextLogger
from dra_driver.plugin.claims import ClaimRef, PrepareError


class Unpreparer(ClaimRecords):
    """Teardown and recovery; :class:`~dra_driver.gpu.preparing.ClaimPreparer` builds on it
    (one object: the same checkpoint, locks and strategies)."""

    def unprepare(self, ref: ClaimRef) -> None:
        log = ref.logger(self._log)
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
                        locks = locks_of(entry)
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
                except MoreLocks:
                    continue  # the entry changed while we waited: look again
                log.info("claim unprepared")
                return

    def recover(self) -> None:
        """At start: finish interrupted teardowns, roll back interrupted prepares (a claim
        whose CDI spec is missing is not prepared), release shared resources without
        users. Failures are logged; the claim's next call retries."""
        self._store.remove_temp_files()
        with self._store.transaction() as loaded:
            self._handle_reboot(loaded)
            cp = loaded.checkpoint
            pending = [
                (uid, locks_of(e))
                for uid, e in cp.claims.items()
                if e.state != PREPARED or not self._spec_path(uid).exists()
            ]
            orphans = [k for k in cp.shared if not cp.users_of(k)]
        for uid, locks in pending:
            log = ClaimRef(namespace="", name="", uid=uid).logger(self._log)
            try:
                with self._hold(locks):
                    with self._store.transaction() as loaded:
                        entry = loaded.checkpoint.claims.get(uid)
                    if entry is None or (entry.state == PREPARED and self._spec_path(uid).exists()):
                        continue  # finished by someone else meanwhile
                    log.warning("finishing an interrupted %s", entry.state.lower())
                    self._teardown(uid, log, "clean up at start", locks)
            except (DriverError, MoreLocks) as exc:
                log.error("could not clean up the claim at start: %s", exc)
        for key in orphans:
            try:
                with self._hold([key.split("/", 1)[0]]):
                    self._release_shared(key, None, self._log)
            except DriverError as exc:
                self._log.error("could not release shared resource %s: %s", key, exc)
        self._adopt_daemons()

    def _adopt_daemons(self) -> None:
        """MPS daemons that outlived the previous plugin (pods, or processes of a plugin
        run on the host): those a record owns are adopted, the others removed. Under the
        checkpoint lock: an overlapping plugin (rolling update) records a daemon before it
        starts it, so no daemon it is starting is taken for an orphan."""
        daemons = self._daemons
        if daemons is None:
            return
        with self._store.transaction() as loaded:
            self._handle_reboot(loaded)
            owners, must_run = daemon_owners(loaded.checkpoint)
            try:
                daemons.adopt(owners, must_run, self._log)
            except DriverError as exc:
                self._log.error("could not adopt or remove MPS daemons at start: %s", exc)

    def _teardown(self, uid: str, log: ContextLogger, what: str, locks: set[str]) -> None:
        """Undo everything recorded for ``uid`` and drop its entry; the caller holds
        ``locks``, and :class:`MoreLocks` says the entry needs more. Raises
        :class:`PrepareError` (entry kept, ``Unpreparing``) when a step failed; its
        message starts with ``what``. A claim without units has only its spec to
        remove, so no ``Unpreparing`` record precedes that: the spec is removed and the
        entry dropped in the one transaction that found it (spec first, so a crash in
        between leaves a ``Prepared`` entry without a spec, which is torn down)."""
        with self._store.transaction() as loaded:
            entry = loaded.checkpoint.claims.get(uid)
            if entry is None:
                return
            if not locks_of(entry) <= locks:
                raise MoreLocks(locks_of(entry))
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
                self._strategy(unit.strategy).undo(unit, UnitSteps(self, uid))
            except Exception as exc:
                errors.append(f"{unit.strategy}: {describe(exc)}")
        for key in sorted(entry.shared_keys()):
            try:
                self._release_shared(key, uid, log)
            except Exception as exc:
                errors.append(f"release {key}: {describe(exc)}")
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
        strategy.release(key, shared.record, UnitSteps(self, ""))
        self._on_step(f"shared-released:{key}")
        with self._store.transaction() as loaded:
            loaded.checkpoint.shared.pop(key, None)
            self._store.save(loaded.checkpoint)
        log.info("released shared resource %s", key)

    def _forget(self, uid: str) -> None:
        cdi.remove_spec(self._cdi_dir, self.kind, uid)
        for strategy in self._strategies:
            strategy.forget(uid)


def daemon_owners(checkpoint: Checkpoint) -> tuple[dict[str, str], set[str]]:
    """MPS daemon ids recorded in ``checkpoint``, each with its owner (claim UID or shared
    key); and those that must be running: a record's ``daemonId`` whose claim is prepared
    or whose shared resource is ready. Any other value of a record with a daemon id's
    shape counts as owned too, so a strategy that names it otherwise never has its daemon
    taken for an orphan (keeping a daemon in doubt costs nothing; removing one ends its
    clients' work)."""
    owners: dict[str, str] = {}
    must_run: set[str] = set()
    records = [(uid, e.state == PREPARED, u.record)
               for uid, e in checkpoint.claims.items() for u in e.units]  # fmt: skip
    records += [(key, s.state == READY, s.record) for key, s in checkpoint.shared.items()]
    for owner, ready, record in records:
        for daemon_id in _ids_in(record):
            owners[daemon_id] = owner
        named = str(record.get("daemonId", ""))
        if ready and is_mps_id(named):
            must_run.add(named)
    return owners, must_run


def _ids_in(value: object) -> Iterator[str]:
    """Strings shaped like a daemon id anywhere in a record (dicts and lists walked)."""
    if isinstance(value, str):
        if is_mps_id(value):
            yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _ids_in(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _ids_in(item)
