"""Running the Helm CLI built from tests/go/helm, for the chart tests."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from dra_driver.demo.realgpupod import RealGpuNodePod
from dra_driver.devcluster import Cluster
from dra_driver.devcluster.binaries import NodeBinaries
from dra_driver.devcluster.node import NodeImage
from dra_driver.devcluster.nodenet import POD_SUBNET
from tests.conftest import start_real_node

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "chart"
MANIFESTS = ROOT / "deploy" / "manifests" / "dra-driver.yaml"


def build_helm() -> Path:
    """The helm binary (built once and cached by scripts/build-helm.sh)."""
    result = subprocess.run(
        [str(ROOT / "scripts" / "build-helm.sh")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0 or not result.stdout.strip():
        raise RuntimeError(f"scripts/build-helm.sh failed ({result.returncode}):\n{result.stderr}")
    return Path(result.stdout.strip().splitlines()[-1])


def run_helm(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm), *args], cwd=ROOT, capture_output=True, text=True, check=False, timeout=120
    )


def render(helm: Path, *set_args: str, namespace: str = "dra-driver") -> list[dict[str, Any]]:
    """``helm template dra-driver deploy/chart --include-crds`` as a list of objects."""
    result = run_helm(
        helm, "template", "dra-driver", str(CHART), "--namespace", namespace, "--include-crds",
        *set_args,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def plugin_container(containers: list[dict[str, Any]]) -> dict[str, Any]:
    """The GPU plugin's container of the DaemonSet's pod (the compute-domain plugin's runs
    beside it)."""
    (container,) = [c for c in containers if c["name"] == "plugin"]
    return container


def strip_labels(obj: dict[str, Any]) -> dict[str, Any]:
    """The object without the labels/annotations Helm adds, for comparisons."""
    copy = {**obj, "metadata": dict(obj["metadata"])}
    copy["metadata"].pop("labels", None)
    copy["metadata"].pop("annotations", None)
    return copy


def by_kind_name(objs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


@contextmanager
def chart_pod_node(
    cluster: Cluster,
    binaries: NodeBinaries,
    helm: Path,
    image: tuple[Path, str],
    profile: str | Path,
    values: dict[str, str] | None = None,
    *,
    prefix: str = "mp",
    namespace: str | None = None,
    pod_subnet: str = POD_SUBNET,
) -> Iterator[RealGpuNodePod]:
    """A real node (node names start with ``prefix``, pods in ``pod_subnet``) whose plugin
    is the chart's DaemonSet pod from the locally built ``image`` (``mpsDaemons``: the
    chart's default), on the emulated ``profile`` (a file: copied under the emulated host
    root); its release in ``namespace`` (default: a namespace of its own)."""
    archive, ref = image
    real = start_real_node(cluster, binaries, prefix=prefix, pod_subnet=pod_subnet)
    try:
        real.import_image(NodeImage(archive, ref))
        workdir = real.paths.workdir / "gpu"
        if isinstance(profile, Path):  # the plugin pod sees files under the emulated root
            (workdir / "host").mkdir(parents=True)
            profile = str(shutil.copy(profile, workdir / "host" / profile.name))
        gpu = RealGpuNodePod(image=ref, cluster=cluster, node=real, profile=profile,
                             workdir=workdir, helm=helm, chart_dir=CHART,
                             namespace=namespace)  # fmt: skip
        gpu.values.update(values or {})
        assert "mpsDaemons" not in gpu.values  # the chart's default: pod
        try:
            gpu.start()
            yield gpu
        finally:
            gpu.stop()
    finally:
        real.stop()
        real.remove_workdir()
