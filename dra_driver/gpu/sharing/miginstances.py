"""Creating and destroying the MIG instances of dynamic MIG through NVML.

What a prepare does for one allocated partition, each step idempotent on undo:

1. create the GPU instance of the partition's profile at exactly its placement
   (``nvmlDeviceCreateGpuInstanceWithPlacement``; another instance there is
   ``NVML_ERROR_INSUFFICIENT_RESOURCES``, reported as such);
2. create its compute instance spanning the whole GPU instance;
3. wait until the driver lists both capabilities under
   ``/proc/driver/nvidia/capabilities`` (their minors go into the CDI spec) and
   their ``/dev/nvidia-caps`` nodes exist.

:class:`MigRequest` is everything known before step 1 (it is checkpointed
first); the IDs NVML assigns come back one at a time so the caller can record
each before the next step can fail. Undo works from whatever was recorded: an
unknown GI ID is found again by the recorded placement (the scheduler gave
that placement to this claim alone), an unknown CI ID means every CI of that GI.
A GI whose profile or placement differs from the record is somebody else's and
is never touched.

One long-lived NVML session with GPU handles cached by UUID: a handle lookup by
UUID can take seconds on a loaded node (perf-anchors.md), and prepare and
unprepare must stay well inside the kubelet's 45 s.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from dra_driver.errors import DriverError
from dra_driver.gpu.hardware.discovery import cap_minor
from dra_driver.gpu.hardware.inventory import MigInstance, MigPlacement, MigProfile
from dra_driver.gpu.hardware.nvml import Handle, Nvml, NvmlError
from dra_driver.gpu.hardware.nvmlerrors import NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_FOUND
from dra_driver.gpu.host.hostpaths import HostPaths

# NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE index by compute-slice count.
CI_PROFILE_BY_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}


class MigError(DriverError):
    """A MIG instance could not be created, found or destroyed; the message says which."""


@dataclass(frozen=True)
class MigRequest:
    """One partition to create: recorded before anything is created."""

    gpu_uuid: str
    gpu_minor: int
    gpu_index: int
    profile_id: int
    profile_name: str
    slices: int
    start: int
    size: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MigRequest:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Created:
    """What exists after a successful create."""

    gi_id: int
    ci_id: int
    uuid: str
    gi_cap_minor: int
    ci_cap_minor: int


class MigInstances:
    """Thread-safe; one NVML session for the life of the plugin (opened on first use)."""

    def __init__(
        self,
        *,
        host: HostPaths,
        logger: logging.Logger,
        nvml: Nvml | None = None,
        node_timeout_s: float = 10.0,
    ) -> None:
        self._host = host
        self._log = logger
        self._nvml = nvml
        self._open = False
        self._node_timeout_s = node_timeout_s
        self._lock = threading.Lock()
        self._handles: dict[str, Handle] = {}
        self._ours: set[tuple[str, int, int]] = set()

    def note_discovery(self, ours: Iterable[tuple[str, int, int]]) -> None:
        """The GPU instances that were ours when the current inventory was discovered."""
        with self._lock:
            self._ours = set(ours)

    def ours(self) -> set[tuple[str, int, int]]:
        """``(GPU UUID, GI profile ID, start)`` of instances ours since the last discovery:
        an inventory older than a destroy still lists them, and they are not others'."""
        with self._lock:
            return set(self._ours)

    def _session(self) -> Nvml:
        with self._lock:
            if self._nvml is None:
                self._nvml = Nvml()
            if not self._open:
                self._nvml.init()
                self._open = True
            return self._nvml

    def close(self) -> None:
        with self._lock:
            if self._open and self._nvml is not None:
                try:
                    self._nvml.shutdown()
                except NvmlError as exc:
                    self._log.warning("NVML shutdown failed: %s", exc)
            self._open = False
            self._handles.clear()

    def _gpu(self, nvml: Nvml, uuid: str) -> Handle:
        with self._lock:
            handle = self._handles.get(uuid)
        if handle is None:
            handle = nvml.handle_by_uuid(uuid)
            with self._lock:
                self._handles[uuid] = handle
        return handle

    # ---- create ------------------------------------------------------------------------
    def create_gpu_instance(self, req: MigRequest) -> int:
        nvml = self._session()
        try:
            gi = nvml.create_gpu_instance(
                self._gpu(nvml, req.gpu_uuid), req.profile_id, req.start, req.size
            )
            with self._lock:
                self._ours.add((req.gpu_uuid, req.profile_id, req.start))
            return nvml.gpu_instance_info(gi)[0]
        except NvmlError as exc:
            why = (
                "the placement is taken (another instance overlaps it, or the profile's "
                "instance count is reached)"
                if exc.insufficient_resources
                else str(exc)
            )
            raise MigError(
                f"create GPU instance {req.profile_name} at memory slice {req.start} on GPU "
                f"{req.gpu_uuid}: {why}"
            ) from exc

    def create_compute_instance(self, req: MigRequest, gi_id: int) -> tuple[int, str]:
        """The CI spanning GI ``gi_id``: ``(ci_id, MIG device UUID)``."""
        nvml = self._session()
        try:
            gi = nvml.gpu_instance_by_id(self._gpu(nvml, req.gpu_uuid), gi_id)
            ci_profile = nvml.ci_profile_id(gi, CI_PROFILE_BY_SLICES[req.slices])
            ci = nvml.create_compute_instance(gi, ci_profile)
            ci_id, _, mig = nvml.compute_instance_info(ci)
            return ci_id, nvml.uuid(mig)
        except (NvmlError, KeyError) as exc:
            raise MigError(
                f"create compute instance in GPU instance {gi_id} ({req.profile_name}) on GPU "
                f"{req.gpu_uuid}: {exc}"
            ) from exc

    def wait_for_nodes(self, req: MigRequest, gi_id: int, ci_id: int) -> tuple[int, int]:
        """The GI's and CI's capability minors, once the driver lists them and their
        ``/dev/nvidia-caps`` nodes exist. Missing procfs entries fail; nodes that never
        appear are only warned about: the CDI spec names them fully (type, major,
        minor), so the runtime creates them in the container."""
        deadline = time.monotonic() + self._node_timeout_s
        minors: tuple[int, int] | None = None
        while True:
            if minors is None:
                try:
                    minors = (
                        cap_minor(self._host, req.gpu_minor, gi_id),
                        cap_minor(self._host, req.gpu_minor, gi_id, ci_id),
                    )
                except (OSError, ValueError) as exc:
                    if time.monotonic() >= deadline:
                        raise MigError(
                            f"MIG capabilities of GI {gi_id} / CI {ci_id} on GPU "
                            f"{req.gpu_uuid} did not appear in {self._node_timeout_s:g} s: {exc}"
                        ) from exc
            if minors is not None:
                missing = [
                    m
                    for m in minors
                    if not self._host.dev("nvidia-caps", f"nvidia-cap{m}").exists()
                ]
                if not missing:
                    return minors
                if time.monotonic() >= deadline:
                    self._log.warning(
                        "MIG capability device nodes missing; the CDI spec creates them",
                        extra={"gpu": req.gpu_uuid, "nodes": missing},
                    )
                    return minors
            time.sleep(0.01)

    # ---- destroy -----------------------------------------------------------------------
    def destroy(
        self, req: MigRequest, gi_id: int | None, on_step: Callable[[str], None] | None = None
    ) -> bool:
        """Destroy the GI a prepare created and its CIs (idempotent); True if it was there.

        ``gi_id`` None: the process died before recording it; found by placement."""
        nvml = self._session()
        try:
            handle = self._gpu(nvml, req.gpu_uuid)
            gi = self._find_gi(nvml, handle, req, gi_id)
            if gi is None:
                return False
            # The GI is ours (profile and placement match the record), so are its CIs.
            for profile in sorted(set(CI_PROFILE_BY_SLICES.values())):
                for ci in self._cis(nvml, gi, profile):
                    nvml.destroy_compute_instance(ci)
                    if on_step is not None:
                        on_step("mig-ci-destroyed")
            nvml.destroy_gpu_instance(gi)
            if on_step is not None:
                on_step("mig-gi-destroyed")
            return True
        except NvmlError as exc:
            raise MigError(
                f"destroy {req.profile_name} at memory slice {req.start} on GPU "
                f"{req.gpu_uuid}: {exc}"
            ) from exc

    def _find_gi(self, nvml: Nvml, handle: Handle, req: MigRequest, gi_id: int | None) -> Any:
        """Our GI: by recorded ID if known, else by recorded placement; None if gone."""
        candidates: list[Handle] = []
        if gi_id is not None:
            try:
                candidates = [nvml.gpu_instance_by_id(handle, gi_id)]
            except NvmlError as exc:
                if exc.code not in (NVML_ERROR_NOT_FOUND, NVML_ERROR_INVALID_ARGUMENT):
                    raise
        else:
            candidates = nvml.gpu_instances(handle, req.profile_id)
        for gi in candidates:
            _, profile_id, start, size = nvml.gpu_instance_info(gi)
            if (profile_id, start, size) == (req.profile_id, req.start, req.size):
                return gi
            self._log.warning(
                "GPU instance is not the one we created; leaving it alone",
                extra={"gpu": req.gpu_uuid, "gi": gi_id, "profile": profile_id, "start": start},
            )
        return None

    @staticmethod
    def _cis(nvml: Nvml, gi: Handle, ci_profile: int) -> list[Handle]:
        try:
            return nvml.compute_instances(gi, ci_profile)
        except NvmlError as exc:
            if exc.not_supported or exc.code == NVML_ERROR_INVALID_ARGUMENT:
                return []
            raise


def mig_instance(req: MigRequest, created: Created, profile: MigProfile) -> MigInstance:
    """The created instance as discovery would describe it (for its CDI edits)."""
    return MigInstance(
        uuid=created.uuid,
        profile=profile,
        gi_id=created.gi_id,
        ci_id=created.ci_id,
        placement=MigPlacement(req.start, req.size),
        parent_uuid=req.gpu_uuid,
        parent_index=req.gpu_index,
        parent_minor=req.gpu_minor,
        gi_cap_minor=created.gi_cap_minor,
        ci_cap_minor=created.ci_cap_minor,
    )
