"""How much of each allocated GPU its pods use: NVML process data mapped to pods.

Every ``interval_s`` the sampler asks NVML, per GPU that backs a prepared
claim, which processes run on it (PID, memory, MIG instance) and how busy each
was since the last sample (``nvmlDeviceGetProcessUtilization``), reads each
PID's cgroup under the host's ``/proc`` to find its pod UID, and attributes it
to the claim's pods. One :class:`UsageSample` per (claim, pod, device) results;
the metrics collector exports the latest set, so a released claim's series
disappear with its next sample (bounded cardinality: series = prepared
devices x their pods).

MIG devices: NVML reports no per-process utilization on MIG, so a MIG device
has memory figures only (processes filtered by GPU/compute instance ID).
Shares (time-slicing, MPS): each pod's fraction of what all pods on the GPU
use, for utilization and memory.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from dra_driver.gpu.hardware.inventory import Inventory
from dra_driver.gpu.hardware.naming import gpu_device_name, mig_device_name
from dra_driver.gpu.hardware.nvml import Nvml, NvmlError
from dra_driver.gpu.hardware.nvmlmonitor import ProcessInfo
from dra_driver.gpu.host.hostpaths import HostPaths
from dra_driver.plugin.claimbook import PreparedClaim
from dra_driver.retries import Retry

_POD_UID = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
)
_LABELS = ["namespace", "claim", "pod", "device"]


@dataclass(frozen=True)
class UsageTarget:
    """One prepared device of a claim, and the pods the claim is reserved for."""

    namespace: str
    claim: str
    pods: tuple[tuple[str, str], ...]
    """``(pod name, pod UID)`` from the claim's ``status.reservedFor``."""
    device: str
    gpu_uuid: str
    mig: tuple[int, int] | None
    """``(gi_id, ci_id)`` for a MIG device."""
    allocated_bytes: int
    """Memory the claim was given: the GPU's, the MIG profile's, or an MPS share's limit."""
    sharing: str = "exclusive"
    """``exclusive``, ``time-slicing`` or ``mps``."""
    product: str = ""
    profile: str = ""
    """MIG profile name for MIG devices."""


@dataclass(frozen=True)
class UsageSample:
    target: UsageTarget
    pod: str
    utilization: float | None
    """Fraction of the GPU's SMs this pod kept busy (0..1); None where NVML cannot tell."""
    memory_used_bytes: int
    utilization_share: float | None
    """This pod's fraction of all utilization on the GPU (shares)."""
    memory_share: float | None


def targets_for(
    claims: list[PreparedClaim], inventory: Inventory, sharing: dict[str, str] | None = None
) -> list[UsageTarget]:
    """Usage targets of prepared claims: each device looked up in the inventory (a device
    no longer discovered has no target). ``sharing``: claim UID -> strategy name."""
    by_name: dict[str, UsageTarget] = {}
    for gpu in inventory.gpus:
        if gpu.degraded:
            continue
        if not gpu.mig_enabled:
            by_name[gpu_device_name(gpu)] = UsageTarget(
                namespace="", claim="", pods=(), device=gpu_device_name(gpu), gpu_uuid=gpu.uuid,
                mig=None, allocated_bytes=gpu.memory_bytes, product=gpu.product_name,
            )  # fmt: skip
        for m in gpu.mig_instances:
            by_name[mig_device_name(m)] = UsageTarget(
                namespace="", claim="", pods=(), device=mig_device_name(m), gpu_uuid=gpu.uuid,
                mig=(m.gi_id, m.ci_id), allocated_bytes=m.profile.memory_bytes,
                product=gpu.product_name, profile=m.profile.name,
            )  # fmt: skip
    out = []
    for c in claims:
        for device, _share in c.devices:
            base = by_name.get(device)
            if base is not None:
                out.append(
                    replace(
                        base,
                        namespace=c.ref.namespace,
                        claim=c.ref.name,
                        pods=c.pods,
                        sharing=(sharing or {}).get(c.ref.uid, "exclusive"),
                    )
                )
    return out


def pod_uid_of(host: HostPaths, pid: int) -> str | None:
    """The pod UID in a process's cgroup path (systemd or cgroupfs driver), if any."""
    try:
        text = host.proc(str(pid), "cgroup").read_text()
    except OSError:
        return None
    match = _POD_UID.search(text)
    return match.group(1).replace("_", "-") if match else None


class UsageSampler:
    def __init__(
        self,
        *,
        nvml: Nvml,
        host: HostPaths,
        targets: Callable[[], list[UsageTarget]],
        interval_s: float,
        logger: logging.Logger,
    ) -> None:
        self._nvml = nvml
        self._host = host
        self._targets = targets
        self._interval_s = interval_s
        self._log = logger
        self._lock = threading.Lock()
        self._latest: list[UsageSample] = []
        self._last_seen_us: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.cpu_seconds = 0.0
        """Thread CPU time spent sampling (the cost this feature adds)."""
        self.samples = 0

    def start(self) -> None:
        self._nvml.init()
        self._thread = threading.Thread(target=self._loop, name="gpu-usage", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
            self._nvml.shutdown()

    def _loop(self) -> None:
        retry = Retry("GPU usage sampling (retried each interval)", self._log, paced=False)
        while not self._stop.wait(self._interval_s):
            try:
                self.sample_once()
                retry.succeeded()
            except Exception as exc:
                retry.failed(exc)

    def latest(self) -> list[UsageSample]:
        """The last sample, less claims released since (their series go at once)."""
        current = {(t.namespace, t.claim, t.device) for t in self._targets()}
        with self._lock:
            return [s for s in self._latest if (s.target.namespace, s.target.claim,
                                                   s.target.device) in current]  # fmt: skip

    def sample_once(self) -> list[UsageSample]:
        started = time.thread_time()
        targets = self._targets()
        by_gpu: dict[str, list[UsageTarget]] = {}
        for t in targets:
            by_gpu.setdefault(t.gpu_uuid, []).append(t)
        samples: list[UsageSample] = []
        for uuid, gpu_targets in by_gpu.items():
            try:
                samples += self._sample_gpu(uuid, gpu_targets)
            except NvmlError as exc:
                self._log.warning(
                    "cannot sample GPU usage", extra={"uuid": uuid, "error": str(exc)}
                )
        with self._lock:
            self._latest = samples
        self.cpu_seconds += time.thread_time() - started
        self.samples += 1
        return samples

    def _sample_gpu(self, uuid: str, targets: list[UsageTarget]) -> list[UsageSample]:
        handle = self._nvml.handle_by_uuid(uuid)
        procs = self._nvml.running_processes(handle)
        util: dict[int, int] = {}
        if any(t.mig is None for t in targets):
            since = self._last_seen_us.get(uuid, 0)
            try:
                for s in self._nvml.process_utilization(handle, since):
                    util[s.pid] = max(util.get(s.pid, 0), s.sm_util)
                    self._last_seen_us[uuid] = max(self._last_seen_us.get(uuid, 0), s.timestamp_us)
            except NvmlError as exc:
                if not exc.not_supported:
                    raise
        owners = {p.pid: pod_uid_of(self._host, p.pid) for p in procs}
        total_util = sum(util.values())
        out = []
        for t in targets:
            mine = [p for p in procs if t.mig is None or (p.gi_id, p.ci_id) == t.mig]
            total_mem = sum(p.used_bytes or 0 for p in mine)
            for pod, pod_uid in t.pods:
                ours = [p for p in mine if owners.get(p.pid) == pod_uid]
                out.append(self._sample(t, pod, ours, util, total_util, total_mem))
        return out

    @staticmethod
    def _sample(
        t: UsageTarget,
        pod: str,
        procs: list[ProcessInfo],
        util: dict[int, int],
        total_util: int,
        total_mem: int,
    ) -> UsageSample:
        mem = sum(p.used_bytes or 0 for p in procs)
        busy = min(100, sum(util.get(p.pid, 0) for p in procs)) if t.mig is None else None
        return UsageSample(
            target=t,
            pod=pod,
            utilization=None if busy is None else busy / 100,
            memory_used_bytes=mem,
            utilization_share=(busy / total_util if busy is not None and total_util else None),
            memory_share=mem / total_mem if total_mem else None,
        )


class UsageCollector:
    """Exports the sampler's latest samples as ``dra_driver_claim_*`` gauges."""

    def __init__(self, sampler: UsageSampler) -> None:
        self._sampler = sampler

    def collect(self) -> Iterator[Metric]:
        util = GaugeMetricFamily(
            "dra_driver_claim_gpu_utilization_ratio",
            "Fraction of the GPU's SMs the pod's processes kept busy (not on MIG devices).",
            labels=_LABELS,
        )
        used = GaugeMetricFamily(
            "dra_driver_claim_gpu_memory_used_bytes",
            "GPU memory used by the pod's processes on the device.",
            labels=_LABELS,
        )
        allocated = GaugeMetricFamily(
            "dra_driver_claim_gpu_memory_allocated_bytes",
            "GPU memory the claim was given on the device (GPU, MIG profile or MPS limit).",
            labels=_LABELS,
        )
        util_share = GaugeMetricFamily(
            "dra_driver_claim_gpu_utilization_share_ratio",
            "The pod's fraction of all utilization on the GPU (shared GPUs).",
            labels=_LABELS,
        )
        mem_share = GaugeMetricFamily(
            "dra_driver_claim_gpu_memory_share_ratio",
            "The pod's fraction of the memory all processes use on the device.",
            labels=_LABELS,
        )
        info = GaugeMetricFamily(
            "dra_driver_claim_device_info",
            "1 per allocated device and pod, with what the device is.",
            labels=[*_LABELS, "product", "profile", "sharing"],
        )
        for s in self._sampler.latest():
            t = s.target
            labels = [t.namespace, t.claim, s.pod, t.device]
            if s.utilization is not None:
                util.add_metric(labels, s.utilization)
            used.add_metric(labels, s.memory_used_bytes)
            allocated.add_metric(labels, t.allocated_bytes)
            if s.utilization_share is not None:
                util_share.add_metric(labels, s.utilization_share)
            if s.memory_share is not None:
                mem_share.add_metric(labels, s.memory_share)
            info.add_metric([*labels, t.product, t.profile, t.sharing], 1)
        cost = CounterMetricFamily(
            "dra_driver_claim_usage_sampling_cpu_seconds",
            "CPU time the plugin spent sampling per-claim GPU usage (NVML and /proc reads).",
        )
        cost.add_metric([], self._sampler.cpu_seconds)
        rounds = CounterMetricFamily(
            "dra_driver_claim_usage_samples", "Per-claim usage sampling rounds."
        )
        rounds.add_metric([], self._sampler.samples)
        yield from (util, used, allocated, util_share, mem_share, info, cost, rounds)
