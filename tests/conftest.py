"""Shared pytest fixtures: the real control plane for the apiserver/scheduler tiers.

The ``cluster`` fixture starts etcd, kube-apiserver, kube-scheduler and
kube-controller-manager once per session (about 4 s warm). Missing binaries
fail the requesting tests; they never skip, so a broken install cannot pass
silently. Binaries come from ``$DRA_K8S_BIN_DIR`` or ``scripts/build-k8s.sh``.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import tempfile
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from dra_driver.devcluster import BinariesError, Cluster, ComponentError, find_binaries
from dra_driver.devcluster.binaries import NodeBinaries, find_node_binaries
from dra_driver.devcluster.node import RealNode, RealNodeOptions
from dra_driver.devcluster.nodenet import POD_SUBNET

REAL_NODE_TAINT = "dra-driver.test/dedicated={name}:NoSchedule"
"""The real node takes only pods that tolerate it (``pin_to_node``), so pods of
other tests sharing the control plane never start on it."""

# Tier 5 needs a real GPU: `make test-gpu` (scripts/test-gpu) runs it on a GPU node.
collect_ignore = ["realgpu"]

CDI_HOOK_ENV = "DRA_CDI_HOOK"
REPO = Path(__file__).parents[1]


def cdi_hook() -> Path:
    """The nvidia-cdi-hook this session built (:func:`pytest_configure`)."""
    return Path(os.environ[CDI_HOOK_ENV])


def pytest_configure(config: pytest.Config) -> None:
    """NVIDIA's nvidia-cdi-hook on PATH for the whole session, as the plugin image has it:
    every plugin a test starts installs it on its node, and every container a test runs
    from our specs runs it. Built from its Go module (scripts/build-cdi-hook.sh) unless
    ``$DRA_CDI_HOOK`` names it; a failed build fails the session."""
    hook = os.environ.get(CDI_HOOK_ENV)
    if not hook:
        done = subprocess.run(
            [str(REPO / "scripts" / "build-cdi-hook.sh")],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise pytest.UsageError(f"building nvidia-cdi-hook failed:\n{done.stderr[-3000:]}")
        hook = done.stdout.strip().splitlines()[-1]
        os.environ[CDI_HOOK_ENV] = hook
    os.environ["PATH"] = f"{Path(hook).parent}{os.pathsep}{os.environ.get('PATH', '')}"


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One control plane shared by the whole session; use unique names per module."""
    try:
        binaries = find_binaries()
    except BinariesError as err:
        pytest.fail(f"control-plane binaries unavailable: {err}", pytrace=False)
    control_plane = Cluster(binaries, tmp_path_factory.mktemp("cluster"))
    try:
        control_plane.start()
    except ComponentError as err:
        pytest.fail(f"control plane failed to start: {err}", pytrace=False)
    try:
        yield control_plane
    finally:
        control_plane.stop()


@pytest.fixture(scope="session")
def node_binaries() -> NodeBinaries:
    """kubelet, containerd, CNI plugins and images (scripts/build-node.sh), and runc."""
    try:
        return find_node_binaries()
    except BinariesError as err:
        pytest.fail(f"real-node components unavailable: {err}", pytrace=False)


def start_real_node(
    cluster: Cluster, binaries: NodeBinaries, prefix: str = "rn", pod_subnet: str = POD_SUBNET
) -> RealNode:
    """A real node on ``cluster`` in a short /tmp dir (unix socket paths stay < 108 bytes)."""
    workdir = Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir="/tmp"))
    options = RealNodeOptions(taints=[REAL_NODE_TAINT], pod_subnet=pod_subnet)
    node = RealNode(cluster, binaries, workdir, options)
    try:
        node.start()
    except (ComponentError, TimeoutError) as err:
        pytest.fail(f"real node failed to start: {err}", pytrace=False)
    return node


@pytest.fixture(scope="session")
def real_node(cluster: Cluster, node_binaries: NodeBinaries) -> Iterator[RealNode]:
    """One kubelet + containerd node for the whole session (tests pin pods to it)."""
    node = start_real_node(cluster, node_binaries)
    try:
        yield node
    finally:
        node.stop()
        node.remove_workdir()


@pytest.fixture(scope="module")
def cluster_namespace(cluster: Cluster, request: pytest.FixtureRequest) -> str:
    """A fresh namespace per test module, named after the module."""
    base = re.sub(r"[^a-z0-9-]", "-", request.module.__name__.rsplit(".", 1)[-1].lower())
    name = f"{base[:40].strip('-')}-{secrets.token_hex(3)}"
    cluster.create_namespace(name)
    return name


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark tests that use the control plane, so ``-m "not cluster"`` runs the fast tiers."""
    for item in items:
        if "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Attach the components' log tails to any failed test that used the control plane."""
    report = yield
    control_plane = getattr(item, "funcargs", {}).get("cluster")
    if report.failed and isinstance(control_plane, Cluster):
        report.sections.append(("control-plane logs (tail)", control_plane.log_tails(25)))
    node = getattr(item, "funcargs", {}).get("real_node")
    if report.failed and isinstance(node, RealNode):
        report.sections.append(("real-node logs (tail)", node.log_tails(25)))
    return report


ALLOW_SKIPS_ENV = "DRA_ALLOW_SKIPS"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A skipped test fails the run (unless $DRA_ALLOW_SKIPS=1): nothing skips silently."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if skipped and exitstatus == pytest.ExitCode.OK and os.environ.get(ALLOW_SKIPS_ENV) != "1":
        reporter.write_line(
            f"{len(skipped)} test(s) skipped: failing the run "
            f"(tests must fail, not skip; set {ALLOW_SKIPS_ENV}=1 to allow locally)",
            red=True,
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
