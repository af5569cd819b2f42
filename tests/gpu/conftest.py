"""Emulated GPU nodes for the GPU-layer tests: real pynvml, emulated C library and host tree."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pynvml
import pytest

from dra_driver.emulation import EmulatedNode
from dra_driver.gpu.hardware.discovery import discover
from dra_driver.gpu.hardware.inventory import Inventory

LOG = logging.getLogger("tests.gpu")


@pytest.fixture
def make_node(tmp_path: Path) -> Callable[[str | Path], EmulatedNode]:
    """Create an emulated node (profile name or YAML path) under a fresh directory."""
    counter = iter(range(1000))

    def make(profile: str | Path) -> EmulatedNode:
        return EmulatedNode.create(profile, tmp_path / f"node{next(counter)}")

    return make


@pytest.fixture
def discover_node() -> Callable[[EmulatedNode], Inventory]:
    """Run the real discovery with the node's emulated NVML installed."""

    def run(node: EmulatedNode) -> Inventory:
        with node.nvml():
            return discover(node.host, LOG)

    return run


@pytest.fixture(autouse=True)
def _pynvml_left_clean() -> Iterator[None]:
    """Every test must leave pynvml as it found it (no emulated library behind)."""
    yield
    assert pynvml.nvmlLib is None, "a test left a library installed in pynvml"
