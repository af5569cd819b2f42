"""The kubelet's prepare/unprepare requests, from the gRPC edge to the backend.

The DRA node service (``DRAPlugin``) is served for both v1 and v1beta1: one
:class:`ClaimService` sits behind both, and the two servicers only convert
messages (the versions differ only in v1's optional ``Device.share_id``).

For every claim the kubelet names, :class:`ClaimService` validates the
reference once (:func:`~dra_driver.plugin.claims.validate_ref`); a claim the backend
has already prepared is answered from its records
(:class:`~dra_driver.plugin.backend.PreparedLookup`: no API call, so the pods of a
running job still start while the API server is down); any other is fetched
(prepare only: the request carries no content), reduced to this driver's results
on this node's pool and handed to the backend. Every
requested UID gets exactly one :class:`ClaimOutcome`; a failing claim never
fails the call. Request names are reduced to their base name here, once (the
kubelet matches containers by base name).

Concurrency: the same claim is never handled twice at once in this process
(per-UID lock). Different claims overlap when the backend declares
:class:`~dra_driver.plugin.backend.ParallelClaims` (it then orders what must be
ordered itself, across processes too); otherwise backend calls run one at a
time, and in rolling-update mode a file lock extends that to the other plugin
instance. The claim GET happens before any lock is taken, so slow API calls
never hold up other claims.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from dra_driver.errors import DriverError
from dra_driver.plugin._proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
)
from dra_driver.plugin.backend import DeviceBackend, ParallelClaims, PreparedLookup
from dra_driver.plugin.claimbook import ClaimEvents
from dra_driver.plugin.claims import (
    ClaimError,
    ClaimRef,
    PreparedDevice,
    claim_from_object,
    validate_ref,
)
from dra_driver.plugin.sockets import FileLock

ClaimGetter = Callable[[str, str], "dict[str, Any] | None"]
"""``(namespace, name) -> claim object or None when it does not exist``."""


@dataclass(frozen=True)
class ClaimOutcome:
    """What the kubelet gets back for one claim of a prepare or unprepare call."""

    devices: tuple[PreparedDevice, ...] = ()
    """Prepared devices with base request names (prepare only)."""
    error: str = ""
    """Non-empty: this claim failed; the kubelet retries it."""


class BackendNotReady(DriverError):
    """No backend yet (the plugin serves before its backend is built)."""


def _base_names(device: PreparedDevice) -> PreparedDevice:
    names = tuple(dict.fromkeys(n.split("/", 1)[0] for n in device.request_names))
    return PreparedDevice(
        names, device.pool_name, device.device_name, device.cdi_device_ids, device.share_id
    )


class ClaimService:
    """Runs prepare/unprepare for a batch of claims with the ordering rules above."""

    def __init__(
        self,
        *,
        driver_name: str,
        pool_name: str,
        backend: DeviceBackend | None,
        get_claim: ClaimGetter,
        logger: logging.Logger,
        lock_file: FileLock | None = None,
        parallel: bool | None = None,
        max_workers: int = 16,
        events: ClaimEvents | None = None,
        waiting_for: str = "the backend",
        wait_s: float = 40.0,
    ) -> None:
        """``lock_file`` (rolling-update mode) is used only for backends that run one
        claim at a time; ``parallel=False`` forces that mode for any backend. ``events``
        hears every outcome (metrics, claim status, the prepared-claim book).

        ``backend`` None: given later (:meth:`attach`); until then a claim waits up to
        ``wait_s`` (below the kubelet's 45 s) and fails naming ``waiting_for``."""
        self._events = events
        self._driver = driver_name
        self._pool = pool_name
        self._backend: DeviceBackend | None = None
        self._attached = threading.Event()
        self._start_failed = ""
        self._waiting_for = waiting_for
        self._wait_s = wait_s
        self._get_claim = get_claim
        self._log = logger
        self._parallel_setting = parallel
        self._lock_file = lock_file
        self._parallel = False
        self._file_lock: FileLock | None = None
        self._serial = threading.Lock()
        self._claims_lock = threading.Lock()
        self._claim_locks: dict[str, tuple[threading.Lock, int]] = {}
        self._workers = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="claim")
        if backend is not None:
            self.attach(backend)

    def attach(self, backend: DeviceBackend) -> None:
        """The backend, once; claims waiting for it go on."""
        parallel = self._parallel_setting
        if parallel is None:
            parallel = isinstance(backend, ParallelClaims) and backend.supports_parallel_claims
        self._parallel = parallel
        self._file_lock = None if parallel else self._lock_file
        self._backend = backend
        self._attached.set()

    def start_failed(self, reason: str) -> None:
        """No backend will come: every claim waiting for it, and every later one, fails
        now with ``reason`` (not after ``wait_s``, with the process already exiting)."""
        self._start_failed = reason
        self._attached.set()

    def _ready(self) -> DeviceBackend:
        if not self._attached.wait(self._wait_s) or self._backend is None:
            if self._start_failed:
                raise BackendNotReady(f"the plugin failed to start: {self._start_failed}")
            raise BackendNotReady(
                f"the plugin is still starting ({self._waiting_for}) after {self._wait_s:g}s"
            )
        return self._backend

    def close(self) -> None:
        self._workers.shutdown(wait=True)

    @contextmanager
    def _ordered(self, uid: str) -> Iterator[None]:
        with self._claims_lock:
            lock, users = self._claim_locks.get(uid, (threading.Lock(), 0))
            self._claim_locks[uid] = (lock, users + 1)
        try:
            with ExitStack() as stack:
                stack.enter_context(lock)
                if not self._parallel:
                    stack.enter_context(self._serial)
                if self._file_lock is not None:
                    stack.enter_context(self._file_lock.held())
                yield
        finally:
            with self._claims_lock:
                lock, users = self._claim_locks[uid]
                if users <= 1:
                    del self._claim_locks[uid]
                else:
                    self._claim_locks[uid] = (lock, users - 1)

    def _each(
        self, fn: Callable[[ClaimRef], ClaimOutcome], refs: Sequence[ClaimRef]
    ) -> dict[str, ClaimOutcome]:
        unique = list({r.uid: r for r in refs}.values())
        if len(unique) <= 1:
            return {r.uid: fn(r) for r in unique}
        return dict(zip((r.uid for r in unique), self._workers.map(fn, unique), strict=True))

    def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, ClaimOutcome]:
        """One outcome per distinct requested UID."""
        return self._each(self._prepare_one, refs)

    def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, ClaimOutcome]:
        """One outcome per distinct requested UID (never with devices)."""
        return self._each(self._unprepare_one, refs)

    def _prepare_one(self, ref: ClaimRef) -> ClaimOutcome:
        log = ref.logger(self._log)
        started = time.perf_counter()
        obj: dict[str, Any] | None = None
        try:
            validate_ref(ref)
            backend = self._ready()
            devices = self._already_prepared(backend, ref)
            if devices is None:
                try:
                    obj = self._get_claim(ref.namespace, ref.name)
                except DriverError as exc:
                    raise ClaimError(
                        f"cannot fetch claim {ref} from the API server: {exc}"
                    ) from exc
                if obj is None:
                    raise ClaimError(f"claim {ref} not found")
                claim = claim_from_object(obj, ref, driver=self._driver, pool=self._pool)
                with self._ordered(ref.uid):
                    devices = backend.prepare(claim)
        except DriverError as exc:
            log.warning("prepare failed: %s", exc)
            self._failed("prepare", ref, exc, started)
            return ClaimOutcome(error=str(exc))
        except Exception as exc:
            log.exception("prepare failed unexpectedly")
            self._failed("prepare", ref, exc, started)
            return ClaimOutcome(error=f"internal error preparing claim {ref}: {exc!r}")
        elapsed = time.perf_counter() - started
        # duration_ms: claim GET + device preparation, what the kubelet waits for.
        log.info(
            "prepared %d device(s)", len(devices), extra={"duration_ms": round(elapsed * 1000, 1)}
        )
        outcome = ClaimOutcome(devices=tuple(_base_names(d) for d in devices))
        if self._events is not None:
            self._events.prepared(ref, obj, outcome.devices, elapsed)
        return outcome

    def _already_prepared(
        self, backend: DeviceBackend, ref: ClaimRef
    ) -> list[PreparedDevice] | None:
        """The backend's recorded result for a claim it has prepared: every further pod of
        a shared claim is answered without the API server (also while it is down)."""
        if not isinstance(backend, PreparedLookup):
            return None
        with self._ordered(ref.uid):
            return backend.prepared_devices(ref)

    def _failed(self, operation: str, ref: ClaimRef, exc: BaseException, started: float) -> None:
        if self._events is not None:
            self._events.failed(operation, ref, exc, time.perf_counter() - started)

    def _unprepare_one(self, ref: ClaimRef) -> ClaimOutcome:
        log = ref.logger(self._log)
        started = time.perf_counter()
        try:
            validate_ref(ref)
            backend = self._ready()
            with self._ordered(ref.uid):
                backend.unprepare(ref)
        except DriverError as exc:
            log.warning("unprepare failed: %s", exc)
            self._failed("unprepare", ref, exc, started)
            return ClaimOutcome(error=str(exc))
        except Exception as exc:
            log.exception("unprepare failed unexpectedly")
            self._failed("unprepare", ref, exc, started)
            return ClaimOutcome(error=f"internal error unpreparing claim {ref}: {exc!r}")
        log.info("unprepared")
        if self._events is not None:
            self._events.unprepared(ref, time.perf_counter() - started)
        return ClaimOutcome()


# -- the gRPC edge ----------------------------------------------------------------


def _refs(request: Any) -> list[ClaimRef]:
    return [ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid) for c in request.claims]


def _prepare_response(pb: ModuleType, outcomes: dict[str, ClaimOutcome], share_ids: bool) -> Any:
    response = pb.NodePrepareResourcesResponse()
    for uid, outcome in outcomes.items():
        entry = response.claims[uid]
        if outcome.error:
            entry.error = outcome.error
            continue
        for d in outcome.devices:
            device = entry.devices.add(
                request_names=list(d.request_names),
                pool_name=d.pool_name,
                device_name=d.device_name,
                cdi_device_ids=list(d.cdi_device_ids),
            )
            if share_ids and d.share_id is not None:
                device.share_id = d.share_id
    return response


def _unprepare_response(pb: ModuleType, outcomes: dict[str, ClaimOutcome]) -> Any:
    response = pb.NodeUnprepareResourcesResponse()
    for uid, outcome in outcomes.items():
        response.claims[uid].error = outcome.error
    return response


class DRAPluginV1(dra_v1_pb2_grpc.DRAPluginServicer):  # type: ignore[misc]
    def __init__(self, service: ClaimService) -> None:
        self._service = service

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        return _prepare_response(dra_v1_pb2, self._service.prepare(_refs(request)), True)

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        return _unprepare_response(dra_v1_pb2, self._service.unprepare(_refs(request)))


class DRAPluginV1beta1(dra_v1beta1_pb2_grpc.DRAPluginServicer):  # type: ignore[misc]
    def __init__(self, service: ClaimService) -> None:
        self._service = service

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        return _prepare_response(dra_v1beta1_pb2, self._service.prepare(_refs(request)), False)

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        return _unprepare_response(dra_v1beta1_pb2, self._service.unprepare(_refs(request)))


def add_node_services(server: Any, service: ClaimService) -> None:
    dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(DRAPluginV1(service), server)
    dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(DRAPluginV1beta1(service), server)


def start_every_thread(pool: ThreadPoolExecutor, count: int) -> None:
    """Start all ``count`` threads of ``pool`` now, before it serves a call.

    A pool starts a thread per submit while none is idle, and gRPC submits from its one
    dispatch thread: the first burst of calls after a start paid for 15 thread starts
    in its critical path (~0.7 ms of CPU per call, docs/benchmarks.md). Threads stay
    once started, so this takes at start the memory a plugin has after its first burst.
    """
    arrived = threading.Barrier(count)  # each task holds its thread until all started
    wait_for([pool.submit(arrived.wait, 10.0) for _ in range(count)], timeout=10.0)
