"""ResourceClaim ``status.devices`` for our devices (KEP-4817): written at prepare,
updated when a device's health changes, removed at unprepare.

Each entry is keyed by driver, pool, device (and share ID) and carries what a
workload or an operator needs to find and judge the device: ``data`` from the
backend (:class:`DeviceStatusReporter`, e.g. the GPU UUID and PCI address) and
two conditions, ``Ready`` (prepared on this node) and ``Healthy`` (the same
health the kubelet's stream reports). Entries are written with server-side
apply under the driver's name as field manager, so other drivers' entries in
the same claim are never touched, and the apply carries the claim's UID, so a
re-created claim of the same name is not written to.

RBAC (deploy/rbac): ``resourceclaims/status`` ``patch`` plus the synthetic
``resourceclaims/driver`` ``associated-node:patch`` for our driver name only:
a node's plugin can write status only for claims allocated on its own node.
Writing status is informational and asynchronous: prepare and unprepare only
note the claim, the plugin's ``claim-book`` thread writes once the calls have
settled (after a burst of them, not during it; retrying a failure at the next
health change or periodic refresh), so the kubelet's call never waits for it. A
claim prepared and unprepared between two writes gets none at all. A write the API
server refuses as invalid (422) is said once and not sent again until the claim's
entries change (a device's health, another prepare); an unreachable server is said
once and then every few minutes.
"""

from __future__ import annotations

import datetime
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from dra_driver.plugin.claims import ClaimRef, PreparedDevice
from dra_driver.plugin.kubeclient import KubeApiError
from dra_driver.retries import Retry

Obj = dict[str, Any]
ApplyStatus = Callable[[str, str, Obj], None]
"""``(namespace, name, apply-patch body)``: server-side apply of the claim's status;
returns quietly when the claim no longer exists."""


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    """``True``, ``False`` or ``Unknown``."""
    reason: str
    """CamelCase, as metav1.Condition requires."""
    message: str = ""


@dataclass(frozen=True)
class DeviceStatus:
    device: str
    data: dict[str, Any] = field(default_factory=dict)
    """Small JSON object (the API allows 10 KiB)."""
    conditions: tuple[Condition, ...] = ()


@runtime_checkable
class DeviceStatusReporter(Protocol):
    """Optional backend ability: what to say about prepared devices in the claim's status."""

    def device_status(self, devices: Sequence[PreparedDevice]) -> list[DeviceStatus]: ...


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ClaimStatusWriter:
    def __init__(
        self,
        *,
        driver_name: str,
        apply: ApplyStatus,
        reporter: DeviceStatusReporter | None,
        logger: logging.Logger,
        node_name: str = "",
        now: Callable[[], str] = _now,
    ) -> None:
        self._driver = driver_name
        self._apply = apply
        self.reporter = reporter
        """May be set once later (a backend given after the plugin was built)."""
        self._log = logger
        self._node = node_name
        self._now = now
        self._lock = threading.Lock()
        self._claims: dict[str, tuple[ClaimRef, tuple[PreparedDevice, ...]]] = {}
        self._written: dict[str, Obj] = {}
        self._removals: dict[str, ClaimRef] = {}
        self._since: dict[tuple[str, str, str, str], tuple[str, str]] = {}
        """(claim uid, device, share id, condition type) -> (status, lastTransitionTime)."""
        self._inherited: set[str] | None = None
        """Claims with state from before this process (their status may hold our entries);
        ``None`` until :meth:`inherit` said which."""
        self._refused: dict[str, Obj] = {}
        """Claim UID -> the body the API server refused as invalid (422): not sent again."""
        self._retry = Retry("writing claim status", logger, paced=False)
        self._unwritten: set[str] = set()
        """Claims prepared here whose status cannot hold our entries: none were written
        (nor are being written) since they came without any. Unprepared, they need no
        removal."""

    def _entries(self, ref: ClaimRef, devices: Sequence[PreparedDevice]) -> list[Obj]:
        reported = {
            d.device: d for d in (self.reporter.device_status(devices) if self.reporter else [])
        }
        out = []
        for dev in devices:
            st = reported.get(dev.device_name, DeviceStatus(dev.device_name))
            where = f" on node {self._node}" if self._node else ""
            ready = Condition("Ready", "True", "Prepared", f"prepared by {self._driver}{where}")
            conditions = [ready, *st.conditions]
            entry: Obj = {"driver": self._driver, "pool": dev.pool_name, "device": dev.device_name}
            if dev.share_id:
                entry["shareID"] = dev.share_id
            entry["conditions"] = [
                {
                    "type": c.type,
                    "status": c.status,
                    "reason": c.reason,
                    "message": c.message[:32768],
                    "lastTransitionTime": self._transition(ref.uid, dev, c),
                }
                for c in conditions
            ]
            data = {**st.data, "cdiDeviceIDs": list(dev.cdi_device_ids)}
            entry["data"] = data
            out.append(entry)
        return out

    def _transition(self, uid: str, dev: PreparedDevice, c: Condition) -> str:
        key = (uid, dev.device_name, dev.share_id or "", c.type)
        old = self._since.get(key)
        if old is None or old[0] != c.status:
            self._since[key] = (c.status, self._now())
        return self._since[key][1]

    def _body(self, ref: ClaimRef, entries: list[Obj]) -> Obj:
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": ref.name, "namespace": ref.namespace, "uid": ref.uid},
            "status": {"devices": entries},
        }

    def _write(self, ref: ClaimRef, body: Obj) -> bool:
        """Whether the entries are where they should be now (refused ones never will be,
        until they change: :attr:`_refused`)."""
        if self._refused.get(ref.uid) == body:
            return False
        try:
            self._apply(ref.namespace, ref.name, body)
        except KubeApiError as exc:  # informational: never fail the kubelet's call for it
            if exc.status != 422:
                self._retry.failed(exc)
                return False
            self._refused[ref.uid] = body
            self._log.warning(
                "the API server refused our claim status devices; not sent again until "
                "they change: %s", exc,
                extra={"claim_uid": ref.uid, "namespace": ref.namespace, "claim": ref.name},
            )  # fmt: skip
            return False
        except Exception as exc:
            self._retry.failed(exc)
            return False
        self._retry.succeeded()
        self._refused.pop(ref.uid, None)
        return True

    def prepared(self, ref: ClaimRef, devices: Sequence[PreparedDevice]) -> None:
        """Note a claim just prepared; :meth:`refresh` writes its entries (no API call here,
        so a prepare never waits for the status write)."""
        with self._lock:
            fresh = (
                self._inherited is not None
                and ref.uid not in self._inherited
                and ref.uid not in self._claims
                and ref.uid not in self._written
                and ref.uid not in self._removals
            )
            if fresh:
                self._unwritten.add(ref.uid)
            self._claims[ref.uid] = (ref, tuple(devices))
            self._removals.pop(ref.uid, None)

    def unprepared(self, ref: ClaimRef) -> None:
        """Note a claim unprepared; :meth:`refresh` removes its entries (unless none can
        be there: prepared and unprepared between two writes)."""
        with self._lock:
            self._claims.pop(ref.uid, None)
            self._written.pop(ref.uid, None)
            self._refused.pop(ref.uid, None)
            self._since = {k: v for k, v in self._since.items() if k[0] != ref.uid}
            if ref.uid in self._unwritten:
                self._unwritten.discard(ref.uid)
            else:
                self._removals[ref.uid] = ref

    def inherit(self, uids: Iterable[str]) -> None:
        """Claims the backend holds from before this process: a previous instance may
        have written their status, so their removal is always written. Until this is
        called, every claim counts as such."""
        with self._lock:
            known = set(uids)
            self._inherited = (self._inherited or set()) | known
            self._unwritten -= known

    def refresh(self) -> int:
        """Remove entries of unprepared claims, write those of new claims and those that
        changed (device health) or failed before; returns the writes made. API calls are
        made outside the lock, so prepare and unprepare never wait for them."""
        with self._lock:
            removals = list(self._removals.values())
            writes = [
                (uid, ref, self._body(ref, self._entries(ref, devices)))
                for uid, (ref, devices) in self._claims.items()
            ]
            writes = [w for w in writes if self._written.get(w[0]) != w[2]]
            self._unwritten.difference_update(uid for uid, _, _ in writes)  # may land now
        done = 0
        for ref in removals:
            if self._write(ref, self._body(ref, [])):  # a deleted claim counts as done
                done += 1
                with self._lock:
                    if self._removals.get(ref.uid) is ref:
                        del self._removals[ref.uid]
        for uid, ref, body in writes:
            if self._write(ref, body):
                done += 1
                with self._lock:
                    if uid in self._claims:
                        self._written[uid] = body
        return done
