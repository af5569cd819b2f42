"""This node's :data:`~dra_driver.computedomain.names.GPU_CLIQUE_LABEL`: NVIDIA's
ComputeDomain examples pick nodes by it (node affinity, topology key), and without
NVIDIA's GPU Feature Discovery nothing else sets it.

The rule, so the plugin never fights another writer over a value it did not set:

* the node has a clique: the label is set to it (GFD, if it runs too, derives the same
  ``<clusterUUID>.<cliqueId>`` from the same NVML fabric info, so both agree);
* the node has none: the label is removed only if it still holds the value this plugin
  set last (recorded in the plugin's state dir before the write, so a restart after the
  clique went away still cleans up); a value anyone else set stays.

The chart's ``computeDomains.plugin.cliqueNodeLabel: false`` (for clusters where GFD
owns the label) turns the whole thing off, and the admission policy then refuses it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from dra_driver.computedomain.node.kubeapi import NodeLabel
from dra_driver.errors import DriverError
from dra_driver.gpu.host.files import write_atomic
from dra_driver.plugin.k8snames import is_label_value

logger = logging.getLogger(__name__)

RECORD_NAME = "clique-label"
"""File in the plugin's state dir: the clique value this plugin last set on its node."""


class CliqueLabelError(DriverError):
    """A clique id that is no valid label value, or a record that is not one."""


def _check(value: str, where: str) -> str:
    if not is_label_value(value):
        raise CliqueLabelError(f"{where}: {value!r} is not a valid label value")
    return value


class CliqueNodeLabel:
    """Keeps the node's clique label in step with its clique (see the module rule)."""

    def __init__(self, label: NodeLabel, state_dir: Path) -> None:
        self._label = label
        self._record = state_dir / RECORD_NAME

    def _recorded(self) -> str | None:
        try:
            text = self._record.read_text().strip()
        except FileNotFoundError:
            return None
        return _check(text, str(self._record)) or None

    def sync(self, clique_id: str) -> None:
        """Set the label to ``clique_id``; "" (no clique): remove the value we set."""
        if clique_id:
            _check(clique_id, "clique id")
            # first: a crash after the patch still knows it
            write_atomic(self._record, f"{clique_id}\n".encode(), mode=0o600)
            self._label.claim(clique_id, set())
            logger.info("node clique label set", extra={"clique": clique_id})
            return
        ours = self._recorded()
        if ours is None:
            return
        self._label.release(ours)
        self._record.unlink(missing_ok=True)
        logger.info("node clique label removed (no clique)", extra={"clique": ours})
