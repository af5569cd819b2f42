"""The emulated GPUs' MIG instances: what exists now, the placement rules, and where it is kept.

Real GPU instances (GIs) and compute instances (CIs) live in the driver, not
in the process that created them: they survive a plugin crash and are seen by
every process on the node. So the emulation keeps them in one JSON file in
the emulated root (``emulation/mig-state.json``), changed under an exclusive
``flock`` and replaced atomically, and every process emulating that root (the
plugin under test, a restarted plugin, the test itself) reads the same
instances. Without a file (a bare library in a unit test) they live in memory.

Placement rules, as NVML applies them (NVIDIA's NVML API reference and the
MIG user guide; the data and codes are in :mod:`~dra_driver.emulation.migrules`):

* a GI takes the memory slices ``[start, start + size)`` of one of its
  profile's possible placements; overlapping an existing GI, or exceeding the
  profile's instance count (one ``+me`` instance per GPU: one media-engine
  set), is ``NVML_ERROR_INSUFFICIENT_RESOURCES``; a start that is not a
  possible placement is ``NVML_ERROR_INVALID_ARGUMENT``;
* GI IDs are fixed by the placement (the memory-slice tree: size 8 -> 0,
  size 4 -> 1-2, size 2 -> 3-6, size 1 -> 7-14), as the A100 instances in
  ``dgx-a100-mig.yaml`` record;
* CIs take compute slices of their GI; more than the GI has is
  ``INSUFFICIENT_RESOURCES``; a GI with CIs cannot be destroyed
  (``NVML_ERROR_IN_USE``);
* every new CI (a new MIG device) gets a fresh random ``MIG-`` UUID, as on
  hardware: a re-created instance is a different device.

Each change also updates the host tree the way the driver does: the GI's and
CI's ``/proc/driver/nvidia/capabilities/gpu<m>/mig/gi<g>[/ci<c>]/access``
files and their ``/dev/nvidia-caps/nvidia-cap<N>`` nodes appear on create
(the nodes after ``device_node_delay`` seconds, to exercise waiting for them)
and go away on destroy.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import threading
import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path

from dra_driver.emulation.hardware import EmulatedGpu, EmulatedMigProfile, EmulatedProfile
from dra_driver.emulation.hosttree import remove_mig_caps, write_mig_caps
from dra_driver.emulation.migrules import (
    CI_SLICES_BY_PROFILE,
    ERROR_IN_USE,
    ERROR_INSUFFICIENT_RESOURCES,
    ERROR_INVALID_ARGUMENT,
    ERROR_NOT_SUPPORTED,
    ComputeInstance,
    GpuInstance,
    MigDevice,
    MigRuleError,
    ci_profiles_for,
    gi_id_for,
    gi_json,
    initial_instances,
)
from dra_driver.gpu.host.hostpaths import HostPaths

STATE_FILE = Path("emulation/mig-state.json")


class MigState:
    """Every emulated GPU's GIs and CIs; thread- and process-safe with a state file."""

    def __init__(
        self,
        profile: EmulatedProfile,
        *,
        path: Path | None = None,
        host: HostPaths | None = None,
        device_node_delay: float = 0.0,
    ) -> None:
        self.profile = profile
        self.path = path
        self.host = host
        self.device_node_delay = device_node_delay
        self._lock = threading.RLock()
        self._gis = initial_instances(profile)
        self._stamp: tuple[int, int, int] | None = None
        digest = hashlib.sha256(profile.source.encode()).hexdigest()[:16]
        self._identity = f"{profile.name}/{digest}"
        if path is not None:
            with self._file_lock():
                if path.exists():
                    self._load()
                else:
                    self._save()

    # ---- persistence ---------------------------------------------------------------------
    @contextlib.contextmanager
    def _file_lock(self) -> Iterator[None]:
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _file_stamp(self) -> tuple[int, int, int] | None:
        assert self.path is not None
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def _load(self) -> None:
        assert self.path is not None
        data = json.loads(self.path.read_text())
        if data.get("profile") != self._identity:  # another profile was emulated here before
            self._gis = initial_instances(self.profile)
            self._save()
            return
        gis: dict[int, dict[int, GpuInstance]] = {g.index: {} for g in self.profile.gpus}
        for slot, items in data["gpus"].items():
            gpu = self.profile.gpus[int(slot)]
            for item in items:
                profile = next(p for p in gpu.model.mig_profiles if p.id == item["profileId"])
                gi = GpuInstance(item["giId"], profile, item["start"])
                for ci in item["cis"]:
                    gi.cis[ci["ciId"]] = ComputeInstance(
                        ci["ciId"], ci["profileId"], ci["start"], ci["uuid"]
                    )
                gis[int(slot)][gi.gi_id] = gi
        self._gis = gis
        self._stamp = self._file_stamp()

    def _save(self) -> None:
        assert self.path is not None
        gpus = {str(slot): [gi_json(gi) for gi in gis.values()] for slot, gis in self._gis.items()}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"profile": self._identity, "gpus": gpus}, indent=1) + "\n")
        tmp.replace(self.path)
        self._stamp = self._file_stamp()

    def _refresh(self) -> None:
        if self.path is not None and self._file_stamp() != self._stamp:
            with self._file_lock():
                self._load()

    @contextlib.contextmanager
    def _change(self) -> Iterator[None]:
        with self._lock:
            if self.path is None:
                yield
                return
            with self._file_lock():
                self._load()
                yield
                self._save()

    def reset(self) -> None:
        """Back to the profile's instances (what a reboot leaves, once tooling re-applies them)."""
        with self._lock:
            self._gis = initial_instances(self.profile)
            if self.path is not None:
                with self._file_lock():
                    self._save()

    # ---- queries -------------------------------------------------------------------------
    def gpu_instances(self, slot: int) -> list[GpuInstance]:
        with self._lock:
            self._refresh()
            return sorted(self._gis.get(slot, {}).values(), key=lambda g: g.gi_id)

    def gpu_instance(self, slot: int, gi_id: int) -> GpuInstance | None:
        with self._lock:
            self._refresh()
            return self._gis.get(slot, {}).get(gi_id)

    def mig_devices(self, gpu: EmulatedGpu) -> list[MigDevice]:
        """The GPU's MIG devices in NVML's enumeration order (GI ID, then CI ID)."""
        return [
            MigDevice(gpu, gi, ci)
            for gi in self.gpu_instances(gpu.index)
            for ci in sorted(gi.cis.values(), key=lambda c: c.ci_id)
        ]

    def free_placements(self, gpu: EmulatedGpu, profile: EmulatedMigProfile) -> list[int]:
        """Placement starts of ``profile`` still creatable now (0 once its count is reached)."""
        gis = self.gpu_instances(gpu.index)
        if sum(gi.profile.id == profile.id for gi in gis) >= profile.instances:
            return []
        used = set().union(*(gi.memory_slices for gi in gis))
        return [
            s for s in profile.placements if not used & set(range(s, s + profile.placement_size))
        ]

    # ---- changes -------------------------------------------------------------------------
    def create_gpu_instance(
        self, gpu: EmulatedGpu, profile: EmulatedMigProfile, start: int | None, size: int | None
    ) -> GpuInstance:
        """``start=None``: NVML's own choice, the first free placement."""
        if not gpu.mig_enabled:
            raise MigRuleError(ERROR_NOT_SUPPORTED, "MIG mode is disabled")
        with self._change():
            if start is not None and (
                start not in profile.placements or size != profile.placement_size
            ):
                raise MigRuleError(
                    ERROR_INVALID_ARGUMENT,
                    f"({start}, {size}) is not a placement of {profile.name}",
                )
            free = self.free_placements(gpu, profile)
            if start is None:
                if not free:
                    raise MigRuleError(ERROR_INSUFFICIENT_RESOURCES, f"no room for {profile.name}")
                start = free[0]
            elif start not in free:
                raise MigRuleError(
                    ERROR_INSUFFICIENT_RESOURCES,
                    f"{profile.name} at {start} overlaps an instance or exceeds its count",
                )
            gi = GpuInstance(gi_id_for(start, profile.placement_size), profile, start)
            self._gis.setdefault(gpu.index, {})[gi.gi_id] = gi
        self._caps_appear(gpu, gi.gi_id, None)
        return gi

    def destroy_gpu_instance(self, gpu: EmulatedGpu, gi_id: int) -> None:
        with self._change():
            gi = self._gis.get(gpu.index, {}).get(gi_id)
            if gi is None:
                raise MigRuleError(ERROR_INVALID_ARGUMENT, f"GI {gi_id} does not exist")
            if gi.cis:
                raise MigRuleError(ERROR_IN_USE, f"GI {gi_id} still has compute instances")
            del self._gis[gpu.index][gi_id]
        if self.host is not None:
            remove_mig_caps(self.host, gpu.minor, gi_id, None)

    def create_compute_instance(
        self, gpu: EmulatedGpu, gi_id: int, ci_profile_id: int
    ) -> ComputeInstance:
        with self._change():
            gi = self._gis.get(gpu.index, {}).get(gi_id)
            if gi is None:
                raise MigRuleError(ERROR_INVALID_ARGUMENT, f"GI {gi_id} does not exist")
            if ci_profile_id not in ci_profiles_for(gi.profile.slices):
                raise MigRuleError(ERROR_NOT_SUPPORTED, f"CI profile {ci_profile_id} not offered")
            slices = CI_SLICES_BY_PROFILE[ci_profile_id]
            used = sum(c.slices for c in gi.cis.values())
            if used + slices > gi.profile.slices:
                raise MigRuleError(ERROR_INSUFFICIENT_RESOURCES, f"GI {gi_id} has no room")
            ci_id = next(i for i in range(8) if i not in gi.cis)
            ci = ComputeInstance(ci_id, ci_profile_id, used, f"MIG-{uuidlib.uuid4()}")
            gi.cis[ci_id] = ci
        self._caps_appear(gpu, gi_id, ci.ci_id)
        return ci

    def destroy_compute_instance(self, gpu: EmulatedGpu, gi_id: int, ci_id: int) -> None:
        with self._change():
            gi = self._gis.get(gpu.index, {}).get(gi_id)
            if gi is None or ci_id not in gi.cis:
                raise MigRuleError(ERROR_INVALID_ARGUMENT, f"CI {gi_id}/{ci_id} does not exist")
            del gi.cis[ci_id]
        if self.host is not None:
            remove_mig_caps(self.host, gpu.minor, gi_id, ci_id)

    def _caps_appear(self, gpu: EmulatedGpu, gi_id: int, ci_id: int | None) -> None:
        if self.host is None:
            return
        host, minor = self.host, gpu.minor
        write_mig_caps(host, minor, gi_id, ci_id, device_node=self.device_node_delay <= 0)
        if self.device_node_delay > 0:

            def later() -> None:
                if self.gpu_instance(gpu.index, gi_id) is not None:
                    write_mig_caps(host, minor, gi_id, ci_id, device_node=True, proc=False)

            timer = threading.Timer(self.device_node_delay, later)
            timer.daemon = True
            timer.start()

    def sync_host(self) -> None:
        """Make the host tree's MIG capability entries match the instances (at node start)."""
        if self.host is None:
            return
        for gpu in self.profile.gpus:
            remove_mig_caps(self.host, gpu.minor, None, None)
            for gi in self.gpu_instances(gpu.index):
                write_mig_caps(self.host, gpu.minor, gi.gi_id, None, device_node=True)
                for ci in gi.cis.values():
                    write_mig_caps(self.host, gpu.minor, gi.gi_id, ci.ci_id, device_node=True)
