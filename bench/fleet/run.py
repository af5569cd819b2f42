"""One fleet run on a started :class:`~dra_driver.devcluster.Cluster`: nodes, slices,
claims, the ``--fill``, then the timed pods. :func:`run_fleet` is what
``python -m bench.fleet`` and ``tests/cluster/test_fleet.py`` both call."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from bench.fleet.capacity import node_allocations
from bench.fleet.claims import Shape, shape
from bench.fleet.fill import FillMode, fill_allocated
from bench.fleet.measure import BindWatch, footprint, latencies
from bench.fleet.minimal import minimal_classes, minimal_pool
from bench.fleet.pools import DRIVER, DriverFlags, api_devices, node_pool, publish
from dra_driver.devcluster import Cluster
from dra_driver.plugin.kubeclient import KubeClient
from dra_driver.plugin.resources import Pool

ROOT = Path(__file__).resolve().parents[2]
DEVICECLASSES = ROOT / "deploy" / "deviceclasses"
RESOURCE = "/apis/resource.k8s.io/v1"
NAMESPACE = "fleet"
TEMPLATE = "fleet-claim"
CLIENT_QPS = 1000
CLIENT_BURST = 2000
"""What ``bench.fleet`` gives kube-scheduler and kube-controller-manager
(``--kube-api-qps``/``--kube-api-burst``), as docs/scale.md tells admins to."""

PoolShape = Literal["driver", "minimal"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FleetSettings:
    profile: str
    """A built-in emulator profile name or a profile YAML file."""
    nodes: int = 10
    pods: int = 50
    claim: str = "whole"
    precreated: bool = False
    """Claims made before the timed pods (else the pods' ResourceClaimTemplate)."""
    fill: float = 0.0
    """Fraction of the fleet's capacity for this claim shape allocated before timing."""
    fill_mode: FillMode = "allocated"
    """How the fill is made (:mod:`bench.fleet.fill`)."""
    flags: DriverFlags = field(default_factory=DriverFlags)
    shape: PoolShape = "driver"
    """``minimal``: publish :func:`~bench.fleet.minimal.minimal_pool` instead (docs/scale.md)."""
    timeout_s: float = 300.0
    workers: int = 4
    """Threads that create pods (and claims) at once."""
    cpu_profile: Path | None = None
    """Write kube-scheduler's CPU profile of the timed pods' first ``cpu_profile_s``
    seconds here (needs ``ClusterOptions(profiling=True)``)."""
    cpu_profile_s: int = 10


@dataclass
class FleetRun:
    """The JSON summary plus what the checks need."""

    summary: dict[str, Any]
    pool: Pool
    """What every node published (the minimal pool for ``--shape minimal``)."""
    shape: Shape
    spec: dict[str, Any]
    """The claims' spec as created (the minimal form for ``--shape minimal``)."""
    classes: list[dict[str, Any]]
    """The DeviceClasses as applied."""
    devices: list[dict[str, Any]]
    """The driver's devices of one node; a minimal pool's are these names, fewer fields."""
    node_names: list[str]
    timed: list[str]
    fill: list[str]


def deviceclasses() -> list[dict[str, Any]]:
    """The chart's DeviceClasses, as ``deploy/deviceclasses/`` holds them."""
    return [yaml.safe_load(p.read_text()) for p in sorted(DEVICECLASSES.glob("*.yaml"))]


def published(
    settings: FleetSettings, driver_pool: Pool, claim: Shape
) -> tuple[Pool, dict[str, Any], list[dict[str, Any]]]:
    """Pool, claim spec and DeviceClasses of a ``settings.shape`` run."""
    if settings.shape == "driver":
        return driver_pool, claim.spec, deviceclasses()
    if claim.minimal is None:
        raise ValueError(f"--claim {claim.name} has no minimal form (it tests two attributes)")
    pool = minimal_pool(driver_pool, claim.minimal)
    return pool, claim.minimal.spec, minimal_classes(deviceclasses())


def pod_manifest(name: str, claim: str, *, template: bool) -> dict[str, Any]:
    ref = {"resourceClaimTemplateName" if template else "resourceClaimName": claim}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "resourceClaims": [{"name": "gpu", **ref}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/pause:1",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }


def _in_parallel(fn: Callable[[str], None], names: Sequence[str], workers: int) -> None:
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fleet") as ex:
        for _ in ex.map(fn, names):
            pass


def _create_pods(
    cluster: Cluster, names: Sequence[str], settings: FleetSettings, spec: dict[str, Any]
) -> dict[str, float]:
    """Create the pods (claims first when pre-created); POST time of each."""
    if settings.precreated:

        def claim(name: str) -> None:
            body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                    "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}  # fmt: skip
            cluster.rest.create(f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims", body)

        _in_parallel(claim, names, settings.workers)
    created: dict[str, float] = {}

    def pod(name: str) -> None:
        pre = settings.precreated
        body = pod_manifest(name, name if pre else TEMPLATE, template=not pre)
        created[name] = time.monotonic()
        cluster.rest.create(f"/api/v1/namespaces/{NAMESPACE}/pods", body)

    _in_parallel(pod, names, settings.workers)
    return created


def _node_maker(cluster: Cluster) -> Callable[[str], None]:
    def make(name: str) -> None:
        cluster.create_node(name)

    return make


def _start_cpu_profile(cluster: Cluster, settings: FleetSettings) -> threading.Thread | None:
    """Fetch kube-scheduler's ``/debug/pprof/profile`` while the timed pods schedule:
    where its time goes per pod (``go tool pprof -top``), e.g. converting slices."""
    out = settings.cpu_profile
    if out is None:
        return None
    seconds = settings.cpu_profile_s

    def fetch() -> None:
        body = cluster.fetch(
            "kube-scheduler", f"/debug/pprof/profile?seconds={seconds}", timeout=seconds + 60
        )
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(body)

    thread = threading.Thread(target=fetch, name="scheduler-cpu-profile", daemon=True)
    thread.start()
    return thread


def run_fleet(cluster: Cluster, settings: FleetSettings) -> FleetRun:
    """Build the fleet on ``cluster`` and time ``settings.pods`` pods; never raises for
    pods left unbound (``bound`` < ``pods`` says so)."""
    began = time.monotonic()
    driver_pool = node_pool(settings.profile, settings.flags)
    devices = api_devices(driver_pool)
    claim_shape = shape(settings.claim, devices)
    pool, spec, classes = published(settings, driver_pool, claim_shape)
    try:
        held = node_allocations(pool, spec, classes)
    except ValueError as err:
        raise ValueError(
            f"no device of a {settings.profile} node ({len(devices)} published with these "
            f"flags) can satisfy --claim {settings.claim}; pods would never bind ({err})"
        ) from err
    capacity = len(held) * settings.nodes
    fill = [f"fill-{i:05d}" for i in range(int(settings.fill * capacity))]
    if settings.fill and settings.pods > capacity - len(fill):
        raise ValueError(
            f"--pods {settings.pods} exceeds the {capacity - len(fill)} claims left after "
            f"--fill {settings.fill} ({len(fill)} of the fleet's {capacity}); the rest "
            "could never bind"
        )
    cluster.apply(classes)
    names = [f"fleet-{i:04d}" for i in range(settings.nodes)]
    _in_parallel(_node_maker(cluster), names, settings.workers)
    setup_s = time.monotonic() - began

    t0 = time.monotonic()
    client = KubeClient.from_kubeconfig(str(cluster.kubeconfig), pool_size=16)
    try:
        statuses = publish(client, names, pool)
    finally:
        client.close()
    publish_s = time.monotonic() - t0
    unsynced = [n for n, s in zip(names, statuses, strict=True) if not s.in_sync]
    if unsynced:
        raise RuntimeError(f"slices not published for {len(unsynced)} node(s): {unsynced[:5]}")
    listed = cluster.rest.get(f"{RESOURCE}/resourceslices")["items"]
    slice_bytes = sum(len(json.dumps(s, separators=(",", ":"))) for s in listed)

    cluster.create_namespace(NAMESPACE)
    if not settings.precreated:
        cluster.rest.create(
            f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaimtemplates",
            {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
             "metadata": {"name": TEMPLATE, "namespace": NAMESPACE}, "spec": {"spec": spec}},
        )  # fmt: skip
    timed = [f"pod-{i:05d}" for i in range(settings.pods)]
    watch = BindWatch(cluster, NAMESPACE)
    watch.start()
    try:
        t0 = time.monotonic()
        if settings.fill_mode == "allocated":
            fill_allocated(
                cluster, NAMESPACE, fill, names, held, spec,
                lambda fn, items: _in_parallel(fn, items, 2 * settings.workers),
            )  # fmt: skip
        else:
            _create_pods(cluster, fill, settings, spec)
        if settings.fill_mode == "scheduled" and not watch.wait(fill, settings.timeout_s):
            raise RuntimeError(
                f"--fill: {len(fill) - len(watch.bound)} of {len(fill)} pods not bound "
                f"within {settings.timeout_s:.0f} s"
            )
        fill_s = time.monotonic() - t0
        profiler = _start_cpu_profile(cluster, settings)
        created = _create_pods(cluster, timed, settings, spec)
        watch.wait(timed, settings.timeout_s)
        if profiler is not None:
            profiler.join(settings.cpu_profile_s + 60)
    finally:
        watch.stop()
    summary = {
        "nodes": settings.nodes,
        "pods": settings.pods,
        **latencies(created, watch.bound),
        **footprint(cluster),
        "slice_bytes_per_node": round(slice_bytes / max(1, settings.nodes)),
        "slices_per_node": round(len(listed) / max(1, settings.nodes), 2),
        "devices_per_node": len(devices),
        "shape": settings.shape,
        "profile": str(settings.profile),
        "mig_mode": settings.flags.mig_mode,
        "dynamic_mig_attributes": settings.flags.placement_attributes,
        "claim": claim_shape.name,
        "claim_note": claim_shape.note,
        "claims": "pre-created" if settings.precreated else "ResourceClaimTemplate",
        "capacity_claims": capacity,
        "fill_pods": len(fill),
        "fill_mode": settings.fill_mode,
        "fill_s": round(fill_s, 2),
        "setup_s": round(setup_s, 2),
        "publish_s": round(publish_s, 2),
        "client_qps": cluster.options.client_qps,
        "client_burst": cluster.options.client_burst,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "driver": DRIVER,
    }
    return FleetRun(summary, pool, claim_shape, spec, classes, devices, names, timed, fill)
