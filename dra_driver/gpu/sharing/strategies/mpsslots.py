"""Enforced MPS slots before r615: ONE control daemon per slot GPU, its default limits one
slot, serving every slot claim of that GPU (:mod:`dra_driver.gpu.sharing.slots` publishes them).

The strategy for a share of a GPU that ``--mps-slots`` splits, on a driver that
cannot run a server per claim on an ``EXCLUSIVE_PROCESS`` GPU
(``not`` :func:`~dra_driver.gpu.sharing.shares.can_enforce`); from r615 on such a share
is an ordinary enforced share (:mod:`.mpsshares`, limits = its one slot). Why
each piece:

* **One slot, whatever the container does.** The daemon's defaults
  (``set_default_active_thread_percentage``, ``set_default_device_pinned_mem_limit``)
  are one slot; a client can only tighten what it inherits, so a process that
  drops or raises its ``CUDA_MPS_*`` variables still gets one slot.
* **No way around MPS.** The GPU is ``EXCLUSIVE_PROCESS`` while any slot is
  prepared, held by the daemon's server; its earlier mode is restored after the
  last slot.
* **Claims of any namespace share the daemon**; a container sees its pipe dir
  and ``/dev/shm``, nothing of the other claims.

The daemon and the mode are the per-GPU shared resource ``gpu-N/shares`` (the key
of :mod:`.mpsshares` and :mod:`.timeslicedshares` too, so enforced, advisory and
slot shares never mix on one GPU). Its record::

    {"gpu": <uuid>, "daemonId": <12 hex>, "computeMode": "EXCLUSIVE_PROCESS",
     "previousMode": "DEFAULT" | "EXCLUSIVE_PROCESS" | "PROHIBITED",
     "slots": N, "memoryMiB": <slot MiB>, "activeThreadPercentage": <slot %>}

Release works from it alone, or from nothing (the process died while acquiring):
the daemon id follows from the GPU's UUID (:func:`slot_daemon_id`), the mode
falls back to ``DEFAULT``. A claim's unit applies nothing (it starts the daemon
again should it have died) and records::

    {"gpu": <uuid>, "daemonId": <12 hex>, "shareId": <id>, "slots": N,
     "memoryMiB": <slot MiB>, "activeThreadPercentage": <slot %>}

A claim holds one slot: two slots (of one GPU or two) are refused, because a
process talks to one MPS pipe and one slot's limits cannot be summed on a
daemon whose defaults are one slot. Config: none, or ``strategy: MPS`` without
``mpsConfig``; ``TimeSlicing`` and ``mpsConfig`` are refused (the administrator
chose enforced slots for the GPU).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dra_driver.gpu.cdi.spec import ContainerEdits
from dra_driver.gpu.checkpoint import Unit
from dra_driver.gpu.config import ConfigError, DeviceConfig
from dra_driver.gpu.hardware.inventory import Gpu, Inventory
from dra_driver.gpu.hardware.naming import devices_by_name
from dra_driver.gpu.planning import Steps, Target, gpu_name_of
from dra_driver.gpu.sharing.mpsdaemons import MIB, MpsDaemons, mps_id, recorded_id
from dra_driver.gpu.sharing.shares import ShareError, can_enforce, share_of
from dra_driver.gpu.sharing.slots import Slot, slot_of, slot_target
from dra_driver.gpu.sharing.strategies.base import NodeTools
from dra_driver.gpu.sharing.strategies.mps import NAME as MPS
from dra_driver.gpu.sharing.strategies.mps import Mps
from dra_driver.gpu.sharing.strategies.mpsshares import SHARED
from dra_driver.gpu.sharing.strategies.timeslicing import NAME as TIME_SLICING
from dra_driver.gpu.sharing.tools import GpuCommands, ToolError

NAME = "MpsSlots"
FALLBACK_MODE = "DEFAULT"
"""The mode restored when the earlier one was never recorded."""


def slot_daemon_id(gpu_uuid: str) -> str:
    """The GPU's slot daemon: 12 hex from its UUID alone. Its first 8 are a hash of a
    name no claim UID can have, so it is one of :meth:`MpsDaemons.ids_for_claim`'s only
    on a 32-bit hash collision, as likely as two claims sharing a prefix."""
    return mps_id(f"mps-slots/{gpu_uuid}", [SHARED, gpu_uuid])


class MpsSlotsStrategy:
    name = NAME
    config = None

    selects = frozenset({None, MPS, TIME_SLICING})
    shares_only = True

    def __init__(self, node: NodeTools) -> None:
        self._commands: GpuCommands = node.commands
        self._daemons: MpsDaemons = node.daemons
        self._inventory: Callable[[], Inventory] = node.inventory
        self._slots = node.slots

    def wants(self, target: Target, config: DeviceConfig) -> bool:
        """Slots on drivers before r615, and every slot whose config asks for time-slicing
        (refused: the GPU's slots are enforced)."""
        if slot_target(target, self._slots) is None:
            return False
        if config.sharing is not None and config.sharing.strategy == TIME_SLICING:
            return True
        return not can_enforce(self._inventory().driver_version)

    def plan(self, claim_uid: str, targets: Sequence[Target], config: DeviceConfig) -> list[Unit]:
        names = ", ".join(sorted({t.name for t in targets}))
        if config.sharing is not None and config.sharing.strategy == TIME_SLICING:
            raise ConfigError(
                f"{config.origin}: sharing.strategy TimeSlicing: {names} is split into enforced "
                "MPS slots by the administrator (--mps-slots); leave the sharing config out "
                "(or use strategy: MPS), or ask for a GPU that is not split"
            )
        if config.sharing is not None and config.sharing.settings != Mps():
            raise ConfigError(
                f"{config.origin}: sharing.mpsConfig: a slot's limits are one slot of {names} "
                "(--mps-slots); leave mpsConfig out"
            )
        self.check_claim(targets)
        (t,) = targets
        slot = slot_target(t, self._slots)
        assert slot is not None and isinstance(t.device, Gpu) and t.share_id is not None
        try:
            share = share_of(t.device, t.consumed_capacity, f"device {t.name} share {t.share_id}")
        except ShareError as exc:
            raise ConfigError(str(exc)) from None
        if share.memory != slot.memory:
            raise ConfigError(
                f"device {t.name} share {t.share_id}: consumedCapacity.memory is "
                f"{share.memory_mib}Mi, not one slot ({slot.memory_mib}Mi of {slot.count}); "
                "was it allocated before --mps-slots changed? Delete and recreate the claim"
            )
        daemon_id = slot_daemon_id(t.uuid)
        problem = self._daemons.depth_problem(daemon_id)
        if problem is not None:
            raise ConfigError(f"{names}: MPS slots are not available on this node: {problem}")
        record = {
            "gpu": t.uuid,
            "daemonId": daemon_id,
            "shareId": t.share_id,
            "slots": slot.count,
            "memoryMiB": slot.memory_mib,
            "activeThreadPercentage": slot.percent,
        }
        return [Unit(NAME, (t.name,), record=record, shared=(f"{gpu_name_of(t.name)}/{SHARED}",))]

    def check_claim(self, targets: Sequence[Target]) -> None:
        """One slot per claim (see the module docstring); ``targets``: all of a claim's
        slot targets, whatever their configs."""
        if len(targets) < 2:
            return
        held = ", ".join(f"{t.name} (request {t.request})" for t in targets)
        if len({t.uuid for t in targets}) == 1:
            why = (
                "its processes would share one slot daemon whose limits are one slot each; "
                "slots cannot be summed"
            )
        else:
            why = "a CUDA process talks to one MPS pipe, and each slot GPU has its own daemon"
        raise ConfigError(
            f"the claim holds {len(targets)} MPS slots: {held}; a claim may hold one slot, "
            f"because {why}. Use one claim per slot (a pod may have several), or a GPU "
            "without --mps-slots"
        )

    # -- the per-GPU shared resource: the daemon and EXCLUSIVE_PROCESS -----------------

    def _gpu(self, key: str) -> Gpu | None:
        found = devices_by_name(self._inventory()).get(key.split("/", 1)[0])
        return found if isinstance(found, Gpu) else None

    def acquire(self, key: str, steps: Steps) -> Mapping[str, Any]:
        gpu = self._gpu(key)
        slot = slot_of(gpu, self._slots) if gpu is not None else None
        if gpu is None or slot is None:
            raise ToolError(f"{key}: no GPU split into MPS slots (--mps-slots) on this node")
        daemon_id = slot_daemon_id(gpu.uuid)
        # A daemon of ours already up: an earlier acquire set the mode, so what the GPU
        # says now is ours, not the mode to restore.
        previous = FALLBACK_MODE
        if not self._daemons.running(daemon_id):
            previous = self._commands.compute_mode(gpu.uuid)
        self._commands.set_compute_mode(gpu.uuid, "EXCLUSIVE_PROCESS")
        steps.done(f"compute-mode:{gpu.uuid}")
        self._bring_up(gpu.uuid, slot, steps)
        return {
            "gpu": gpu.uuid,
            "daemonId": daemon_id,
            "computeMode": "EXCLUSIVE_PROCESS",
            "previousMode": previous,
            "slots": slot.count,
            "memoryMiB": slot.memory_mib,
            "activeThreadPercentage": slot.percent,
        }

    def _bring_up(self, uuid: str, slot: Slot, steps: Steps) -> None:
        self._daemons.bring_up(
            slot_daemon_id(uuid),
            [uuid],
            active_thread_percentage=slot.percent,
            pinned_memory={uuid: slot.memory},
            done=steps.done,
        )

    def release(self, key: str, record: Mapping[str, Any], steps: Steps) -> None:
        uuid = str(record["gpu"]) if record.get("gpu") else None
        if uuid is None:
            gpu = self._gpu(key)
            if gpu is None:
                return  # the GPU is gone, and its daemon and mode with it
            uuid = gpu.uuid
        daemon_id = recorded_id(record) if record.get("daemonId") else slot_daemon_id(uuid)
        self._daemons.tear_down(daemon_id, steps.done)
        self._commands.set_compute_mode(uuid, str(record.get("previousMode") or FALLBACK_MODE))
        steps.done(f"compute-mode-reset:{uuid}")

    # -- one claim's slot ---------------------------------------------------------------

    def apply(self, unit: Unit, steps: Steps) -> None:
        """Nothing of its own; a daemon that died since is started again (same limits),
        from a clean directory (what it left, a stale control pipe, goes first). Claims
        already prepared keep their mounts of the old directory and must be recreated."""
        daemon_id = recorded_id(unit.record)
        if not self._daemons.running(daemon_id):
            uuid = str(unit.record["gpu"])
            self._daemons.tear_down(daemon_id, steps.done)
            self._daemons.bring_up(
                daemon_id,
                [uuid],
                active_thread_percentage=int(unit.record["activeThreadPercentage"]),
                pinned_memory={uuid: int(unit.record["memoryMiB"]) * MIB},
                done=steps.done,
            )

    def undo(self, unit: Unit, steps: Steps) -> None:
        pass  # the daemon is the GPU's, released with its last slot

    def edits(self, unit: Unit, device: str, edits: ContainerEdits) -> ContainerEdits:
        """The GPU daemon's pipe and ``/dev/shm``, and one slot's limits for the client
        side (the daemon's defaults hold without them)."""
        env = (
            f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={int(unit.record['activeThreadPercentage'])}",
            f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={int(unit.record['memoryMiB'])}M",
        )
        daemon = self._daemons.container_edits(recorded_id(unit.record))
        return edits.merged(daemon).merged(ContainerEdits(env=env))

    def forget(self, claim_uid: str) -> None:
        pass  # nothing is a claim's own

    def after_reboot(self) -> None:
        self._daemons.remove_all_dirs()
