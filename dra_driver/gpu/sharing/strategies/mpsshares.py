"""Enforced fractional GPUs: each claim's shares get their own MPS control daemon whose
limits are what the scheduler recorded (``consumedCapacity``), on a GPU in
``EXCLUSIVE_PROCESS`` mode while it has shares.

The strategy for a *fractional* share (:func:`~dra_driver.gpu.sharing.shares.is_fractional`:
less than the whole GPU) without a sharing config or with ``strategy: MPS``
(no ``mpsConfig``: the limits come from the allocation). Why each piece:

* **Limits the container cannot loosen.** The daemon is started with the
  share's limits as its defaults (``set_default_device_pinned_mem_limit <uuid>
  <MiB>M``, ``set_default_active_thread_percentage <pct>``), so every server it
  starts, and every client of that server, is held to them. The client-side
  ``CUDA_MPS_*`` variables the container also gets can only tighten them.
* **No way around MPS.** While any share is prepared the GPU is
  ``EXCLUSIVE_PROCESS``: a process that drops ``CUDA_MPS_PIPE_DIRECTORY`` to
  open the GPU directly is refused, because the GPU is held by the MPS
  server(s). The mode is the per-GPU shared resource ``gpu-N/shares``, set
  with the first share and reset to ``DEFAULT`` after the last.
* **Shares apart.** One daemon per claim, each with its own pipe directory and
  ``/dev/shm``; a container sees only its claim's pipe. Shares come and go
  without touching the others' daemons.

Several MPS servers on one ``EXCLUSIVE_PROCESS`` GPU need driver r615+
(:func:`~dra_driver.gpu.sharing.shares.can_enforce`): before that, the GPU admits one
server, so the second share could not run, and in ``DEFAULT`` mode a process
could bypass MPS, which would make the limits advisory. On older drivers a
fractional share therefore fails to prepare, naming the advisory alternative
(``strategy: TimeSlicing``). None of this was verified on hardware; see the
README's "What holds where" table.

A claim with shares of several GPUs gets one daemon (a process talks to one
MPS pipe): per-GPU memory limits, and the smallest of the shares' SM limits
(MPS has one active-thread percentage per server). Two shares of one GPU in
one claim are served as one, with their sum. Record::

    {"daemonId": "<12 hex>", "uuids": [...], "shares": {"<uuid>": ["<shareID>", ...]},
     "memoryMiB": {"<uuid>": <MiB>}, "activeThreadPercentage": <1..100>}

Shared resource ``gpu-N/shares`` record: ``{"gpu": <uuid>, "computeMode": "EXCLUSIVE_PROCESS"}``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dra_driver.gpu.cdi.spec import ContainerEdits
from dra_driver.gpu.checkpoint import Unit
from dra_driver.gpu.config import MIB, ConfigError, DeviceConfig
from dra_driver.gpu.hardware.inventory import Gpu, Inventory
from dra_driver.gpu.hardware.naming import devices_by_name
from dra_driver.gpu.planning import Steps, Target, gpu_name_of
from dra_driver.gpu.sharing.mpsdaemons import MpsDaemons, mps_id, recorded_id
from dra_driver.gpu.sharing.shares import (
    ENFORCING_DRIVER,
    Share,
    ShareError,
    can_enforce,
    is_fractional,
    share_of,
)
from dra_driver.gpu.sharing.slots import slot_target
from dra_driver.gpu.sharing.strategies.base import NodeTools
from dra_driver.gpu.sharing.strategies.mps import NAME as MPS
from dra_driver.gpu.sharing.strategies.mps import Mps
from dra_driver.gpu.sharing.tools import GpuCommands, ToolError

NAME = "MpsShares"
SHARED = "shares"
"""Name of the per-GPU shared resource (``gpu-N/shares``)."""


class MpsSharesStrategy:
    name = NAME
    config = None

    selects = frozenset({None, MPS})
    shares_only = True

    def __init__(self, node: NodeTools) -> None:
        self._commands: GpuCommands = node.commands
        self._daemons: MpsDaemons = node.daemons
        self._inventory: Callable[[], Inventory] = node.inventory
        self._slots = node.slots

    def wants(self, target: Target, config: DeviceConfig) -> bool:
        """Fractional shares; a slot (``--mps-slots``) only where the driver enforces a
        daemon per claim (else it is :mod:`.mpsslots`')."""
        sharing = config.sharing
        if not is_fractional(target) or (sharing is not None and sharing.strategy != MPS):
            return False
        return slot_target(target, self._slots) is None or can_enforce(
            self._inventory().driver_version
        )

    def plan(self, claim_uid: str, targets: Sequence[Target], config: DeviceConfig) -> list[Unit]:
        if config.sharing is not None and config.sharing.settings != Mps():
            raise ConfigError(
                f"{config.origin}: sharing.mpsConfig: a share's limits are what the scheduler "
                "allocated (consumedCapacity); leave mpsConfig out for shares"
            )
        version = self._inventory().driver_version
        names = ", ".join(sorted({t.name for t in targets}))
        if not can_enforce(version):
            raise ConfigError(
                f"{names}: driver {version} cannot enforce a share's memory and SM limits "
                f"(r{ENFORCING_DRIVER}+ runs one MPS server per share on an EXCLUSIVE_PROCESS "
                "GPU); for an advisory share without limits set a GpuConfig with "
                "sharing.strategy: TimeSlicing, or ask for the whole GPU (no capacity requests)"
            )
        per_gpu: dict[str, Share] = {}
        share_ids: dict[str, list[str]] = {}
        for t in targets:
            assert isinstance(t.device, Gpu) and t.share_id is not None
            try:
                s = share_of(t.device, t.consumed_capacity, f"device {t.name} share {t.share_id}")
            except ShareError as exc:
                raise ConfigError(str(exc)) from None
            ids = share_ids.setdefault(t.uuid, [])
            if t.share_id in ids:
                continue
            ids.append(t.share_id)
            prev = per_gpu.get(t.uuid)
            if prev is not None:  # two shares of one GPU in one claim: one share, the sum
                s = Share(s.gpu_memory, min(s.gpu_memory, s.memory + prev.memory),
                          min(100, s.compute + prev.compute))  # fmt: skip
            per_gpu[t.uuid] = s
        uuids = list(per_gpu)
        daemon_id = mps_id(claim_uid, [SHARED, *uuids])
        problem = self._daemons.depth_problem(daemon_id)
        if problem is not None:
            raise ConfigError(f"{names}: MPS shares are not available on this node: {problem}")
        record = {
            "daemonId": daemon_id,
            "uuids": uuids,
            "shares": share_ids,
            "memoryMiB": {u: s.memory_mib for u, s in per_gpu.items()},
            "activeThreadPercentage": min(s.thread_percentage for s in per_gpu.values()),
        }
        devices = tuple(dict.fromkeys(t.name for t in targets))
        keys = tuple(dict.fromkeys(f"{gpu_name_of(t.name)}/{SHARED}" for t in targets))
        return [Unit(NAME, devices, record=record, shared=keys)]

    # -- the per-GPU shared resource: EXCLUSIVE_PROCESS while any share is prepared ------

    def _uuid_of(self, key: str, record: Mapping[str, Any]) -> str | None:
        if record.get("gpu"):
            return str(record["gpu"])
        found = devices_by_name(self._inventory()).get(key.split("/", 1)[0])
        return found.uuid if isinstance(found, Gpu) else None

    def acquire(self, key: str, steps: Steps) -> Mapping[str, Any]:
        uuid = self._uuid_of(key, {})
        if uuid is None:
            raise ToolError(f"{key}: no such GPU on this node")
        self._commands.set_compute_mode(uuid, "EXCLUSIVE_PROCESS")
        steps.done(f"compute-mode:{uuid}")
        return {"gpu": uuid, "computeMode": "EXCLUSIVE_PROCESS"}

    def release(self, key: str, record: Mapping[str, Any], steps: Steps) -> None:
        uuid = self._uuid_of(key, record)
        if uuid is None:
            return  # the GPU is gone, and its mode with it
        self._commands.set_compute_mode(uuid, "DEFAULT")
        steps.done(f"compute-mode-reset:{uuid}")

    # -- one claim's daemon ----------------------------------------------------------------

    def apply(self, unit: Unit, steps: Steps) -> None:
        self._daemons.bring_up(
            recorded_id(unit.record),
            [str(u) for u in unit.record["uuids"]],
            active_thread_percentage=int(unit.record["activeThreadPercentage"]),
            pinned_memory={str(u): int(m) * MIB for u, m in unit.record["memoryMiB"].items()},
            done=steps.done,
        )

    def undo(self, unit: Unit, steps: Steps) -> None:
        self._daemons.tear_down(recorded_id(unit.record), steps.done)

    def edits(self, unit: Unit, device: str, edits: ContainerEdits) -> ContainerEdits:
        """The claim's pipe and ``/dev/shm``, and its limits for the client side (which
        can only tighten the daemon's). The memory variable names device ordinal 0, so
        it is set only when the daemon serves one GPU."""
        env = [f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={int(unit.record['activeThreadPercentage'])}"]
        memory = unit.record["memoryMiB"]
        if len(memory) == 1:
            env.append(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={int(next(iter(memory.values())))}M")
        daemon = self._daemons.container_edits(recorded_id(unit.record))
        return edits.merged(daemon).merged(ContainerEdits(env=tuple(env)))

    def forget(self, claim_uid: str) -> None:
        self._daemons.stop_claim(claim_uid)

    def after_reboot(self) -> None:
        self._daemons.remove_all_dirs()
