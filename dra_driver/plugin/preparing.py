"""Prepare/unprepare plumbing between the kubelet's request and the backend.

For every claim the kubelet names, the claim object is fetched from the API
server (the request only carries namespace/name/uid), checked (same UID,
allocated), reduced to our driver's results and opaque configs, and handed to
the backend as a typed :class:`~dra_driver.plugin.claims.Claim`. Every
requested UID gets exactly one outcome; a failing claim never fails the call.

Concurrency: the same claim is never handled twice at once (per-UID lock).
Different claims run in parallel only when the backend declares
:class:`~dra_driver.plugin.backend.ParallelClaims`; otherwise backend calls
are serialised. In rolling-update mode a file lock additionally serialises
them across the two overlapping plugin processes. The claim GET happens
before any lock is taken, so slow API calls do not hold up other claims.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

from dra_driver.logs import claim_logger
from dra_driver.plugin.backend import (
    DeviceBackend,
    ParallelClaims,
    PreparedDevice,
    PrepareError,
)
from dra_driver.plugin.claims import AllocatedDevice, Claim, ClaimRef, OpaqueConfig
from dra_driver.plugin.sockets import FileLock

ClaimGetter = Callable[[str, str], "dict[str, Any] | None"]
"""``(namespace, name) -> claim object or None when it does not exist``."""


class ClaimCheckError(Exception):
    """The claim object does not allow preparing (gone, re-created, not allocated)."""


_UID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,127}$")


def check_uid(ref: ClaimRef) -> None:
    """Backends key files by claim UID: reject anything that is not UID-shaped."""
    if not _UID_RE.match(ref.uid):
        raise ClaimCheckError(
            f"claim uid {ref.uid!r} is invalid: expected letters, digits and '-' (max 128)"
        )


def claim_from_object(obj: dict[str, Any], ref: ClaimRef, driver: str) -> Claim:
    """Typed, driver-filtered view of an API ResourceClaim; raises ClaimCheckError."""
    uid = (obj.get("metadata") or {}).get("uid")
    if uid != ref.uid:
        raise ClaimCheckError(
            f"claim {ref.namespace}/{ref.name} has UID {uid}, the kubelet asked for {ref.uid} "
            "(claim was re-created)"
        )
    allocation = (obj.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimCheckError(f"claim {ref.namespace}/{ref.name} is not allocated")
    devices = allocation.get("devices") or {}
    results = tuple(
        AllocatedDevice(
            request=str(r["request"]),
            pool=str(r["pool"]),
            device=str(r["device"]),
            admin_access=bool(r.get("adminAccess", False)),
            share_id=r.get("shareID"),
            consumed_capacity={
                str(k): str(v) for k, v in (r.get("consumedCapacity") or {}).items()
            },
        )
        for r in devices.get("results") or []
        if r.get("driver") == driver
    )
    if not results:
        raise ClaimCheckError(
            f"claim {ref.namespace}/{ref.name} has no devices allocated by driver {driver}"
        )
    configs = tuple(
        OpaqueConfig(
            source=c.get("source", "FromClaim"),
            requests=tuple(c.get("requests") or ()),
            parameters=dict((c.get("opaque") or {}).get("parameters") or {}),
        )
        for c in devices.get("config") or []
        if (c.get("opaque") or {}).get("driver") == driver
    )
    return Claim(ref=ref, devices=results, configs=configs)


def base_request_names(devices: Sequence[PreparedDevice]) -> list[PreparedDevice]:
    """Reduce ``req/sub`` to ``req``: the kubelet matches containers by base name only."""
    out = []
    for d in devices:
        names = tuple(dict.fromkeys(n.split("/", 1)[0] for n in d.request_names))
        out.append(PreparedDevice(names, d.pool_name, d.device_name, d.cdi_device_ids, d.share_id))
    return out


@dataclass(frozen=True)
class PrepareOutcome:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


class ClaimPreparer:
    """Runs prepare/unprepare for a batch of claims with the locking rules above."""

    def __init__(
        self,
        *,
        driver_name: str,
        backend: DeviceBackend,
        get_claim: ClaimGetter,
        lock_file: FileLock | None,
        logger: logging.Logger,
        parallel: bool | None = None,
        max_workers: int = 8,
    ) -> None:
        self._driver = driver_name
        self._backend = backend
        self._get_claim = get_claim
        self._file_lock = lock_file
        self._log = logger
        if parallel is None:
            parallel = isinstance(backend, ParallelClaims) and backend.supports_parallel_claims
        self._parallel = parallel
        self._serial = threading.Lock()
        self._claims_lock = threading.Lock()
        self._claim_locks: dict[str, tuple[threading.Lock, int]] = {}
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="claim")

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    @contextmanager
    def _claim_lock(self, uid: str) -> Iterator[None]:
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

    def _map(self, fn: Callable[[ClaimRef], Any], refs: Sequence[ClaimRef]) -> list[Any]:
        if len(refs) <= 1:
            return [fn(r) for r in refs]
        return list(self._pool.map(fn, refs))

    def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, PrepareOutcome]:
        """One outcome per distinct requested UID."""
        unique = list({r.uid: r for r in refs}.values())
        return dict(zip((r.uid for r in unique), self._map(self._prepare_one, unique), strict=True))

    def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, str]:
        """UID -> error text ('' on success) for each distinct requested UID."""
        unique = list({r.uid: r for r in refs}.values())
        return dict(
            zip((r.uid for r in unique), self._map(self._unprepare_one, unique), strict=True)
        )

    def _prepare_one(self, ref: ClaimRef) -> PrepareOutcome:
        log = claim_logger(self._log, ref.uid, ref.namespace, ref.name)
        try:
            check_uid(ref)
            try:
                obj = self._get_claim(ref.namespace, ref.name)
            except Exception as exc:
                raise ClaimCheckError(
                    f"cannot fetch claim {ref.namespace}/{ref.name} from the API server: {exc}"
                ) from exc
            if obj is None:
                raise ClaimCheckError(f"claim {ref.namespace}/{ref.name} not found")
            claim = claim_from_object(obj, ref, self._driver)
            with self._claim_lock(ref.uid):
                devices = self._backend.prepare(claim)
        except (ClaimCheckError, PrepareError) as exc:
            log.warning("prepare failed: %s", exc)
            return PrepareOutcome(error=str(exc))
        except Exception as exc:
            log.exception("prepare failed unexpectedly")
            return PrepareOutcome(error=f"internal error preparing claim: {exc}")
        log.info("prepared %d device(s)", len(devices))
        return PrepareOutcome(devices=tuple(base_request_names(devices)))

    def _unprepare_one(self, ref: ClaimRef) -> str:
        log = claim_logger(self._log, ref.uid, ref.namespace, ref.name)
        try:
            check_uid(ref)
            with self._claim_lock(ref.uid):
                self._backend.unprepare(ref)
        except (ClaimCheckError, PrepareError) as exc:
            log.warning("unprepare failed: %s", exc)
            return str(exc)
        except Exception as exc:
            log.exception("unprepare failed unexpectedly")
            return f"internal error unpreparing claim: {exc}"
        log.info("unprepared")
        return ""
