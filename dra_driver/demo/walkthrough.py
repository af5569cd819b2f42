"""``dra-driver demo``: the whole path on one machine, explained as it happens.

Starts a real control plane and two real nodes (kubelet and containerd built
from Go modules, pods run by runc) whose emulated GPUs (dgx-a100 and
dgx-a100-mig) our kubelet plugin serves exactly as the Helm chart runs it,
applies every example in ``deploy/examples/``, lets the kubelets run each pod
(prepare through our plugin, containerd injects the CDI devices, unprepare on
delete) and prints what happened in words a newcomer can follow.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_driver.demo.chart import find_helm
from dra_driver.demo.describe import gpu_commands, spec_summary
from dra_driver.demo.pluginimage import build as build_image
from dra_driver.demo.pluginimage import image_cache
from dra_driver.demo.realgpu import RealGpuNode, keep_running
from dra_driver.demo.realgpupod import RealGpuNodePod
from dra_driver.demo.stack import RESOURCE_API, install_driver_objects, load_examples
from dra_driver.devcluster import Cluster, find_binaries, wait_until
from dra_driver.devcluster.binaries import find_node_binaries
from dra_driver.devcluster.node import NodeImage, RealNode, RealNodeOptions
from dra_driver.gpu.sharing.mpsdaemons import MPS_LONGEST_SOCKET

Print = Callable[[str], None]

NODES = (("demo-dgx-a100", "dgx-a100"), ("demo-dgx-a100-mig", "dgx-a100-mig"))
NAMESPACE = "demo"
INTRO = (
    "dra-driver demo: Dynamic Resource Allocation (DRA) of NVIDIA GPUs, end to end, here.",
    "",
    'With DRA a pod asks for devices through a ResourceClaim ("one GPU with >= 40 GiB").',
    "Our driver publishes each node's GPUs as ResourceSlices; the scheduler picks devices",
    "and writes them into the claim; on the node, the kubelet asks our plugin to prepare",
    "them, and our plugin answers with CDI device IDs; a CDI spec file tells the container",
    "runtime which device nodes, files and environment the container gets.",
    "",
    "Everything below is real: etcd, kube-apiserver, kube-scheduler, kube-controller-",
    "manager, two kubelets and containerds (built from Go modules; containerd applies",
    "the CDI specs) and runc. Only the GPUs are emulated (an NVML stand-in and device",
    "files under the work directory), so no GPU is needed.",
)
SUMMARY_HEAD = ("pod", "node", "devices", "outcome")
SOCKET_PATH_MAX = 108
"""sun_path size on Linux, terminating NUL included."""
EXAMPLES = (
    ("gpu-by-memory.yaml", "one full GPU with at least 40 GiB of memory"),
    ("four-gpus-one-numa.yaml", "four full GPUs on the same NUMA node"),
    ("mig-1g.yaml", "one MIG slice of profile 1g.10gb"),
    ("time-sliced.yaml", "one GPU with the Long compute time slice"),
    ("mps.yaml", "one GPU shared by two pods through MPS, with limits"),
    ("invalid-config.yaml", "a claim with a typo in its opaque config"),
)


@dataclass(frozen=True)
class DemoOptions:
    repo: Path
    workdir: Path | None = None
    keep: bool = False
    cdi_json: bool = False


@contextmanager
def _workdir(options: DemoOptions) -> Iterator[Path]:
    if options.workdir is not None:
        options.workdir.mkdir(parents=True, exist_ok=True)
        yield options.workdir
        return
    path = Path(tempfile.mkdtemp(prefix="dra-demo-", dir="/tmp"))
    try:
        yield path
    finally:
        if not options.keep:
            shutil.rmtree(path, ignore_errors=True)


def run_demo(options: DemoOptions, out: Print) -> int:
    """Run the walkthrough; returns 0 when every example behaved as described."""
    with _workdir(options) as work, ExitStack() as stack:
        longest = (
            work
            / "n1"
            / "kubelet/plugins/gpu.nvidia.com/mps"
            / ("0" * 12)
            / "pipe"
            / MPS_LONGEST_SOCKET
        )
        if len(str(longest).encode()) >= SOCKET_PATH_MAX:
            out(f"The work directory {work} is too long: socket paths below it would exceed "
                f"{SOCKET_PATH_MAX - 1} bytes. Use a shorter --workdir.")  # fmt: skip
            return 2
        return _Walkthrough(options, work, out, stack).run()


class _Walkthrough:
    def __init__(self, options: DemoOptions, work: Path, out: Print, stack: ExitStack) -> None:
        self.o = options
        self.work = work
        self.out = out
        self.stack = stack
        self.nodes: dict[str, RealGpuNode] = {}
        self.failures: list[str] = []
        self._pods: dict[str, list[dict[str, Any]]] = {}
        self.prepared: dict[str, str] = {}  # claim UID -> first pod that prepared it
        self.summary: list[tuple[str, str, str, str]] = []  # pod, node, devices, outcome

    def step(self, n: int, text: str) -> None:
        self.out("")
        self.out(f"[{n}/6] {text}")

    def run(self) -> int:
        out = self.out
        for line in INTRO:
            out(line)
        out(f"Work directory (logs, CDI specs): {self.work}")

        self.step(1, "Starting a local control plane: etcd, kube-apiserver, kube-scheduler, "
                     "kube-controller-manager")  # fmt: skip
        binaries = find_binaries()
        cluster = Cluster(binaries, self.work / "cluster")
        self.stack.callback(cluster.stop)
        times = cluster.start()
        out(f"  ready in {times.total:.1f} s at {cluster.server}")

        self.step(2, "Installing the driver's cluster objects, rendered from the Helm chart "
                     "(deploy/manifests)")  # fmt: skip
        for applied in install_driver_objects(
            cluster, self.o.repo / "deploy/manifests/dra-driver.yaml"
        ):
            out(f"  {applied}")
        cluster.create_namespace(NAMESPACE)

        self.step(3, "Starting two real nodes: a kubelet and a containerd each, in their own "
                     "network namespace and cgroup root;")  # fmt: skip
        out("      on each, our kubelet plugin runs as the Helm chart's DaemonSet pod (helm "
            "template deploy/chart), from an image")  # fmt: skip
        out("      assembled here from the Dockerfile's contents; the real kubelet's plugin "
            "watcher registers it.")  # fmt: skip
        node_binaries = find_node_binaries()
        helm = find_helm(self.o.repo)
        archive, ref = build_image(self.o.repo, image_cache())
        out(f"  plugin image {ref} ({archive.stat().st_size / 2**20:.0f} MiB OCI archive, "
            "no registry)")  # fmt: skip
        for i, (name, profile) in enumerate(NODES):
            real = RealNode(cluster, node_binaries, self.work / f"n{i}",
                            RealNodeOptions(name=name))  # fmt: skip
            self.stack.callback(real.stop)
            real.start()
            real.import_image(NodeImage(archive, ref))
            out(f"  node {name}: kubelet v1.37.1 + containerd 2.4.2 Ready in "
                f"{real.ready_seconds:.1f} s")  # fmt: skip
            node = RealGpuNodePod(image=ref, cluster=cluster, node=real, profile=profile,
                                  workdir=real.paths.workdir / "gpu", helm=helm,
                                  chart_dir=self.o.repo / "deploy" / "chart")  # fmt: skip
            self.stack.callback(node.stop)
            node.start()
            (plugin_pod,) = node.plugin_pods()
            out(f"  node {name}: DaemonSet pod {node.namespace}/{plugin_pod['metadata']['name']} "
                "Ready (its /readyz probe passed)")  # fmt: skip
            self.nodes[name] = node
            self._describe_node(node)

        self.step(4, f"Applying the examples from deploy/examples/ to namespace {NAMESPACE!r}; "
                     "the scheduler allocates devices from the ResourceSlices")  # fmt: skip
        out("  (each pod prints what it got, then sleeps, so its claim stays prepared until "
            "step 6 deletes it)")  # fmt: skip
        pods: list[tuple[str, str]] = []
        for file, what in EXAMPLES:
            objs = keep_running(
                load_examples(self.o.repo / "deploy" / "examples" / file, NAMESPACE)
            )
            cluster.apply([o for o in objs if o["kind"] != "Pod"])
            pods += [(file, o["metadata"]["name"]) for o in objs if o["kind"] == "Pod"]
            self._pods[file] = [o for o in objs if o["kind"] == "Pod"]
            out(f"  {file}: {what}")

        self.step(5, "The kubelets run every pod: our plugin prepares its claims, containerd "
                     "starts its container with the CDI devices")  # fmt: skip
        for file, _what in EXAMPLES:
            for obj in self._pods[file]:
                cluster.apply(obj)  # one at a time: a shared claim is prepared once
                self._run_pod(cluster, file, obj["metadata"]["name"])

        self.step(
            6, "Deleting the pods: the kubelet unprepares each claim once its last pod is gone"
        )
        for _file, pod in pods:
            self._delete_pod(cluster, pod)
        leftovers = {n: list(node.cdi_specs()) for n, node in self.nodes.items()}
        if any(leftovers.values()):
            self.failures.append(f"CDI specs left after all pods were deleted: {leftovers}")
        else:
            out("  All CDI specs are gone; allocated devices are free again.")

        out("")
        out("Summary")
        widths = [max(len(row[i]) for row in [*self.summary, SUMMARY_HEAD]) for i in range(3)]
        for row in [SUMMARY_HEAD, *self.summary]:
            out("  " + "  ".join(c.ljust(w) for c, w in zip(row, [*widths, 0], strict=True)))
        out("")
        if self.failures:
            out("Demo finished with unexpected results:")
            for f in self.failures:
                out(f"  - {f}")
            return 1
        out("Demo finished: every claim was allocated, prepared, used and released as described.")
        out("Next: README.md (how it works), deploy/chart (install on a real cluster), "
            "tests/e2e (these steps as tests).")  # fmt: skip
        out(f"Logs: {self.work}/n0, n1 (one per node): logs/ (kubelet, containerd), "
            "pod-logs/ (every container, the plugin's too).")  # fmt: skip
        return 0

    # -- pieces -------------------------------------------------------------------

    def _describe_node(self, node: RealGpuNode) -> None:
        devices = [d for s in node.slices() for d in s["spec"].get("devices") or []]
        kinds: dict[str, list[str]] = {}
        for d in devices:
            attrs = d.get("attributes", {})
            kind = attrs.get("type", {}).get("string", "?")
            label = d["name"]
            if kind == "mig":
                label += f" ({attrs['profile']['string']})"
            kinds.setdefault(kind, []).append(label)
        product = next(
            (d["attributes"]["productName"]["string"] for d in devices
             if "productName" in d.get("attributes", {})), "?",
        )  # fmt: skip
        self.out(f"  node {node.name} (emulated {node.profile}, {product}): registered, "
                 f"{len(devices)} devices published in ResourceSlices")  # fmt: skip
        for kind, names in kinds.items():
            self.out(f"    {kind:4} {', '.join(names)}")

    def _node_of(self, cluster: Cluster, pod: str) -> RealGpuNode:
        def bound() -> str | None:
            obj = cluster.rest.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}")
            name: str | None = obj["spec"].get("nodeName")
            return name

        return self.nodes[wait_until(bound, timeout=60, what=f"pod {pod} scheduled")]

    def _run_pod(self, cluster: Cluster, file: str, pod: str) -> None:
        out = self.out
        out("")
        out(f"  pod {pod} ({file})")
        node = self._node_of(cluster, pod)
        out(f"    scheduled to {node.name}")
        if file == "invalid-config.yaml":
            self._refused(cluster, node, pod)
            return
        try:
            run = node.run_pod(NAMESPACE, pod)
        except TimeoutError as err:
            out(f"    the pod did not run: {err}")
            self.failures.append(f"{pod}: did not run: {err}")
            self.summary.append((pod, node.name, "-", "FAILED to run"))
            return
        obj = node.pod(NAMESPACE, pod)
        devices: list[str] = []
        generated = {s["name"]: s.get("resourceClaimName")
                     for s in obj["status"].get("resourceClaimStatuses") or []}  # fmt: skip
        for entry in obj["spec"].get("resourceClaims") or []:
            claim_name = entry.get("resourceClaimName") or generated.get(entry["name"])
            claim = cluster.rest.get(
                f"{RESOURCE_API}/namespaces/{NAMESPACE}/resourceclaims/{claim_name}"
            )
            uid = claim["metadata"]["uid"]
            results = claim["status"]["allocation"]["devices"]["results"]
            devices += [r["device"] for r in results]
            first = self.prepared.setdefault(uid, pod)
            if first == pod:
                self._describe_claim(cluster, node, claim)
            else:
                out(f"    claim {claim['metadata']['name']} was already prepared for pod {first}: "
                    "the kubelet reuses it without calling our plugin again")  # fmt: skip
            ids = [f"k8s.{r['driver']}/claim={uid}-{r['device']}" for r in results]
            out(f"    the kubelet hands containerd the CDI devices: {', '.join(ids)}")
        for cstatus in obj["status"].get("containerStatuses") or []:
            for entry in cstatus.get("allocatedResourcesStatus") or []:
                states = sorted({r.get("health", "?") for r in entry.get("resources") or []})
                out(f"    device health the kubelet reports for {entry['name']}: "
                    f"{', '.join(states)} (from our plugin's health stream)")  # fmt: skip
        for container, result in run.containers.items():
            failed = result.returncode not in (None, 0)
            status = f"FAILED (exit {result.returncode})" if failed else "ran"
            out(f"    container {container!r} {status} under containerd + runc; it printed "
                "(from its CRI log file):")  # fmt: skip
            for line in result.stdout.splitlines():
                out(f"      | {line}")
            if failed:
                self.failures.append(f"{pod}: container {container} exited {result.returncode}")
        out(f"    from creating the pod to its output: {run.seconds_to_running:.1f} s")
        failed = any(r.returncode for r in run.containers.values())
        outcome = "container FAILED" if failed else "container ran"
        self.summary.append((pod, node.name, ", ".join(sorted(devices)), outcome))

    def _refused(self, cluster: Cluster, node: RealGpuNode, pod: str) -> None:
        out = self.out
        try:
            (event,) = wait_until(
                lambda: node.events(NAMESPACE, pod, "FailedPrepareDynamicResources")[:1],
                timeout=60, what=f"the kubelet to refuse pod {pod}",
            )  # fmt: skip
        except TimeoutError as err:
            self.failures.append(f"{pod}: prepared although its config is invalid ({err})")
            self.summary.append((pod, node.name, "-", "UNEXPECTED"))
            return
        out("    the kubelet could not prepare its claim, so the pod does not start:")
        out(f"    event on the pod: {event['type']} {event['reason']}: {event['message']}")
        self.summary.append((pod, node.name, "-", "not started: prepare refused"))

    def _describe_claim(self, cluster: Cluster, node: RealGpuNode, obj: dict[str, Any]) -> None:
        out = self.out
        claim = {
            "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"],
            "devices": obj["status"]["allocation"]["devices"]["results"],
        }
        users = len(obj["status"].get("reservedFor") or [])
        out(f"    claim {claim['name']} (used by {users} pod{'s' if users != 1 else ''}) got:")
        attrs = {d["name"]: d.get("attributes", {}) for s in node.slices()
                 for d in s["spec"].get("devices") or []}  # fmt: skip
        for dev in claim["devices"]:
            a = attrs.get(dev["device"], {})
            facts = [a.get("productName", {}).get("string", ""),
                     f"profile {a['profile']['string']}" if "profile" in a else "",
                     f"NUMA node {a['numaNode']['int']}" if "numaNode" in a else "",
                     a.get("uuid", {}).get("string", "")]  # fmt: skip
            out(f"      {dev['device']}: {', '.join(f for f in facts if f)}")
        uid = claim["uid"]
        for command in gpu_commands(node, claim, attrs):
            out(f"    sharing set up by our plugin: {command}")
        specs = {n: s for n, s in node.cdi_specs().items() if uid in n}
        for name, spec in specs.items():
            out(f"    CDI spec written by our plugin: {node.cdi_dir / name}")
            if self.o.cdi_json:
                for line in json.dumps(spec, indent=2).splitlines():
                    out(f"      {line}")
            else:
                for line in spec_summary(spec):
                    out(line)

    def _event(self, cluster: Cluster, pod: str) -> dict[str, Any] | None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for ev in cluster.rest.get(f"/api/v1/namespaces/{NAMESPACE}/events")["items"]:
                if ev["involvedObject"].get("name") == pod and ev["type"] == "Warning":
                    found: dict[str, Any] = ev
                    return found
            time.sleep(0.2)
        return None

    def _delete_pod(self, cluster: Cluster, pod: str) -> None:
        obj = cluster.rest.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}")
        node = self.nodes[obj["spec"]["nodeName"]]
        before = set(node.cdi_specs())
        node.delete_pod(NAMESPACE, pod)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not before - set(node.cdi_specs()):
            time.sleep(0.2)  # the kubelet unprepares just before the pod object goes
        removed = before - set(node.cdi_specs())
        if removed:
            self.out(f"  pod {pod} deleted: claim unprepared, removed {', '.join(sorted(removed))}")
        else:
            self.out(f"  pod {pod} deleted: nothing to unprepare on {node.name} "
                     "(claim still used by another pod, or never prepared)")  # fmt: skip
