"""Watches the node's GPUs through NVML and keeps the health book
(:class:`~dra_driver.gpu.monitoring.health.HealthBook`).

Threads (named, guarded: a crash is logged and the thread restarts after a
pause):

- ``nvml-events-<uuid prefix>``, one per GPU: registers the GPU's critical
  events (Xid, double-bit ECC, GPU unavailable, recovery action) in its own
  NVML event set and waits on it, so a lost GPU never blocks the others. A GPU
  that cannot register events is marked ``unmonitored`` (informational).
- ``gpu-health-check``: every ``check_interval_s`` asks each GPU what events
  cannot tell: does it answer at all (fallen off the bus), which recovery
  action NVML wants, did its uncorrected ECC count grow. A pending recovery
  action becomes a fault; a clean answer counts towards the healthy period
  that clears faults. A recovery-action event triggers this check at once.

Every change of the book calls ``on_change`` (outside any lock), which the GPU
driver turns into new taints and a republish.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from dra_driver.gpu.hardware.inventory import Inventory
from dra_driver.gpu.hardware.nvml import NVML_ERROR_NOT_FOUND, Nvml, NvmlError
from dra_driver.gpu.hardware.nvmlmonitor import (
    EVENT_DOUBLE_BIT_ECC,
    EVENT_GPU_UNAVAILABLE,
    EVENT_RECOVERY_ACTION,
    EVENT_XID_CRITICAL,
    Event,
)
from dra_driver.gpu.monitoring.health import Fault, HealthBook, recovery_fault
from dra_driver.gpu.monitoring.healthpolicy import HealthPolicy, Severity
from dra_driver.retries import Retry

WANTED_EVENTS = (
    EVENT_XID_CRITICAL | EVENT_DOUBLE_BIT_ECC | EVENT_GPU_UNAVAILABLE | EVENT_RECOVERY_ACTION
)


class HealthEvents(Protocol):
    """Where the monitor counts what it saw (metrics); optional."""

    def xid(self, uuid: str, xid: int) -> None: ...

    def fault(self, uuid: str, kind: str) -> None: ...


class HealthMonitor:
    def __init__(
        self,
        *,
        nvml: Nvml,
        policy: HealthPolicy,
        logger: logging.Logger,
        on_change: Callable[[], None] = lambda: None,
        events: HealthEvents | None = None,
        event_wait_ms: int = 500,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.book = HealthBook(policy)
        self.policy = policy
        self.on_change = on_change
        self._nvml = nvml
        self._log = logger
        self._events = events
        self._wait_ms = event_wait_ms
        self._clock = clock
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._watchers: dict[str, tuple[threading.Thread, threading.Event]] = {}
        self._tracked: set[str] = set()
        self._ecc: dict[str, int] = {}
        self._stop = threading.Event()
        self._checker: threading.Thread | None = None
        self._started = False

    # ---- lifecycle -----------------------------------------------------------------------
    def start(self, inventory: Inventory) -> None:
        """Open the NVML session, check every GPU once, then watch events and check periodically."""
        self._nvml.init()
        self._started = True
        self.track(inventory)
        self.check_now()
        self._checker = threading.Thread(
            target=self._guard, args=("gpu-health-check", self._check_loop),
            name="gpu-health-check", daemon=True,
        )  # fmt: skip
        self._checker.start()

    def stop(self, *, wait_s: float | None = None) -> None:
        """Stop every thread; shut NVML down once no event wait is left in it.

        An event thread sits in ``nvmlEventSetWait`` for up to ``event_wait_ms`` and NVML
        offers no way to wake it, so waiting for all of them made SIGTERM to exit take
        the wait's length (334 ms measured with 500 ms waits). With ``wait_s`` the
        threads get that long (the daemon passes a short time when the process is about
        to exit); a wait still in NVML then keeps NVML initialised, since
        ``nvmlShutdown`` must not race with it, and the process's exit frees both.
        ``None`` waits for every thread (tests, and any caller that goes on running).
        """
        self._stop.set()
        with self._lock:
            watchers = list(self._watchers.values())
            self._watchers.clear()
        for _, stop in watchers:
            stop.set()
        deadline = None if wait_s is None else self._monotonic() + wait_s

        def left(unbounded: float) -> float:
            return unbounded if deadline is None else max(0.0, deadline - self._monotonic())

        for thread, _ in watchers:
            thread.join(timeout=left(self._wait_ms / 1000 + 5))
        if self._checker is not None:
            self._checker.join(timeout=left(10))
        waiting = [t.name for t, _ in watchers if t.is_alive()]
        if self._checker is not None and self._checker.is_alive():
            waiting.append(self._checker.name)
        if not self._started:
            return
        if waiting:
            self._log.debug("NVML left to the process's exit", extra={"threads": len(waiting)})
            return
        self._started = False
        try:
            self._nvml.shutdown()
        except NvmlError as exc:
            self._log.warning("NVML shutdown failed: %s", exc)

    def track(self, inventory: Inventory) -> None:
        """Watch the inventory's GPUs, and keep watching faulty GPUs that left it (a lost
        GPU vanishes from discovery but must pass the healthy period when it returns)."""
        wanted = {g.uuid for g in inventory.gpus if g.uuid} | self.book.faulty()
        self.book.forget(wanted)
        with self._lock:
            self._tracked = wanted
            if not self._started:
                return  # start() watches what is tracked then
            for uuid in set(self._watchers) - wanted:
                self._watchers.pop(uuid)[1].set()
            for uuid in wanted - set(self._watchers):
                stop = threading.Event()
                name = f"nvml-events-{uuid.removeprefix('GPU-')[:8]}"
                thread = threading.Thread(
                    target=self._guard, args=(name, lambda u=uuid, s=stop: self._watch(u, s)),
                    name=name, daemon=True,
                )  # fmt: skip
                self._watchers[uuid] = (thread, stop)
                thread.start()

    def _guard(self, name: str, target: Callable[[], None]) -> None:
        retry = Retry(f"health thread {name}", self._log, initial_s=5.0, max_s=300.0)
        while not self._stop.is_set():
            try:
                target()
                return
            except Exception as exc:
                self._stop.wait(retry.failed(exc))

    # ---- faults --------------------------------------------------------------------------
    def _record(self, uuid: str, fault: Fault) -> None:
        if self._events is not None:
            self._events.fault(uuid, fault.kind)
        if self.book.record(uuid, fault):
            self._log.warning(
                "GPU fault",
                extra={"uuid": uuid, "kind": fault.kind, "value": fault.value,
                       "severity": fault.severity.name.lower(), "scope": fault.scope,
                       "detail": fault.message},
            )  # fmt: skip
            self.on_change()

    def _lost(self, uuid: str, exc: NvmlError | str) -> None:
        self._record(uuid, Fault("gpu-lost", "unreachable", Severity.FATAL, self._clock(),
                                 f"GPU unreachable: {exc}"))  # fmt: skip

    # ---- events --------------------------------------------------------------------------
    def _watch(self, uuid: str, stop: threading.Event) -> None:
        retry = Retry(f"NVML event watch of {uuid}", self._log, initial_s=1.0, max_s=60.0)
        while not stop.is_set() and not self._stop.is_set():
            try:
                self._watch_once(uuid, stop)
                return
            except NvmlError as exc:
                delay = retry.failed(exc)
                if exc.gpu_lost or exc.code == NVML_ERROR_NOT_FOUND:
                    self._lost(uuid, exc)
                elif exc.not_supported:
                    message = f"NVML events unavailable: {exc}"
                    fault = Fault("unmonitored", "events-unsupported", Severity.INFO,
                                  self._clock(), message)  # fmt: skip
                    self._record(uuid, fault)
                    delay = 60.0
            stop.wait(delay)

    def _watch_once(self, uuid: str, stop: threading.Event) -> None:
        handle = self._nvml.handle_by_uuid(uuid)
        event_set = self._nvml.event_set_create()
        try:
            mask = self._nvml.supported_event_types(handle) & WANTED_EVENTS
            if not mask & EVENT_XID_CRITICAL:
                raise NvmlError("nvmlDeviceGetSupportedEventTypes", 3, "no Xid events")
            self._nvml.register_events(handle, mask, event_set)
            if self.book.drop(uuid, "unmonitored"):
                self.on_change()
            while not stop.is_set():
                event = self._nvml.event_set_wait(event_set, self._wait_ms)
                if event is not None:
                    self._on_event(uuid, event)
        finally:
            try:
                self._nvml.event_set_free(event_set)
            except NvmlError:
                pass

    def _on_event(self, uuid: str, event: Event) -> None:
        now = self._clock()
        scope = (
            (event.gi_id, event.ci_id)
            if event.gi_id is not None and event.ci_id is not None
            else None
        )
        if event.event_type & EVENT_XID_CRITICAL:
            xid = event.data
            if self._events is not None:
                self._events.xid(uuid, xid)
            severity = self.policy.xid_severity(xid)
            if severity is None:
                self._log.info("ignored Xid", extra={"uuid": uuid, "xid": xid, "scope": scope})
                return
            self._record(
                uuid, Fault("xid", str(xid), severity, now, f"Xid {xid} reported by NVML", scope)
            )
        elif event.event_type & EVENT_DOUBLE_BIT_ECC:
            self._record(uuid, Fault("ecc", "double-bit", Severity.FATAL, now,
                                     "double-bit ECC error", scope))  # fmt: skip
        elif event.event_type & EVENT_GPU_UNAVAILABLE:
            self._lost(uuid, "NVML reported the GPU unavailable")
        elif event.event_type & EVENT_RECOVERY_ACTION:
            self._check_gpu(uuid)

    # ---- periodic checks -----------------------------------------------------------------
    def _check_loop(self) -> None:
        while not self._stop.wait(self.policy.check_interval_s):
            self.check_now()

    def check_now(self) -> None:
        """One check of every tracked GPU, now (also what the periodic thread runs)."""
        with self._lock:
            tracked = sorted(self._tracked)
        for uuid in tracked:
            self._check_gpu(uuid)

    def _check_gpu(self, uuid: str) -> None:
        now, mono = self._clock(), self._monotonic()
        try:
            handle = self._nvml.handle_by_uuid(uuid)
            self._nvml.memory_used(handle)  # any real query: a lost GPU fails here
            try:
                action, known = self._nvml.recovery_action(handle), True
            except NvmlError as exc:
                if not exc.not_supported:
                    raise
                action, known = 0, False
            try:
                ecc: int | None = self._nvml.uncorrected_ecc_errors(handle)
            except NvmlError as exc:
                if not exc.not_supported:
                    raise
                ecc = None
        except NvmlError as exc:
            self.book.check_failed(uuid)
            if exc.gpu_lost or exc.code == NVML_ERROR_NOT_FOUND:
                self._lost(uuid, exc)
            else:
                self._log.warning(
                    "GPU health check failed", extra={"uuid": uuid, "error": str(exc)}
                )
            return
        grew = ecc is not None and ecc > self._ecc.get(uuid, ecc)
        if ecc is not None:
            self._ecc[uuid] = ecc
        if grew:
            self._record(uuid, Fault("ecc", "double-bit", Severity.FATAL, now,
                                     f"uncorrected ECC errors rose to {ecc}"))  # fmt: skip
        if action:
            self._record(uuid, recovery_fault(action, now))
        if grew or action:
            self.book.check_failed(uuid)
        elif self.book.check_passed(uuid, mono, recovery_known=known):
            self._log.info("GPU healthy again: faults cleared", extra={"uuid": uuid})
            self.on_change()
