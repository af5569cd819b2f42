"""Fixtures for claim preparation tests (helpers live in :mod:`tests.prepare.hosttree`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.prepare.hosttree import Node, make_node


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = make_node(tmp_path / "node")
    yield n
    for pid in n.live_daemons():  # never leave a daemon behind, even when a test failed
        os.kill(pid, 9)
