"""``bench.compute_domain`` on the session's control plane, small: the domain gets ready,
every node's daemon is in a clique object, and no write was refused with 409."""

from __future__ import annotations

import json
from pathlib import Path

from bench.compute_domain.__main__ import parser
from bench.compute_domain.run import run
from dra_driver.devcluster import Cluster


def test_a_small_domain_gets_ready_without_conflicts(cluster: Cluster, tmp_path: Path) -> None:
    args = parser().parse_args(["--nodes=4", "--clique-size=2", "--prefix=cdb-", "--timeout=90"])
    summary = run(cluster, args, tmp_path)
    assert summary["ready"], json.dumps(summary)
    assert summary["cliques"] == 2
    assert summary["conflicts_409"] == 0 and summary["controller_conflicts"] == 0
    assert summary["controller_writes"] > 0
