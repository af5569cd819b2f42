"""The emulated GPUs' MIG instances: what exists now, the placement rules, and where it is kept.

Real GPU instances (GIs) and compute instances (CIs) live in the driver, not
in the process that created them: they survive a plugin crash and are seen by
every process on the node. So the emulation keeps them in one JSON file in
the emulated root (``emulation/mig-state.json``), changed under an exclusive
``flock`` and replaced atomically, and every process emulating that root (the
plugin under test, a restarted plugin, the test itself) reads the same
instances. Without a file (a bare library in a unit test) they live in memory.

Placement rules, as NVML applies them (``docs/nvml.md``):

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_driver.gpu.emulation.hardware import EmulatedGpu, EmulatedMigProfile, EmulatedProfile
from dra_driver.gpu.emulation.hosttree import remove_mig_caps, write_mig_caps
from dra_driver.gpu.hostpaths import HostPaths

# NVML return codes the rules produce (nvml.h).
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NOT_FOUND = 6
ERROR_IN_USE = 19
ERROR_INSUFFICIENT_RESOURCES = 23

STATE_FILE = Path("emulation/mig-state.json")
_GI_ID_BASE = {8: 0, 4: 1, 2: 3, 1: 7}
# NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE index (== profile id) by compute-slice count.
CI_PROFILE_BY_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
CI_SLICES_BY_PROFILE = {v: k for k, v in CI_PROFILE_BY_SLICES.items()}


class MigRuleError(Exception):
    """An NVML call breaks a placement rule; ``code`` is what NVML returns."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def gi_id_for(start: int, size: int) -> int:
    """The GI ID NVML assigns to a placement (its node in the memory-slice tree)."""
    return _GI_ID_BASE.get(size, 0) + start // max(size, 1)


def ci_profiles_for(gi_slices: int) -> list[int]:
    """CI profile IDs a GI with ``gi_slices`` compute slices offers (no 3-of-4 split)."""
    return [
        CI_PROFILE_BY_SLICES[s]
        for s in sorted(CI_PROFILE_BY_SLICES)
        if s <= gi_slices and not (gi_slices == 4 and s == 3)
    ]


@dataclass
class ComputeInstance:
    ci_id: int
    profile_id: int
    """CI profile ID (``NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE``)."""
    start: int
    """First compute slice within the GI."""
    uuid: str

    @property
    def slices(self) -> int:
        return CI_SLICES_BY_PROFILE[self.profile_id]


@dataclass
class GpuInstance:
    gi_id: int
    profile: EmulatedMigProfile
    start: int
    cis: dict[int, ComputeInstance] = field(default_factory=dict)

    @property
    def memory_slices(self) -> set[int]:
        return set(range(self.start, self.start + self.profile.placement_size))


@dataclass(frozen=True)
class MigDevice:
    """One MIG device (a CI) as NVML's device queries see it."""

    gpu: EmulatedGpu
    gi: GpuInstance
    ci: ComputeInstance

    @property
    def profile(self) -> EmulatedMigProfile:
        return self.gi.profile

    @property
    def uuid(self) -> str:
        return self.ci.uuid

    @property
    def gi_id(self) -> int:
        return self.gi.gi_id

    @property
    def ci_id(self) -> int:
        return self.ci.ci_id

    @property
    def start(self) -> int:
        return self.gi.start

    @property
    def full(self) -> bool:
        """The CI covers its whole GI (the MIG device has the GI profile's figures)."""
        return self.ci.slices >= self.gi.profile.slices

    @property
    def name(self) -> str:
        """Profile name as NVML prints it: ``3g.40gb``, or ``1c.3g.40gb`` for a smaller CI."""
        p = self.gi.profile
        return p.name if self.full else f"{self.ci.slices}c.{p.name}"

    @property
    def multiprocessors(self) -> int:
        p = self.gi.profile
        return p.multiprocessors if self.full else p.multiprocessors * self.ci.slices // p.slices


def _initial(profile: EmulatedProfile) -> dict[int, dict[int, GpuInstance]]:
    """The instances an administrator left in the profile (static MIG)."""
    out: dict[int, dict[int, GpuInstance]] = {}
    for gpu in profile.gpus:
        gis: dict[int, GpuInstance] = {}
        for m in gpu.mig_instances:
            gis[m.gi_id] = GpuInstance(
                gi_id=m.gi_id,
                profile=m.profile,
                start=m.start,
                cis={
                    m.ci_id: ComputeInstance(
                        m.ci_id, CI_PROFILE_BY_SLICES[m.profile.slices], 0, m.uuid
                    )
                },
            )
        out[gpu.index] = gis
    return out


def _gi_json(gi: GpuInstance) -> dict[str, Any]:
    cis = [
        {"ciId": c.ci_id, "profileId": c.profile_id, "start": c.start, "uuid": c.uuid}
        for c in gi.cis.values()
    ]
    return {"giId": gi.gi_id, "profileId": gi.profile.id, "start": gi.start, "cis": cis}


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
        self._gis = _initial(profile)
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
            self._gis = _initial(self.profile)
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
        gpus = {str(slot): [_gi_json(gi) for gi in gis.values()] for slot, gis in self._gis.items()}
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
            self._gis = _initial(self.profile)
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
