"""The checkpoint on disk: one lock, read (with migration and reboot detection), write;
and :class:`ClaimRecords`, what prepare and unprepare share on top of it (GPU locks,
strategies, the reboot cleanup, :class:`UnitSteps`).

Every read-modify-write of ``<state_dir>/checkpoint.json`` happens inside
:meth:`CheckpointStore.transaction`, under the ``checkpoint`` lock
(``checkpoint.lock``, the file plugin 0.1 locked too, so an old and a new
instance overlapping in a rolling update exclude each other). The lock is held
only while the file is read, changed in memory and written; never while a GPU
tool runs.

Writes go to ``checkpoint.json.spare``, which then takes the file's place in
one step (:func:`~dra_driver.gpu.host.files.write_via_spare`, mode 0600; the spare
keeps the previous content and is overwritten by the next write, under the
lock): a reader, or a process killed mid-write, sees the old or the new file,
never a mix. The JSON is compact; ``jq . checkpoint.json`` shows it to people.

There is no fsync, on purpose: an fsync protects data against a power loss or
kernel crash, i.e. a reboot, and everything the file describes
(device settings, MPS daemons and their tmpfs, ``/var/run/cdi``) is gone after
a reboot anyway. After one, the file's ``nodeBootID`` differs from the running
kernel's and all its state is discarded (strategies remove their files). A file
that a crash left torn or empty was last written before this boot: it is
recognised by its modification time (older than the boot) and discarded the
same way instead of being reported corrupt.

Corrupt file written in this boot: :class:`CheckpointCorruptError`; nothing
overwrites it, because it is the only record of what must be undone. Recovery
(docs/claim-state.md): stop the plugin, move the file aside,
start the plugin.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dra_driver.errors import DriverError
from dra_driver.gpu.cdi import spec as cdi
from dra_driver.gpu.checkpoint import (
    UNPREPARING,
    VERSION,
    Checkpoint,
    CheckpointCorruptError,
    CheckpointError,
    ClaimEntry,
    Encoder,
    Unit,
    decode,
    migrate_v1,
)
from dra_driver.gpu.host.files import (
    CdiError,
    LockTimeout,
    NodeLocks,
    read_whole,
    temp_files_for,
    write_via_spare,
)
from dra_driver.gpu.planning import SharingStrategy
from dra_driver.plugin.claims import PrepareError

if TYPE_CHECKING:
    from dra_driver.gpu.planning import Strategies
    from dra_driver.gpu.sharing.mpsdaemons import MpsDaemons

FILE_NAME = "checkpoint.json"
SPARE_NAME = "checkpoint.json.spare"
"""The previous content, overwritten by the next write (see the module docstring)."""
LOCK_NAME = "checkpoint"


@dataclass
class Loaded:
    checkpoint: Checkpoint
    rebooted: bool = False
    """The file held state of a previous boot, which was discarded: clean up its files."""


class CheckpointStore:
    def __init__(
        self,
        *,
        state_dir: Path,
        proc_dir: Path,
        logger: logging.Logger,
        lock_timeout_s: float = 10.0,
        on_problem: Callable[[], None] | None = None,
    ) -> None:
        """``proc_dir`` is the host's procfs (boot ID and uptime). ``on_problem`` is called
        when :attr:`problem` changes (the file became unreadable, or readable again)."""
        self.path = state_dir / FILE_NAME
        self._spare = state_dir / SPARE_NAME
        self._state_dir = state_dir
        self._dir_made = False
        self._boot_id_path = proc_dir / "sys" / "kernel" / "random" / "boot_id"
        self._uptime_path = proc_dir / "uptime"
        self._log = logger
        self._lock_timeout_s = lock_timeout_s
        self._locks = NodeLocks(state_dir)
        self._on_problem = on_problem
        self._last: tuple[bytes, Checkpoint] | None = None
        """The bytes last decoded and their checkpoint, never handed out (copies are)."""
        self._encoder = Encoder()
        self.problem = ""
        """Why the file cannot be used ("" when it can), as of the last read."""

    def close(self) -> None:
        self._locks.close()

    def boot_id(self) -> str:
        """Read every transaction (a reboot is noticed by the next call), hence with
        plain file descriptor calls, not a buffered file object."""
        try:
            fd = os.open(self._boot_id_path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                data = os.read(fd, 256)
            finally:
                os.close(fd)
        except OSError as exc:
            raise CheckpointError(f"read boot ID {self._boot_id_path}: {exc.strerror}") from exc
        return data.decode(errors="replace").strip()

    @contextmanager
    def transaction(self) -> Iterator[Loaded]:
        """Hold the checkpoint lock and yield the current checkpoint; call :meth:`save`
        to write changes before leaving."""
        if not self._dir_made:  # once: a mkdir per transaction cost more than the lock
            try:
                self._state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError as exc:
                raise CheckpointError(
                    f"create state dir {self._state_dir}: {exc.strerror}"
                ) from exc
            self._dir_made = True
        try:
            taken = self._locks.acquire([LOCK_NAME], timeout_s=self._lock_timeout_s)
        except LockTimeout as exc:
            raise CheckpointError(
                f"{self._locks.path(LOCK_NAME)}: {exc}; is a second plugin instance stuck?"
            ) from exc
        except OSError as exc:
            raise CheckpointError(f"lock {self._locks.path(LOCK_NAME)}: {exc.strerror}") from exc
        try:
            loaded = self._load()
        except CheckpointError as exc:
            self._set_problem(str(exc))
            raise
        else:
            self._set_problem("")
            yield loaded
        finally:
            self._locks.release(taken)

    def _load(self) -> Loaded:
        boot_id = self.boot_id()
        try:
            data = read_whole(self.path)
        except FileNotFoundError:
            return Loaded(Checkpoint(boot_id=boot_id))
        except OSError as exc:
            raise CheckpointError(f"read {self.path}: {exc.strerror}") from exc
        try:
            checkpoint = self._decode(data)
        except (ValueError, CheckpointCorruptError) as exc:
            if self._written_before_boot():
                self._log.warning(
                    "checkpoint %s from before this boot is unreadable (%s); discarding it",
                    self.path,
                    exc,
                )
                return Loaded(Checkpoint(boot_id=boot_id), rebooted=True)
            raise CheckpointCorruptError(
                f"checkpoint {self.path} is corrupt: {exc}. Prepare and unprepare are refused "
                "so no state is lost; recovery: stop the plugin, move the file aside, start "
                "it again"
            ) from exc
        if checkpoint.boot_id != boot_id:
            stale = len(checkpoint.claims)
            self._log.warning("node rebooted; discarding %d claim(s) prepared before", stale)
            checkpoint.boot_id = boot_id
            checkpoint.claims.clear()
            checkpoint.shared.clear()
            return Loaded(checkpoint, rebooted=True)
        return Loaded(checkpoint)

    def _set_problem(self, problem: str) -> None:
        if problem != self.problem:
            self.problem = problem
            if self._on_problem is not None:
                self._on_problem()

    def _decode(self, data: bytes) -> Checkpoint:
        """The file's content as a checkpoint the caller may change.

        Every transaction but the first finds the bytes the previous one read or
        wrote: those are not parsed again, a copy of that checkpoint is returned. Only
        identical bytes count, never a timestamp (coarse) or an inode (reused). Called
        under the lock, so one caller at a time."""
        if self._last is not None and self._last[0] == data:
            return self._last[1].copy()
        raw = json.loads(data)
        if not isinstance(raw, dict):
            raise CheckpointCorruptError("the top level is not a JSON object")
        version = raw.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise CheckpointCorruptError(f"'version' is {version!r}, expected 1 or 2")
        if version > VERSION:
            raise CheckpointError(
                f"{self.path} has version {version}, written by a newer incompatible "
                f"plugin; this plugin reads versions 1 and {VERSION}. Roll forward, or "
                "move the file aside."
            )
        checkpoint = decode(migrate_v1(raw) if version == 1 else raw)
        self._last = (data, checkpoint.copy())
        return checkpoint

    def _written_before_boot(self) -> bool:
        """The unreadable file was last changed before this boot (stat now: the lock is
        held, so it is the file just read)."""
        try:
            mtime = self.path.stat().st_mtime
            uptime = float(self._uptime_path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return False
        return mtime < time.time() - uptime

    def save(self, checkpoint: Checkpoint) -> None:
        """Atomic replace, inside :meth:`transaction` only: the lock makes this process
        the spare's only writer (see the module docstring for why without fsync)."""
        data = self._encoder.dumps(checkpoint)
        try:
            write_via_spare(self.path, self._spare, data, mode=0o600)
        except CdiError as exc:
            raise CheckpointError(str(exc)) from exc
        # The next transaction reads these bytes back: it gets a copy of what was
        # saved instead of decoding them (unless another writer changed the file).
        self._last = (data, checkpoint.copy())

    def remove_temp_files(self, older_than_s: float = 60.0) -> None:
        """Temp files that a killed write of a plugin before the spare file left (never
        read: not ``*.json``); only old ones, since such an instance may be writing one
        right now during a rolling update."""
        now = time.time()
        for tmp in temp_files_for(self.path):
            try:
                if now - tmp.stat().st_mtime > older_than_s:
                    tmp.unlink(missing_ok=True)
            except FileNotFoundError:
                pass


class ClaimRecords:
    """What both directions of the claim pipeline work under: the checkpoint, the GPU
    locks, the strategies and the CDI spec dir, with the helpers they share
    (:class:`~dra_driver.gpu.preparing.ClaimPreparer` sets the fields)."""

    kind: str
    _cdi_dir: Path
    _log: logging.Logger
    _store: CheckpointStore
    _locks: NodeLocks
    _gpu_lock_timeout_s: float
    _strategies: Strategies
    _on_step: Callable[[str], None]
    _daemons: MpsDaemons | None
    """The node's MPS daemons, adopted or removed at start (None: no MPS strategy)."""

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

    def _spec_path(self, uid: str) -> Path:
        return cdi.transient_spec_path(self._cdi_dir, self.kind, uid)

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


class UnitSteps:
    """A strategy's view of the pipeline while it acts on one unit."""

    def __init__(
        self, preparer: ClaimRecords, uid: str, units: list[Unit] | None = None, index: int = 0
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


class MoreLocks(Exception):
    """The claim's entry names GPUs the caller does not hold (it changed while we waited):
    retry holding these too."""

    def __init__(self, locks: set[str]) -> None:
        super().__init__(f"the claim now needs GPU locks {sorted(locks)}")
        self.locks = locks


def describe(exc: BaseException) -> str:
    """An error for the kubelet: ours as they are, others with their type."""
    return str(exc) if isinstance(exc, DriverError) else f"{type(exc).__name__}: {exc}"


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
