"""Fixtures for claim preparation tests (helpers live in :mod:`tests.prepare.hosttree`)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.prepare.hosttree import STATE_PREFIX, Node, make_node


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = make_node(tmp_path / "node")
    yield n
    for pid in n.live_daemons():  # never leave a daemon behind, even when a test failed
        os.kill(pid, 9)


@pytest.fixture(autouse=True)
def _short_state_dirs() -> Iterator[None]:
    """Remove the /tmp dirs of :func:`state_dir_for` a test made, with any tmpfs left
    mounted in them by a failed test."""
    before = set(Path("/tmp").glob(f"{STATE_PREFIX}*"))
    yield
    for made in set(Path("/tmp").glob(f"{STATE_PREFIX}*")) - before:
        mountinfo = Path("/proc/self/mountinfo").read_text().splitlines()
        for point in (line.split()[4] for line in mountinfo):
            if point.startswith(f"{made}/"):
                subprocess.run(["umount", "--lazy", point], check=False)
        shutil.rmtree(made, ignore_errors=True)


REPO = Path(__file__).parents[2]


def need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.fail(f"{tool} not installed (apt-get install runc busybox-static)", pytrace=False)
    return path


@pytest.fixture(scope="session")
def harness() -> Path:
    """The CDI harness: the real CDI Go library, as containerd drives it."""
    done = subprocess.run(
        [str(REPO / "scripts" / "build-cdi-harness.sh")],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"building the CDI harness failed:\n{done.stderr}", pytrace=False)
    return Path(done.stdout.strip())
