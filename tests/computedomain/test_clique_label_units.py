"""The node's ``nvidia.com/gpu.clique`` rule (dra_driver.computedomain.node.cliquelabel):
set while the node has a clique, removed when it has none only if it is still the value
we set (remembered across restarts), another writer's value left alone. The real
NodeLabel's decisions run; only its two API calls are replaced by an in-memory node."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_driver.computedomain.names import GPU_CLIQUE_LABEL
from dra_driver.computedomain.node.cliquelabel import (
    RECORD_NAME,
    CliqueLabelError,
    CliqueNodeLabel,
)
from dra_driver.computedomain.node.kubeapi import NodeLabel
from dra_driver.plugin.kubeclient import KubeClient

CLIQUE = "8f3a2c61-5d0e-4b7a-9c1e-2f6d8b4a0c17.7"
OTHER = "8f3a2c61-5d0e-4b7a-9c1e-2f6d8b4a0c17.3"


class MemoryLabel(NodeLabel):
    """A NodeLabel whose node lives in a dict (``patches`` counts the writes)."""

    def __init__(self, value: str | None = None) -> None:
        super().__init__(KubeClient.__new__(KubeClient), "n1", GPU_CLIQUE_LABEL)
        self.value = value
        self.patches = 0

    def _get(self) -> tuple[str | None, str]:
        return self.value, "1"

    def _patch(self, value: str | None, resource_version: str) -> None:
        self.patches += 1
        self.value = value


def test_set_while_clique_known_removed_when_gone(tmp_path: Path) -> None:
    node = MemoryLabel()
    label = CliqueNodeLabel(node, tmp_path)
    label.sync(CLIQUE)
    assert node.value == CLIQUE
    record = tmp_path / RECORD_NAME
    assert record.read_text().strip() == CLIQUE and record.stat().st_mode & 0o777 == 0o600
    label.sync(CLIQUE)
    assert node.patches == 1  # already right: no write
    label.sync("")
    assert node.value is None and not record.exists()
    label.sync("")
    assert node.patches == 2


def test_a_restart_after_the_clique_went_away_still_removes_our_value(tmp_path: Path) -> None:
    node = MemoryLabel()
    CliqueNodeLabel(node, tmp_path).sync(CLIQUE)
    CliqueNodeLabel(node, tmp_path).sync("")  # a new process: only the record remembers
    assert node.value is None


def test_a_value_someone_else_set_stays_when_we_have_no_clique(tmp_path: Path) -> None:
    node = MemoryLabel(OTHER)  # GFD (or an admin) set it; we never did
    CliqueNodeLabel(node, tmp_path).sync("")
    assert (node.value, node.patches) == (OTHER, 0)
    node = MemoryLabel()
    label = CliqueNodeLabel(node, tmp_path / "2")
    (tmp_path / "2").mkdir()
    label.sync(CLIQUE)
    node.value = OTHER  # changed by another writer after ours
    label.sync("")
    assert node.value == OTHER


def test_a_known_clique_replaces_a_different_value(tmp_path: Path) -> None:
    node = MemoryLabel(OTHER)
    CliqueNodeLabel(node, tmp_path).sync(CLIQUE)
    assert node.value == CLIQUE


@pytest.mark.parametrize("bad", ["a b", "x" * 64, "-lead", "/etc/passwd"])
def test_a_clique_or_record_that_is_no_label_value_is_refused(tmp_path: Path, bad: str) -> None:
    node = MemoryLabel()
    with pytest.raises(CliqueLabelError, match="clique id"):
        CliqueNodeLabel(node, tmp_path).sync(bad)
    assert node.patches == 0 and not (tmp_path / RECORD_NAME).exists()
    (tmp_path / RECORD_NAME).write_text(bad)
    with pytest.raises(CliqueLabelError, match=RECORD_NAME):
        CliqueNodeLabel(node, tmp_path).sync("")
