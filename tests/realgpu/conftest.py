"""Fixtures of the real-GPU tier (``make test-gpu``): the host's driver, NVIDIA's tools,
discovery through the real NVML, and a preparer that leaves nothing behind."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from dra_driver.gpu.hardware.discovery import discover
from dra_driver.gpu.hardware.inventory import Inventory
from dra_driver.gpu.host.hostpaths import HostPaths, find_driver_root
from dra_driver.gpu.preparing import ClaimPreparer
from dra_driver.gpu.sharing.tools import GpuTools
from tests.realgpu.realhost import tool

log = logging.getLogger("test.realgpu")


@pytest.fixture(scope="module")
def host() -> HostPaths:
    env_root = os.environ.get("DRA_DRIVER_ROOT")
    root = Path(env_root) if env_root else find_driver_root(HostPaths())
    assert root is not None, "no NVIDIA driver root found (set DRA_DRIVER_ROOT)"
    return HostPaths(root=Path("/"), driver_root=root)


@pytest.fixture(scope="module")
def tools(host: HostPaths) -> GpuTools:
    return GpuTools.for_host(host)


@pytest.fixture(scope="module")
def inventory(host: HostPaths) -> Inventory:
    return discover(host, log)


@pytest.fixture
def state_dir() -> Iterator[Path]:
    # Short, like /var/lib/kubelet/plugins/gpu.nvidia.com: the MPS daemon's sockets
    # live under it (pytest's tmp_path is too deep for a unix socket path).
    state = Path(tempfile.mkdtemp(prefix="st-", dir="/tmp"))
    yield state
    shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="module")
def cdi_hook() -> Path:
    """NVIDIA's nvidia-cdi-hook the specs name (carried in $DRA_GPU_TOOLS, built here by
    scripts/build-cdi-hook.sh): the runtime runs it for every container from a spec."""
    return Path(tool("nvidia-cdi-hook"))


@contextmanager
def real_preparer(
    host: HostPaths, tools: GpuTools, cdi_dir: Path, state_dir: Path, cdi_hook: Path,
    **options: Any,
) -> Iterator[ClaimPreparer]:  # fmt: skip
    """A preparer on the real driver that unprepares whatever is left when done
    (``options``: more :class:`ClaimPreparer` arguments, e.g. ``mps_slots``)."""
    p = ClaimPreparer(
        driver_name="gpu.nvidia.com",
        inventory=lambda: discover(host, log),
        host=host,
        cdi_dir=cdi_dir,
        state_dir=state_dir,
        logger=log,
        tools=tools,
        cdi_hook=cdi_hook,
        **options,
    )
    try:
        yield p
    finally:
        for ref in p.prepared_claims():  # never leave a policy or daemon behind
            p.unprepare(ref)


@pytest.fixture
def preparer(
    host: HostPaths, tools: GpuTools, tmp_path: Path, state_dir: Path, cdi_hook: Path
) -> Iterator[ClaimPreparer]:
    with real_preparer(host, tools, tmp_path / "cdi", state_dir, cdi_hook) as p:
        yield p
