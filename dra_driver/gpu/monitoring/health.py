"""One health state per device, and how it turns into taints: policy and bookkeeping, no I/O.

The :class:`~dra_driver.gpu.monitoring.monitor.HealthMonitor` feeds a :class:`HealthBook`
with what NVML reports (events and periodic checks); the book is the single
source for the slices' taints (:func:`device_taints`) and the health stream
(:func:`device_health`), so the two always agree.

Faults (one per kind and scope, the worst and latest kept):

=================  ==========================  =========================================
kind (taint key)   value                       from
=================  ==========================  =========================================
``xid``            the Xid, e.g. ``79``        NVML Xid event (MIG scope by GI/CI IDs)
``ecc``            ``double-bit``              DBE event, or volatile uncorrected count up
``gpu-lost``       ``unreachable``             GPU_IS_LOST / GPU unavailable event
``recovery``       ``gpu-reset`` ...           NVML_FI_DEV_GET_GPU_RECOVERY_ACTION != none
``unmonitored``    ``events-unsupported``      the GPU cannot register NVML events
=================  ==========================  =========================================

Severity decides the taint effect: informational faults taint ``None``
(visible, never avoided), faults that leave the device unusable
``NoSchedule``, fatal ones ``NoSchedule`` or, opted in, ``NoExecute`` (the
device-taint-eviction controller then evicts pods using the device).

The policy itself (which Xids are ignored, informational or fatal; the healthy
period; the fatal effect) lives in :mod:`dra_driver.gpu.monitoring.healthpolicy`, which the
flag parser builds before the rest of the GPU layer is imported.

Which devices a fault reaches (:func:`device_faults`): a GPU without MIG, its
device; a MIG-mode GPU, every device published for it, except that a fault
scoped to one instance (GI/CI IDs) reaches only that instance's device. In
static MIG mode those are the instances discovered. In dynamic MIG mode they
are the whole GPU and every placement, plus the static devices of instances
others made; an instance of ours is the placement whose prepared record (the
checkpoint's GI/CI IDs) holds it, so a scope that is neither ours nor
another's (an instance being made, or already gone) counts as GPU-wide.
Faults of an instance of ours go with its holder (:meth:`HealthBook.drop_scope`,
:mod:`dra_driver.gpu.monitoring.migholders`), since NVML reuses GI/CI IDs.

Recovery, never on a guess: faults clear only when the GPU has answered every
periodic check correctly, with NVML reporting no pending recovery action, for
the whole healthy period. Where NVML cannot report the recovery action (old
driver), only informational faults clear by themselves; the others stay until
the plugin restarts, because "it answers queries" does not prove a reset.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace

from dra_driver.gpu.hardware.inventory import Gpu, Inventory
from dra_driver.gpu.hardware.naming import gpu_device_name, mig_device_name
from dra_driver.gpu.hardware.partitions import (
    InstanceKey,
    OwnedInstance,
    available,
    foreign_instances,
)
from dra_driver.gpu.monitoring.healthpolicy import HealthPolicy, Severity
from dra_driver.plugin.backend import DeviceHealth
from dra_driver.plugin.resources import DeviceTaint, Pool

RECOVERY_ACTIONS = {1: "gpu-reset", 2: "node-reboot", 3: "drain-p2p", 4: "drain-and-reset",
                    5: "recover-imex-domain", 6: "bus-reset", 7: "system-reboot"}  # fmt: skip
"""NVML_GPU_RECOVERY_ACTION_* other than NONE, as taint values."""
CLAIM_STATE_TAINT = "claim-state"
"""Taint key (under the driver name) on every device while the checkpoint is unreadable."""
_MESSAGE_LIMIT = 1024  # the kubelet truncates longer health messages


Scope = tuple[int, int] | None
"""``(gi_id, ci_id)`` of one MIG device, or None for the whole GPU."""


@dataclass(frozen=True)
class Fault:
    kind: str
    value: str
    severity: Severity
    since: float
    """Wall-clock time the condition was first seen (the taint's timeAdded)."""
    message: str
    scope: Scope = None


def recovery_fault(action: int, now: float) -> Fault:
    name = RECOVERY_ACTIONS.get(action, f"action-{action}")
    severity = Severity.UNUSABLE if name in ("drain-p2p", "recover-imex-domain") else Severity.FATAL
    return Fault("recovery", name, severity, now, f"NVML recovery action pending: {name}")


@dataclass
class _GpuState:
    faults: dict[tuple[str, Scope], Fault] = field(default_factory=dict)
    clean_since: float | None = None
    """Monotonic time since which every check passed with no action pending."""
    recovery_known: bool = True


@dataclass(frozen=True)
class HealthSnapshot:
    """Faults per GPU UUID at one moment; ``version`` grows with every change."""

    version: int = 0
    faults: Mapping[str, tuple[Fault, ...]] = field(default_factory=dict)


class HealthBook:
    """Thread-safe fault bookkeeping; every mutation returns whether anything changed."""

    def __init__(self, policy: HealthPolicy) -> None:
        self.policy = policy
        self._lock = threading.Lock()
        self._gpus: dict[str, _GpuState] = {}
        self._version = 0

    def record(self, uuid: str, fault: Fault) -> bool:
        """A fault was seen: keep the worse (then older) of it and any of the same kind."""
        with self._lock:
            state = self._gpus.setdefault(uuid, _GpuState())
            state.clean_since = None
            key = (fault.kind, fault.scope)
            old = state.faults.get(key)
            if old is not None and (old.severity, old.value) == (fault.severity, fault.value):
                return False
            if old is not None and old.severity > fault.severity:
                return False
            if old is not None and old.severity == fault.severity:
                fault = replace(fault, since=old.since)  # same condition, newer detail
            state.faults[key] = fault
            self._version += 1
            return True

    def drop(self, uuid: str, kind: str) -> bool:
        """Remove faults of one kind that a state change itself resolves (``unmonitored``)."""
        return self._drop(uuid, lambda key: key[0] == kind)

    def drop_scope(self, uuid: str, scope: tuple[int, int]) -> bool:
        """Remove the faults of one MIG instance that is gone (destroyed by dynamic MIG),
        so that a new instance given the same IDs does not inherit them."""
        return self._drop(uuid, lambda key: key[1] == scope)

    def _drop(self, uuid: str, match: Callable[[tuple[str, Scope]], bool]) -> bool:
        with self._lock:
            state = self._gpus.get(uuid)
            keys = [k for k in (state.faults if state else {}) if match(k)]
            for k in keys:
                del state.faults[k]  # type: ignore[union-attr]
            if keys:
                self._version += 1
            return bool(keys)

    def check_passed(self, uuid: str, now_mono: float, *, recovery_known: bool) -> bool:
        """A periodic check found the GPU answering with no recovery action pending.

        Clears its faults once that has held for the healthy period (only the
        informational ones when NVML cannot report the recovery action).
        """
        with self._lock:
            state = self._gpus.setdefault(uuid, _GpuState())
            state.recovery_known = recovery_known
            if state.clean_since is None:
                state.clean_since = now_mono
            if now_mono - state.clean_since < self.policy.healthy_period_s:
                return False
            clearable = [
                k
                for k, f in state.faults.items()
                if f.kind != "unmonitored" and (recovery_known or f.severity is Severity.INFO)
            ]
            for k in clearable:
                del state.faults[k]
            if clearable:
                self._version += 1
            return bool(clearable)

    def check_failed(self, uuid: str) -> None:
        with self._lock:
            self._gpus.setdefault(uuid, _GpuState()).clean_since = None

    def forget(self, keep: set[str]) -> None:
        """Drop GPUs not in ``keep`` that have no faults (gone and healthy)."""
        with self._lock:
            for u in [u for u, s in self._gpus.items() if u not in keep and not s.faults]:
                del self._gpus[u]

    def faulty(self) -> set[str]:
        with self._lock:
            return {u for u, s in self._gpus.items() if s.faults}

    def snapshot(self) -> HealthSnapshot:
        with self._lock:
            return HealthSnapshot(
                version=self._version,
                faults={
                    u: tuple(sorted(s.faults.values(), key=lambda f: (f.kind, f.scope or (-1, -1))))
                    for u, s in self._gpus.items()
                    if s.faults
                },
            )


def rfc3339(ts: float) -> str:
    return datetime.datetime.fromtimestamp(int(ts), datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class DynamicMig:
    """What dynamic MIG mode adds to mapping faults onto devices."""

    owned: Collection[OwnedInstance] = ()
    """GPU instances we created: partitions' own, not others' (published as static devices)."""
    held: Mapping[InstanceKey, str] = field(default_factory=dict)
    """MIG instance -> the device whose prepared record (checkpoint) holds it."""


def _published(
    gpu: Gpu, dynamic: DynamicMig | None
) -> tuple[list[str], dict[tuple[int, int], str]]:
    """The devices published for one GPU, and the instance scopes that one of them owns."""
    if not gpu.mig_enabled:
        return [gpu_device_name(gpu)], {}
    if dynamic is None:
        scoped = {(m.gi_id, m.ci_id): mig_device_name(m) for m in gpu.mig_instances}
        return list(scoped.values()), scoped
    foreign = {(gi.gi_id, gi.placement.start) for gi in foreign_instances(gpu, dynamic.owned)}
    scoped = {
        (m.gi_id, m.ci_id): mig_device_name(m)
        for m in gpu.mig_instances
        if (m.gi_id, m.placement.start) in foreign
    }
    scoped |= {(gi, ci): name for (u, gi, ci), name in dynamic.held.items() if u == gpu.uuid}
    names = [*scoped.values(), *(p.name for p in available(gpu, dynamic.owned).partitions)]
    return list(dict.fromkeys(names)), scoped


def _device_faults(
    gpu: Gpu, faults: tuple[Fault, ...], dynamic: DynamicMig | None
) -> dict[str, list[Fault]]:
    """Device name -> faults that concern it (GPU-wide faults reach every device)."""
    names, scoped = _published(gpu, dynamic)
    out: dict[str, list[Fault]] = {name: [] for name in names}
    for f in faults:
        owner = scoped.get(f.scope) if f.scope is not None else None
        for name in [owner] if owner is not None else names:
            out[name].append(f)
    return out


def device_faults(
    snapshot: HealthSnapshot, inventory: Inventory, dynamic: DynamicMig | None = None
) -> dict[str, list[Fault]]:
    """Device name -> its faults, for published devices that have any (``dynamic``: the
    node runs dynamic MIG; None: static)."""
    out: dict[str, list[Fault]] = {}
    for gpu in inventory.gpus:
        faults = snapshot.faults.get(gpu.uuid)
        if gpu.uuid and faults:
            out |= {name: fs for name, fs in _device_faults(gpu, faults, dynamic).items() if fs}
    return out


def taints_for(
    faults: list[Fault], *, driver_name: str, policy: HealthPolicy
) -> tuple[DeviceTaint, ...]:
    """One taint per fault kind: the worst fault of that kind, its value and start time."""
    worst: dict[str, Fault] = {}
    for f in faults:
        have = worst.get(f.kind)
        if have is None or (f.severity, f.since) > (have.severity, have.since):
            worst[f.kind] = f
    return tuple(
        DeviceTaint(
            key=f"{driver_name}/{kind}",
            value=f.value,
            effect=policy.effect(f.severity),
            time_added=rfc3339(f.since),
        )
        for kind, f in sorted(worst.items())
    )


def claim_state_taint(driver_name: str) -> DeviceTaint:
    """On every device while the checkpoint is unreadable: claims cannot be prepared here
    until it is fixed, so the scheduler must send no more (docs/claim-state.md)."""
    key = f"{driver_name}/{CLAIM_STATE_TAINT}"
    return DeviceTaint(key=key, value="checkpoint-unreadable", effect="NoSchedule")


def health_reports(
    pool: Pool, faults: Mapping[str, list[Fault]], pool_name: str
) -> list[DeviceHealth]:
    """Read off the published pool: Unhealthy exactly when a device carries a
    NoSchedule or NoExecute taint; the message lists every taint."""
    out = []
    for d in pool.devices:
        bad = any(t.effect != "None" for t in d.taints)
        notes = [f.message for f in faults.get(d.name, [])]
        if any(t.key.endswith("/degraded") for t in d.taints):
            notes.insert(0, "GPU degraded: an NVML query failed")
        if any(t.key.endswith(f"/{CLAIM_STATE_TAINT}") for t in d.taints):
            notes.insert(0, "claims cannot be prepared on this node: checkpoint unreadable")
        message = "; ".join(notes)
        if len(message) > _MESSAGE_LIMIT:
            message = message[: _MESSAGE_LIMIT - 3] + "..."
        out.append(DeviceHealth(pool_name, d.name, "Unhealthy" if bad else "Healthy", message))
    return out
