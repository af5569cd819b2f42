"""The ``compute-domain.nvidia.com`` DeviceBackend: ``channel-0`` and ``daemon-0`` per node.

Channel prepare (a workload's claim), each step idempotent, in this order:

1. the config is decoded (a bad one fails for good) and the claim recorded as
   ``PrepareStarted`` in the checkpoint (:mod:`.checkpoint`), before any side effect;
2. the node is labelled :data:`~dra_driver.computedomain.names.DOMAIN_LABEL` ``=<domain
   uid>``, so the domain's DaemonSet runs a daemon here. A node labelled for another
   domain that still has channel claims here is refused (one domain per node at a
   time; retryable: that domain's claims may go);
3. this node's daemon pod of the domain must be Ready (waited for up to
   ``ready_wait_s``), otherwise the prepare fails with a retryable error and the kubelet
   tries again: the pod stays ContainerCreating meanwhile;
4. the claim's CDI spec is written (:mod:`.cdispecs`), then the entry is completed.

Daemon prepare: recorded, the domain's host directory (``<state_dir>/domains/<uid>``,
0700) made, the CDI spec written, completed.

Unprepare marks the entry ``PrepareStarted`` again (a repeated prepare then redoes every
step instead of answering from the record), removes the CDI spec, then (channel) the
node's label when no other channel claim of that domain is left here, or (daemon) the
domain's host directory when no other daemon claim of it is left, and only then the
entry: a SIGKILL anywhere leaves an entry whose retried unprepare finishes the job.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from dra_driver.computedomain.names import (
    CHANNEL_DEVICE,
    CLIQUE_ATTRIBUTE,
    DAEMON_DEVICE,
)
from dra_driver.computedomain.node import cdispecs
from dra_driver.computedomain.node.checkpoint import (
    COMPLETED,
    STARTED,
    CheckpointError,
    CheckpointStore,
    Device,
    Entry,
    Kind,
)
from dra_driver.computedomain.node.config import ChannelConfig, DaemonConfig, claim_config
from dra_driver.computedomain.node.hostinfo import ImexHost
from dra_driver.computedomain.node.kubeapi import DaemonPods, NodeLabel
from dra_driver.errors import DriverError
from dra_driver.gpu.cdi import spec as cdi
from dra_driver.logs import ContextLogger
from dra_driver.plugin.claims import Claim, ClaimRef, PreparedDevice, PrepareError
from dra_driver.plugin.kubeclient import KubeError
from dra_driver.plugin.resources import Device as PoolDevice
from dra_driver.plugin.resources import Pool

DEVICE_TYPES: dict[str, Kind] = {CHANNEL_DEVICE: "channel", DAEMON_DEVICE: "daemon"}


class ComputeDomainBackend:
    def __init__(
        self,
        *,
        driver_name: str,
        node_name: str,
        host: ImexHost,
        cdi_dir: Path,
        state_dir: Path,
        store: CheckpointStore,
        label: NodeLabel,
        daemons: DaemonPods,
        logger: logging.Logger,
        runtime_driver_root: Path = Path("/"),
        extra_mounts: Sequence[str] = (),
        ready_wait_s: float = 2.0,
        poll_s: float = 0.25,
        sleep: Callable[[float], None] = time.sleep,
        on_step: Callable[[str], None] | None = None,
    ) -> None:
        """``state_dir`` must be a host path seen at the same place (daemons mount their
        domain's directory from it); ``ready_wait_s``: how long a channel prepare waits
        for the daemon pod before failing retryably (0: not at all). ``on_step`` is told the
        name of each step just done (crash tests SIGKILL there)."""
        self.host = host
        self._node = node_name
        self._kind = cdi.claim_kind(driver_name)
        self._cdi_dir = cdi_dir
        self._domains_dir = state_dir / "domains"
        self._store = store
        self._label = label
        self._daemons = daemons
        self._log = logger
        self._runtime_driver_root = runtime_driver_root
        self._extra_mounts = tuple(extra_mounts)
        self._ready_wait_s = ready_wait_s
        self._poll_s = poll_s
        self._sleep = sleep
        self._step = on_step or (lambda _name: None)

    # -- start -----------------------------------------------------------------

    def recover(self) -> None:
        """After a reboot: drop the previous boot's claims and their CDI specs."""
        with self._store.transaction() as cp:
            _, dropped = self._store.read()
            for uid in dropped:
                cdi.remove_spec(self._cdi_dir, self._kind, uid)
            if dropped:
                self._store.write(cp)
                self._log.info("dropped claims of an earlier boot", extra={"claims": dropped})

    # -- DeviceBackend ---------------------------------------------------------

    def pool(self) -> Pool:
        if self.host.channels_major is None:
            return Pool()  # no IMEX channel driver on this node: nothing to offer
        clique = self.host.clique_id
        return Pool(devices=(
            PoolDevice(CHANNEL_DEVICE, {"type": "channel", "id": 0, CLIQUE_ATTRIBUTE: clique}),
            PoolDevice(DAEMON_DEVICE, {"type": "daemon", "id": 0, CLIQUE_ATTRIBUTE: clique}),
        ))  # fmt: skip

    def prepared_claims(self) -> Iterable[ClaimRef]:
        cp, _ = self._store.read()
        return [ClaimRef(e.namespace, e.name, uid) for uid, e in sorted(cp.claims.items())]

    def prepared_devices(self, claim: ClaimRef) -> list[PreparedDevice] | None:
        cp, _ = self._store.read()
        entry = cp.claims.get(claim.uid)
        return self._result(entry) if entry is not None and entry.completed else None

    def problems(self) -> list[str]:
        try:
            self._store.read()
        except DriverError as exc:
            return [str(exc)]
        return []

    def prepare(self, claim: Claim) -> list[PreparedDevice]:
        log = claim.ref.logger(self._log)
        config = claim_config(claim, dict(DEVICE_TYPES))
        device = claim.devices[0]
        kind: Kind = "channel" if isinstance(config, ChannelConfig) else "daemon"
        try:
            with self._store.transaction() as cp:
                entry = cp.claims.get(claim.uid)
                if entry is not None and entry.completed:
                    return self._result(entry)
                busy = self._busy_domains(cp.claims, besides=claim.uid)
                if entry is None:
                    entry = Entry(
                        claim.ref.namespace,
                        claim.ref.name,
                        kind,
                        config.domain_id,
                        allocation_mode=getattr(config, "allocation_mode", "Single"),
                    )
                    cp.claims[claim.uid] = entry
                    self._store.write(cp)
                    self._step("checkpoint-started")
            if isinstance(config, ChannelConfig):
                spec = self._prepare_channel(claim.uid, config, busy, log)
            else:
                spec = self._prepare_daemon(claim.uid, config)
            cdi.write_spec(self._cdi_dir, claim.uid, spec)
            self._step("cdi-spec")
            devices = (Device(device.request, device.device, (self._qualified(claim.uid),)),)
            with self._store.transaction() as cp:
                entry = cp.claims[claim.uid]
                entry.state, entry.devices = COMPLETED, devices
                self._store.write(cp)
            self._step("checkpoint-completed")
        except (CheckpointError, cdi.CdiError, KubeError, OSError) as exc:
            raise PrepareError(f"claim {claim.uid}: {exc}") from exc
        log.info("prepared", extra={"kind": kind, "domain": config.domain_id})
        return self._result(entry)

    def unprepare(self, claim: ClaimRef) -> None:
        log = claim.logger(self._log)
        try:
            with self._store.transaction() as cp:
                entry = cp.claims.get(claim.uid)
                if entry is not None and entry.completed:
                    # From here on a repeated prepare (or PreparedLookup) must not answer
                    # from the record while the spec is going away.
                    entry.state = STARTED
                    self._store.write(cp)
                    self._step("checkpoint-unpreparing")
            cdi.remove_spec(self._cdi_dir, self._kind, claim.uid)
            if entry is None:
                return
            self._step("cdi-spec-removed")
            others = cp.domain_claims(entry.kind, entry.domain_id, besides=claim.uid)
            if not others and entry.kind == "channel":
                self._label.release(entry.domain_id)
                self._step("label-released")
            if not others and entry.kind == "daemon":
                shutil.rmtree(self._domains_dir / entry.domain_id, ignore_errors=True)
                self._step("domain-dir-removed")
            with self._store.transaction() as cp:
                cp.claims.pop(claim.uid, None)
                self._store.write(cp)
            self._step("checkpoint-removed")
        except (CheckpointError, cdi.CdiError, KubeError, OSError) as exc:
            raise PrepareError(f"claim {claim.uid}: unprepare: {exc}") from exc
        log.info("unprepared", extra={"kind": entry.kind, "domain": entry.domain_id})

    # -- steps -------------------------------------------------------------------

    @staticmethod
    def _busy_domains(claims: dict[str, Entry], *, besides: str) -> set[str]:
        return {e.domain_id for uid, e in claims.items() if e.kind == "channel" and uid != besides}

    def _prepare_channel(
        self, uid: str, config: ChannelConfig, busy: set[str], log: ContextLogger
    ) -> cdi.Spec:
        if self.host.channels_major is None:
            raise PrepareError(f"claim {uid}: this node's driver has no IMEX channels "
                               "(no nvidia-caps-imex-channels in /proc/devices)")  # fmt: skip
        other = self._label.claim(config.domain_id, busy - {config.domain_id})
        if other is not None:
            raise PrepareError(f"claim {uid}: node {self._node} is in ComputeDomain {other}, "
                               "which still has channel claims here (one domain per node at "
                               "a time); retrying")  # fmt: skip
        self._step("node-labelled")
        deadline = time.monotonic() + self._ready_wait_s
        while True:
            state = self._daemons.state(config.domain_id)
            if state.ready:
                self._step("daemon-ready")
                break
            if time.monotonic() >= deadline:
                log.info("waiting for the domain's daemon", extra={"detail": state.detail})
                raise PrepareError(f"claim {uid}: ComputeDomain {config.domain_id} is not ready "
                                   f"on node {self._node}: {state.detail}; retrying")  # fmt: skip
            self._sleep(self._poll_s)
        return cdispecs.channel_spec(self._kind, self._device_name(uid), config,
                                     self.host.channels_major)  # fmt: skip

    def _prepare_daemon(self, uid: str, config: DaemonConfig) -> cdi.Spec:
        domain_dir = self._domains_dir / config.domain_id
        self._domains_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        domain_dir.mkdir(mode=0o700, exist_ok=True)
        self._step("domain-dir")
        return cdispecs.daemon_spec(
            self._kind, self._device_name(uid), domain_id=config.domain_id,
            domain_dir=domain_dir, host=self.host, node_name=self._node,
            runtime_driver_root=self._runtime_driver_root, extra_mounts=self._extra_mounts,
        )  # fmt: skip

    def _device_name(self, uid: str) -> str:
        return f"{uid}-0"

    def _qualified(self, uid: str) -> str:
        return cdi.qualified_name(self._kind, self._device_name(uid))

    def _result(self, entry: Entry) -> list[PreparedDevice]:
        return [PreparedDevice((d.request,), self._node, d.device, d.cdi_ids)
                for d in entry.devices]  # fmt: skip
