"""The GPU driver as the plugin layer sees it: discovery + devices + claim preparation.

:class:`GpuDriver` implements :class:`~dra_driver.plugin.backend.DeviceBackend`.
It holds the current :class:`Inventory` (replaced whole by :meth:`refresh`,
never mutated), derives the published pool from it, and delegates claims to
:class:`~dra_driver.gpu.preparing.ClaimPreparer`, which reads the same
inventory through a callable so a prepare always sees the latest discovery.

Re-discovery (:meth:`refresh`) keeps the previous inventory when discovery as a whole
fails (NVML briefly unavailable must not empty the pool); a GPU gone leaves the pool.

Health: with a :class:`~dra_driver.gpu.monitoring.healthpolicy.HealthPolicy` the driver runs a
:class:`~dra_driver.gpu.monitoring.monitor.HealthMonitor` in the background (started by
the plugin, :meth:`start_background`). The pool is always built from one pair
(inventory, health snapshot), and the health reported to the kubelet is read
off that same pool, so slices and health stream cannot disagree: a device is
Unhealthy exactly when it carries a ``NoSchedule`` or ``NoExecute`` taint
(the degraded taint of ``--taint-degraded`` included).

Dynamic MIG (``mig_mode="dynamic"``): the preparer creates and destroys MIG
instances (:mod:`dra_driver.gpu.sharing.strategies.dynamicmig`); the pool does not
change when it does, because instances recorded in the checkpoint are the
partitions' own (``owned``), never others' instances to work around.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry

from dra_driver.errors import DriverError
from dra_driver.gpu.cdi import hooks as cdihook
from dra_driver.gpu.hardware.consumable import ConsumableGpus, MpsSlots
from dra_driver.gpu.hardware.devices import NumaAttributeForm, build_pool
from dra_driver.gpu.hardware.discovery import DiscoveryError
from dra_driver.gpu.hardware.inventory import Inventory
from dra_driver.gpu.hardware.nvml import Nvml
from dra_driver.gpu.hardware.nvmlmonitor import CallObserver
from dra_driver.gpu.hardware.partitions import MigMode, OwnedInstance, PlacementAttributes
from dra_driver.gpu.host.hostpaths import HostPaths
from dra_driver.gpu.monitoring.devicestatus import device_status
from dra_driver.gpu.monitoring.health import (
    Fault,
    HealthSnapshot,
    claim_state_taint,
    device_faults,
    health_reports,
    taints_for,
)
from dra_driver.gpu.monitoring.healthpolicy import HealthPolicy
from dra_driver.gpu.monitoring.migholders import MigHolders
from dra_driver.gpu.monitoring.monitor import HealthEvents, HealthMonitor
from dra_driver.gpu.monitoring.usage import UsageCollector, UsageSampler, targets_for
from dra_driver.gpu.preparing import ClaimPreparer
from dra_driver.gpu.sharing.miginstances import MigInstances
from dra_driver.gpu.sharing.mpsrunners import DaemonRunner
from dra_driver.gpu.sharing.slots import fractional_pool, say_fractional
from dra_driver.gpu.sharing.strategies.dynamicmig import owned_by
from dra_driver.gpu.sharing.tools import GpuTools
from dra_driver.plugin.backend import DeviceHealth
from dra_driver.plugin.claimbook import PreparedClaim
from dra_driver.plugin.claims import Claim, ClaimRef, PreparedDevice
from dra_driver.plugin.claimstatus import DeviceStatus
from dra_driver.plugin.resources import Pool

DEFAULT_HEALTH_POLICY = HealthPolicy()


class GpuDriver:
    """DeviceBackend for NVIDIA GPUs; thread-safe."""

    supports_parallel_claims = ClaimPreparer.supports_parallel_claims
    prepare: Callable[[Claim], list[PreparedDevice]]
    prepared_devices: Callable[[ClaimRef], list[PreparedDevice] | None]
    unprepare: Callable[[ClaimRef], None]
    prepared_claims: Callable[[], list[ClaimRef]]
    """The DeviceBackend claim calls: the :class:`ClaimPreparer`'s own methods."""

    def __init__(
        self,
        *,
        driver_name: str,
        discover: Callable[[], Inventory],
        host: HostPaths,
        cdi_dir: Path,
        state_dir: Path,
        tools: GpuTools,
        logger: logging.Logger,
        pool_name: str,
        taint_degraded: bool = False,
        runtime_host: HostPaths | None = None,
        health_policy: HealthPolicy | None = DEFAULT_HEALTH_POLICY,
        numa_attribute_form: NumaAttributeForm = "scalar",
        nvml_observer: CallObserver | None = None,
        health_events: HealthEvents | None = None,
        usage_interval_s: float = 10.0,
        registry: CollectorRegistry | None = None,
        mig_mode: MigMode = "static",
        placement_attributes: PlacementAttributes = "full",
        consumable: ConsumableGpus | None = None,
        mps_slots: MpsSlots | None = None,
        cdi_hook: cdihook.HookPlacement | None = None,
        stop_wait_s: float | None = None,
        mps_runner: DaemonRunner | None = None,
    ) -> None:
        """Runs the first discovery now, so a node without a usable driver fails at start,
        then finishes whatever prepare or unprepare a previous process left half done.

        ``runtime_host`` is how the container runtime names the host's paths when
        this process sees them elsewhere (see :class:`~dra_driver.gpu.cdiedits.EditsBuilder`).
        ``health_policy`` None: no health monitoring (devices are healthy unless degraded).
        ``nvml_observer`` and ``health_events`` receive the monitor's NVML calls and
        what it saw (metrics). With a ``registry``, per-claim GPU usage is sampled every
        ``usage_interval_s`` (0: never) once the plugin hands over its prepared claims.
        ``consumable``, ``mps_slots``: GPUs shared (``--consumable-gpus``, ``--mps-slots``;
        :mod:`dra_driver.gpu.sharing.slots`). ``cdi_hook``: where NVIDIA's ``nvidia-cdi-hook`` goes
        on the host and where it comes from (installed now; None: the specs name the
        toolkit's ``/usr/bin/nvidia-cdi-hook`` and nothing is installed or checked).
        ``stop_wait_s``: how long :meth:`stop_background` waits for NVML event waits (None:
        all). ``mps_runner``: what starts MPS daemons (None: this process's children)."""
        self._driver_name = driver_name
        self._pool_name = pool_name
        self._discover = discover
        self._log = logger
        self._taint_degraded = taint_degraded
        self._numa_form: NumaAttributeForm = numa_attribute_form
        self._mig_mode, self._placement_attributes = mig_mode, placement_attributes
        self._consumable = consumable or ConsumableGpus()
        self._slots = mps_slots or MpsSlots()
        self._lock = threading.Lock()
        self._stop_wait_s = stop_wait_s
        self._monitor = (
            HealthMonitor(
                nvml=Nvml(observer=nvml_observer),
                policy=health_policy,
                logger=logger.getChild("health"),
                events=health_events,
            )
            if health_policy is not None
            else None
        )
        self._health = HealthSnapshot()
        self._notify: Callable[[], None] | None = None
        self._claims: Callable[[], list[PreparedClaim]] = list
        self._usage = (
            UsageSampler(
                nvml=Nvml(observer=nvml_observer),
                host=host,
                targets=lambda: targets_for(self._claims(), self.inventory(), self._sharing()),
                interval_s=usage_interval_s,
                logger=logger.getChild("usage"),
            )
            if registry is not None and usage_interval_s > 0
            else None
        )
        if self._usage is not None and registry is not None:
            registry.register(UsageCollector(self._usage))
        self._mig = (
            MigInstances(
                host=host, logger=logger.getChild("mig"), nvml=Nvml(observer=nvml_observer)
            )
            if mig_mode == "dynamic"
            else None
        )
        self._owned: frozenset[OwnedInstance] = frozenset()
        self._state_problem = ""
        self._hook = cdi_hook
        self._hook_problem = ""
        self._inventory = discover()
        say_fractional(self._consumable, self._slots, self._inventory, logger)
        self._preparer = ClaimPreparer(
            driver_name=driver_name,
            # The current inventory, read as one attribute (atomic; no lock needed).
            inventory=functools.partial(getattr, self, "_inventory"),
            host=host,
            cdi_dir=cdi_dir,
            state_dir=state_dir,
            logger=logger,
            tools=tools,
            runtime_host=runtime_host,
            cdi_hook=cdi_hook.path if cdi_hook is not None else cdihook.TOOLKIT_HOOK,
            mig_instances=self._mig,
            on_state_problem=self._state_changed,
            mps_slots=self._slots,
            mps_runner=mps_runner,
        )
        # Claim calls go straight to the preparer (dynamic MIG: faults then follow instances).
        self.prepare = self._preparer.prepare
        self.prepared_devices = self._preparer.prepared_devices
        self.unprepare = self._preparer.unprepare
        self.prepared_claims = self._preparer.prepared_claims
        book = self._monitor.book if self._monitor is not None else None
        self._holders = MigHolders(read=self._preparer.recorded_claims, book=book)
        if self._mig is not None:
            rebuild = functools.partial(self._health_changed, rebuild=True)
            self.prepare = self._holders.following(self.prepare, rebuild)
            self.unprepare = self._holders.following(self.unprepare, rebuild)
        self._place_hook()
        self._preparer.warm()
        self._pool = self._build(self._inventory, self._health)
        try:
            self._preparer.recover()
        except DriverError as exc:  # serve anyway: not ready, devices tainted (problems())
            logger.error("claim state cannot be read; claims will fail until fixed: %s", exc)
        if self._mig is not None:  # recover() may have destroyed leftover instances
            self._inventory = self._discover_owned()
        self._pool = self._build(self._inventory, self._health)

    def _discover_owned(self) -> Inventory:
        """Discover, and note which GPU instances are ours (dynamic MIG): recorded before
        or after discovery, so one created or removed meanwhile is not taken for another's."""
        before = self._recorded_instances()
        inventory = self._discover()
        self._owned = frozenset(before | self._recorded_instances())
        if self._mig is not None:
            self._mig.note_discovery(self._owned)
            self._holders.update()
        return inventory

    def _faults(self, health: HealthSnapshot, inventory: Inventory) -> dict[str, list[Fault]]:
        dynamic = self._holders.view(self._owned) if self._mig is not None else None
        return device_faults(health, inventory, dynamic)

    def _recorded_instances(self) -> set[OwnedInstance]:
        if self._mig is None:
            return set()
        try:
            return owned_by(self._preparer.recorded_units())
        except DriverError:  # unreadable checkpoint: not ready and tainted (problems())
            return set()

    def _build(self, inventory: Inventory, health: HealthSnapshot) -> Pool:
        policy = self._monitor.policy if self._monitor is not None else HealthPolicy()
        taints = {
            name: taints_for(faults, driver_name=self._driver_name, policy=policy)
            for name, faults in self._faults(health, inventory).items()
        }
        pool = build_pool(
            inventory,
            driver_name=self._driver_name,
            taint_degraded=self._taint_degraded,
            numa_attribute_form=self._numa_form,
            taints=taints,
            mig_mode=self._mig_mode,
            owned=self._owned,
            placement_attributes=self._placement_attributes,
        )
        pool = fractional_pool(pool, inventory, self._consumable, self._slots)
        if not self._state_problem:
            return pool
        stop = claim_state_taint(self._driver_name)
        devices = tuple(dataclasses.replace(d, taints=(*d.taints, stop)) for d in pool.devices)
        return dataclasses.replace(pool, devices=devices)

    def inventory(self) -> Inventory:
        with self._lock:
            return self._inventory

    def _state_changed(self) -> None:
        """The checkpoint became unreadable, or readable again: taint or untaint every
        device, and republish at once."""
        problem = self._preparer.state_problem()
        with self._lock:
            if problem == self._state_problem:
                return
            self._state_problem = problem
            self._pool = self._build(self._inventory, self._health)
        if problem:
            self._log.error("claim state unreadable, all devices tainted: %s", problem)
        else:
            self._log.info("claim state readable again; devices untainted")
        if self._notify is not None:
            self._notify()

    def _place_hook(self) -> None:
        """Install and check the CDI hook; say so once when that fails or recovers."""
        if self._hook is None:
            return
        problem = cdihook.install(self._hook.source, self._hook.local)
        if problem and problem != self._hook_problem:
            self._log.error("this node prepares no claims until the CDI hook is fixed: %s", problem)
        elif not problem and self._hook_problem:
            self._log.info("CDI hook usable again", extra={"path": str(self._hook.path)})
        self._hook_problem = self._preparer.hook_problem = problem

    def problems(self) -> list[str]:
        """StatusReporter: the plugin is not ready while the claim state is unreadable or
        the CDI hook cannot be run."""
        problem = self._preparer.state_problem()
        found = [f"claim state: {problem}"] if problem else []
        return found + ([self._hook_problem] if self._hook_problem else [])

    def refresh(self) -> bool:
        """Discover again (and re-read the claim state if it was unreadable); True when the
        published pool changed (caller republishes)."""
        if self._state_problem:
            self._preparer.check_state()  # taints go with the next pool once it is fixed
        if self._hook_problem:
            self._place_hook()
        try:
            inventory = self._discover_owned()
        except DiscoveryError as exc:
            self._log.error("re-discovery failed; keeping the previous inventory: %s", exc)
            return False
        if self._monitor is not None:
            self._monitor.track(inventory)
        latest = self._monitor.book.snapshot() if self._monitor is not None else self._health
        with self._lock:  # the latest faults: re-discovery may have dropped some
            self._health = max(latest, self._health, key=lambda h: h.version)
            pool = self._build(inventory, self._health)
            changed = pool != self._pool
            self._inventory, self._pool = inventory, pool
        if changed:
            self._log.info("pool changed", extra={"devices": len(pool.devices)})
        return changed

    # ---- health monitoring (BackgroundWork) ----
    def start_background(self, notify: Callable[[], None]) -> None:
        """Start the health monitor and the usage sampler; ``notify`` republishes after
        every health change."""
        self._notify = notify
        if self._monitor is not None:
            self._monitor.on_change = self._health_changed
            self._monitor.start(self.inventory())
            self._health_changed()
        if self._usage is not None:
            self._usage.start()

    def stop_background(self) -> None:
        if self._usage is not None:
            self._usage.stop()
        if self._monitor is not None:
            self._monitor.stop(wait_s=self._stop_wait_s)

    def _sharing(self) -> dict[str, str]:
        names = {"MPS": "mps", "TimeSlicing": "time-slicing", "MpsShares": "mps",
                 "MpsSlots": "mps", "TimeSlicedShares": "time-slicing"}  # fmt: skip
        return {uid: names.get(s, "exclusive") for uid, s in self._preparer.strategies().items()}

    def watch_claims(self, claims: Callable[[], list[PreparedClaim]]) -> None:
        """The plugin's prepared claims (devices and pods), for per-claim usage metrics."""
        self._claims = claims

    @property
    def usage(self) -> UsageSampler | None:
        return self._usage

    def _health_changed(self, *, rebuild: bool = False) -> None:
        """Republish with the book's faults if they changed (``rebuild``: or their mapping)."""
        if self._monitor is None:
            return
        snapshot = self._monitor.book.snapshot()
        with self._lock:
            if (snapshot.version, rebuild) <= (self._health.version, False):
                return  # no change, or an older snapshot arriving late from another thread
            self._health = snapshot
            pool = self._build(self._inventory, snapshot)
            changed = pool != self._pool
            self._pool = pool
        if changed and self._notify is not None:
            self._notify()

    @property
    def monitor(self) -> HealthMonitor | None:
        return self._monitor

    # ---- DeviceBackend ----
    def pool(self) -> Pool:
        with self._lock:
            return self._pool

    def close(self) -> None:
        self._preparer.close()
        if self._mig is not None:
            self._mig.close()

    # ---- DeviceStatusReporter (claim status.devices) ----
    def device_status(self, devices: Sequence[PreparedDevice]) -> list[DeviceStatus]:
        with self._lock:
            pool, health, inventory = self._pool, self._health, self._inventory
        published = {d.name: d for d in pool.devices}
        faults = self._faults(health, inventory)
        return [
            device_status(name, inventory, published.get(name), faults.get(name, []))
            for name in (d.device_name for d in devices)
        ]

    # ---- HealthReporter ----
    def device_health(self) -> list[DeviceHealth]:
        """Read off the published pool (:func:`.monitoring.health.health_reports`)."""
        with self._lock:
            pool, health, inventory = self._pool, self._health, self._inventory
        return health_reports(pool, self._faults(health, inventory), self._pool_name)
