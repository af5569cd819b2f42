"""Dynamic MIG: an allocated partition's MIG instance is created at prepare, destroyed at unprepare.

Not selected by a config but by the device: every allocated partition
(:class:`~dra_driver.gpu.hardware.partitions.MigPartition`, a profile at a placement
on a GPU in MIG mode, ``--mig-mode dynamic``) gets one unit. Record, written
before anything is created and then after every step that learnt something::

    {"request": {gpuUuid.., profileId, start, size, ...},   # MigRequest: the intent
     "giId": 2, "ciId": 0, "uuid": "MIG-...",               # as NVML assigned them
     "giCapMinor": 300, "ciCapMinor": 301}                  # from /proc, for the spec

Apply: create the GPU instance at exactly the allocated placement, record its
ID; create the compute instance, record its ID and the MIG UUID; wait for the
capabilities and their ``/dev/nvidia-caps`` nodes, record their minors. Undo
destroys the GI and its CIs from whatever was recorded (an unrecorded GI is
found by the recorded placement; one whose profile or placement differs is not
ours and is left alone). The pipeline's rollback and :meth:`recover` at start
undo interrupted prepares and unprepares, so a SIGKILL at any step leaves no
instance behind once the plugin is back.

The claim's container gets the created MIG device: the parent GPU's node plus
the GI and CI capability nodes (:meth:`concrete` turns the partition into the
instance for the CDI spec). Sharing configs (MPS, time-slicing) are refused on
dynamic MIG devices: their settings need the MIG UUID at plan time, which
exists only once the instance is created.

The whole GPU (``gpu-<minor>``) is one of these partitions: the GPU's own
profile that spans every memory and compute slice (NVML's ``7_SLICE`` class,
``7g.80gb`` on an A100 80GB; found in the GPU's profile list by
:func:`~dra_driver.gpu.hardware.partitions.whole_gpu_profile`, not by name) at
placement 0. Decided so rather than leaving it unpublished, because with MIG
mode on the driver runs no CUDA context outside a GPU instance: the bare
``/dev/nvidia<minor>`` would give the pod a GPU it cannot compute on, while
the full instance is as much of the GPU as MIG mode allows (NVIDIA reserves a
few SMs and some memory for MIG, so it publishes the instance's ``memory`` and
``multiprocessors``), and "the whole A100" is what users ask for. It is
created, recorded, destroyed and recovered exactly as every other partition.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dra_driver.gpu.cdi.spec import ContainerEdits
from dra_driver.gpu.checkpoint import Unit
from dra_driver.gpu.config import ConfigError, DeviceConfig, SharingDecoder
from dra_driver.gpu.hardware.inventory import Gpu, Inventory, MigInstance
from dra_driver.gpu.hardware.partitions import InstanceKey, MigPartition, OwnedInstance, catalog
from dra_driver.gpu.planning import Steps, Target
from dra_driver.gpu.sharing.miginstances import Created, MigInstances, MigRequest, mig_instance

NAME = "DynamicMIG"


def request_of(part: MigPartition) -> MigRequest:
    gpu = part.parent
    return MigRequest(
        gpu_uuid=gpu.uuid,
        gpu_minor=gpu.minor,
        gpu_index=gpu.index,
        profile_id=part.profile.gi_profile_id,
        profile_name=part.profile.name,
        slices=part.profile.slice_count,
        start=part.placement.start,
        size=part.placement.size,
    )


def owned_by(units: Sequence[Unit]) -> set[OwnedInstance]:
    """The GPU instances these recorded units created (or may have created)."""
    out = set()
    for unit in units:
        if unit.strategy == NAME and "request" in unit.record:
            req = MigRequest.from_json(dict(unit.record["request"]))
            out.add((req.gpu_uuid, req.profile_id, req.start))
    return out


def held_by(claims: Mapping[str, Sequence[Unit]]) -> dict[InstanceKey, tuple[str, str]]:
    """MIG instance -> (claim UID, device name) of the recorded unit that holds it: once
    both its IDs are recorded, until its teardown removes the unit."""
    out = {}
    for uid, units in claims.items():
        for unit in units:
            r = unit.record
            if unit.strategy == NAME and "giId" in r and "ciId" in r and unit.devices:
                req = MigRequest.from_json(dict(r["request"]))
                out[(req.gpu_uuid, int(r["giId"]), int(r["ciId"]))] = (uid, unit.devices[0])
    return out


class DynamicMigStrategy:
    name = NAME
    config: SharingDecoder | None = None

    def __init__(self, instances: MigInstances) -> None:
        self._mig = instances

    # ---- DeviceCatalog ------------------------------------------------------------------
    def devices(self, inventory: Inventory, recorded: Sequence[Unit]) -> Mapping[str, MigPartition]:
        """Partition names of this node; instances others made keep their static names.

        Ours are the recorded ones and those ours when ``inventory`` was discovered (it
        may still list an instance destroyed since)."""
        return catalog(inventory.gpus, owned_by(recorded) | self._mig.ours())

    # ---- SharingStrategy ----------------------------------------------------------------
    def wants(self, target: Target, config: DeviceConfig) -> bool:
        return isinstance(target.device, MigPartition)

    def plan(self, claim_uid: str, targets: Sequence[Target], config: DeviceConfig) -> list[Unit]:
        if config.sharing is not None:
            raise ConfigError(
                f"{config.origin}: sharing.strategy {config.sharing.strategy} is not supported "
                "on dynamic MIG devices (the MIG device and its UUID exist only once "
                f"prepared); devices: {', '.join(t.name for t in targets)}"
            )
        units = []
        for target in targets:
            assert isinstance(target.device, MigPartition)
            req = request_of(target.device)
            # No ``gpus``: creating an instance changes no setting of the GPU (compute mode,
            # time-slice), and several partitions of one GPU may be in one claim.
            units.append(Unit(NAME, (target.name,), record={"request": req.to_json()}))
        return units

    def apply(self, unit: Unit, steps: Steps) -> None:
        req = MigRequest.from_json(dict(unit.record["request"]))
        record: dict[str, Any] = dict(unit.record)
        where = f"{req.gpu_uuid}@{req.start}"
        record["giId"] = self._mig.create_gpu_instance(req)
        steps.done(f"mig-gi:{where}")
        steps.record(record)
        record["ciId"], record["uuid"] = self._mig.create_compute_instance(req, record["giId"])
        steps.done(f"mig-ci:{where}")
        steps.record(record)
        record["giCapMinor"], record["ciCapMinor"] = self._mig.wait_for_nodes(
            req, record["giId"], record["ciId"]
        )
        steps.record(record)
        steps.done(f"mig-nodes:{where}")

    def undo(self, unit: Unit, steps: Steps) -> None:
        req = MigRequest.from_json(dict(unit.record["request"]))
        gi_id = unit.record.get("giId")
        where = f"{req.gpu_uuid}@{req.start}"
        self._mig.destroy(
            req, int(gi_id) if gi_id is not None else None, lambda n: steps.done(f"{n}:{where}")
        )

    def edits(self, unit: Unit, device: str, edits: ContainerEdits) -> ContainerEdits:
        return edits  # the concrete instance's own edits (see concrete) are all it needs

    def forget(self, claim_uid: str) -> None:
        pass  # nothing is named after a claim; instances are known only from records

    def after_reboot(self) -> None:
        pass  # GPU instances do not survive a reboot, and no file is kept

    # ---- Materializes -------------------------------------------------------------------
    def concrete(self, unit: Unit, target: Target) -> Gpu | MigInstance:
        """The MIG instance :meth:`apply` created for ``target``."""
        assert isinstance(target.device, MigPartition)
        r = unit.record
        created = Created(
            gi_id=int(r["giId"]),
            ci_id=int(r["ciId"]),
            uuid=str(r["uuid"]),
            gi_cap_minor=int(r["giCapMinor"]),
            ci_cap_minor=int(r["ciCapMinor"]),
        )
        return mig_instance(
            MigRequest.from_json(dict(r["request"])), created, target.device.profile
        )
