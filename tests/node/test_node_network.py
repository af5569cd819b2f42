"""A real node's pod range (``RealNodeOptions.pod_subnet``): the CNI config hands out
addresses from it, its first address is the bridge's and the node IP, and a range that
cannot work is refused by name before anything starts. Two nodes whose pods must tell
each other apart by IP (a ComputeDomain's daemons) run with different ranges
(tests/e2e/test_compute_domain_two_nodes.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_driver.devcluster.nodeconfig import NodePaths, cni_config
from dra_driver.devcluster.nodenet import POD_SUBNET, NodeNetwork, NodeNetworkError, gateway


def _ranges(config: dict[str, object]) -> object:
    (plugin,) = config["plugins"]  # type: ignore[misc]
    return plugin["ipam"]["ranges"]


def test_the_default_range_is_unchanged(tmp_path: Path) -> None:
    assert POD_SUBNET == "10.88.0.0/24"
    assert _ranges(cni_config(NodePaths(tmp_path), "n")) == [[{"subnet": "10.88.0.0/24"}]]
    assert NodeNetwork(tmp_path).gateway == "10.88.0.1"


def test_a_node_s_own_range_reaches_cni_and_the_node_ip(tmp_path: Path) -> None:
    config = cni_config(NodePaths(tmp_path), "n", "10.88.2.0/24")
    assert _ranges(config) == [[{"subnet": "10.88.2.0/24"}]]
    network = NodeNetwork(tmp_path, "10.88.2.0/24")
    assert (network.subnet, network.gateway) == ("10.88.2.0/24", "10.88.2.1")
    assert gateway("172.20.16.0/20") == "172.20.16.1"


@pytest.mark.parametrize(
    ("subnet", "says"),
    [
        ("10.88.1.0/33", "not an IPv4 network"),
        ("fd00::/64", "not an IPv4 network"),
        ("10.88.1.7/24", "not an IPv4 network"),  # host bits set
        ("10.88.1.0/30", "must be /8 to /29"),
        ("10.0.0.0/16", "holds the Service IP 10.0.0.1"),
    ],
)
def test_a_range_that_cannot_work_is_refused_by_name(
    tmp_path: Path, subnet: str, says: str
) -> None:
    with pytest.raises(NodeNetworkError, match=r"^pod_subnet: ") as err:
        NodeNetwork(tmp_path, subnet)
    assert says in str(err.value)
