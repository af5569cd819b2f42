"""Full-stack fixtures. The real node: kubelet and containerd (built from Go
modules) with our plugin run from the chart (``real_a100``, :func:`real_gpu_node`).
The Go kubelet harness (the kubelet's DRA code without a runtime) with the CDI
library and runc, kept only for what the real node cannot show: one
NodePrepareResources call per pod for all its claims (``a100_node``,
test_kubelet_code) and the state a plugin killed mid share prepare/unprepare
leaves before any kubelet retry (test_shares_sigkill).
Missing pieces fail the tests; nothing is skipped."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from dra_driver.demo.chart import ChartError, find_helm
from dra_driver.demo.kubeletharness import HarnessError, find_harness
from dra_driver.demo.realgpu import RealGpuNode
from dra_driver.demo.runtime import ContainerRuntime, ContainerRuntimeError, find_cdi_harness
from dra_driver.demo.stack import GpuNode, install_driver_objects
from dra_driver.devcluster import Cluster
from dra_driver.devcluster.binaries import NodeBinaries
from tests.conftest import start_real_node
from tests.e2e.helm import CHART, MANIFESTS, ROOT


@pytest.fixture(scope="session")
def kubelet_harness_binary() -> Path:
    try:
        return find_harness(ROOT)
    except HarnessError as err:
        pytest.fail(str(err), pytrace=False)


@pytest.fixture(scope="session")
def container_runtime(tmp_path_factory: pytest.TempPathFactory) -> ContainerRuntime:
    try:
        return ContainerRuntime(
            cdi_harness=find_cdi_harness(ROOT), workdir=tmp_path_factory.mktemp("runtime")
        )
    except ContainerRuntimeError as err:
        pytest.fail(str(err), pytrace=False)


@contextmanager
def short_tmp(prefix: str) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def driver_objects(cluster: Cluster) -> list[str]:
    """RBAC, admission policy and DeviceClasses exactly as the chart renders them."""
    return install_driver_objects(cluster, MANIFESTS)


def start_node(
    cluster: Cluster,
    binary: Path,
    tmp: Path,
    profile: str,
    prefix: str = "e2e",
    plugin_args: tuple[str, ...] | list[str] = (),
) -> GpuNode:
    node = GpuNode(
        plugin_args=plugin_args,
        cluster=cluster,
        name=f"{prefix}-{profile}-{secrets.token_hex(3)}",
        profile=profile,
        workdir=tmp,
        harness_binary=binary,
        dedicated=True,
    )
    try:
        node.start()
    except BaseException:
        node.stop()
        raise
    return node


@pytest.fixture(scope="module")
def a100_node(
    cluster: Cluster,
    driver_objects: list[str],
    kubelet_harness_binary: Path,
) -> Iterator[GpuNode]:
    with short_tmp("e2e-a100") as tmp:
        node = start_node(cluster, kubelet_harness_binary, tmp, "dgx-a100")
        yield node
        node.stop()


@pytest.fixture(scope="session")
def helm_binary() -> Path:
    try:
        return find_helm(ROOT)
    except ChartError as err:
        pytest.fail(str(err), pytrace=False)


@pytest.fixture(scope="session")
def plugin_image() -> tuple[Path, str]:
    """The plugin image archive and its reference ($DRA_PLUGIN_IMAGE or
    scripts/build-plugin-image.sh: "ARCHIVE REF")."""
    line = os.environ.get("DRA_PLUGIN_IMAGE", "")
    if not line:
        done = subprocess.run([str(ROOT / "scripts" / "build-plugin-image.sh")], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True, check=False)  # fmt: skip
        if done.returncode != 0 or not done.stdout.strip():
            pytest.fail(f"scripts/build-plugin-image.sh failed ({done.returncode})", pytrace=False)
        line = done.stdout.strip().splitlines()[-1]
    archive, ref = line.split()
    return Path(archive), ref


@contextmanager
def real_gpu_node(
    cluster: Cluster,
    binaries: NodeBinaries,
    helm: Path,
    profile: str,
    values: dict[str, str] | None = None,
) -> Iterator[RealGpuNode]:
    """A real kubelet + containerd node whose GPUs our plugin serves, run from the chart."""
    node = start_real_node(cluster, binaries, prefix="rg")
    gpu = RealGpuNode(
        cluster=cluster, node=node, profile=profile, workdir=node.paths.workdir / "gpu",
        helm=helm, chart_dir=CHART, values=values,
    )  # fmt: skip
    try:
        gpu.start()
        yield gpu
    finally:
        gpu.stop()
        node.stop()
        node.remove_workdir()


@pytest.fixture(scope="module")
def real_a100(
    cluster: Cluster, driver_objects: list[str], node_binaries: NodeBinaries, helm_binary: Path
) -> Iterator[RealGpuNode]:
    with real_gpu_node(cluster, node_binaries, helm_binary, "dgx-a100") as node:
        yield node


@pytest.fixture(scope="module")
def l4_node(
    cluster: Cluster, driver_objects: list[str], node_binaries: NodeBinaries, helm_binary: Path
) -> Iterator[RealGpuNode]:
    """Four L4s on a real node, the chart's default values."""
    with real_gpu_node(cluster, node_binaries, helm_binary, "l4-x4") as node:
        yield node
