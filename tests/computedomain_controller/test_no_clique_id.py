"""``none-<node>``, the clique of a node in no NVLink clique, is a label value on the
daemon pod and part of the clique object's name: valid for every node name (DNS
subdomains up to 253 characters), the same on the node side and the controller side,
and the same every time."""

from __future__ import annotations

import re

import pytest

from dra_driver.computedomain import names
from dra_driver.computedomain.controller.cliques import daemon_of
from dra_driver.computedomain.controller.objects import clique_name
from dra_driver.computedomain.node.cdispecs import daemon_clique
from dra_driver.computedomain.node.hostinfo import ImexHost

LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
UID = "0b5e1c2d-3f4a-4b5c-8d6e-7f8091a2b3c4"


def node_names() -> list[str]:
    """Valid node names of every length up to 253, some with a '-' or '.' just where
    the long form cuts them."""
    tail = ".".join(["d" * 62] * 5)
    shapes = ["c" * 46 + "-" + tail, "c" * 46 + "." + tail, ".".join(["b" * 63] * 4)]
    out = ["n", "node-1", "a" * 58, "a" * 59]
    for length in range(60, 254):
        out += [shape[:length].rstrip(".-") for shape in shapes]
    return [n for n in out if is_dns_subdomain(n)]


def is_dns_subdomain(name: str) -> bool:
    return len(name) <= 253 and all(DNS_LABEL.match(part) for part in name.split("."))


def test_the_names_cover_every_length() -> None:
    assert {len(n) for n in node_names()} >= set(range(60, 254))


@pytest.mark.parametrize("node", node_names())
def test_valid_as_label_value_and_in_the_clique_object_name(node: str) -> None:
    clique = names.no_clique_id(node)
    assert LABEL_VALUE.match(clique), clique
    assert is_dns_subdomain(clique_name(UID, clique)), clique
    assert names.no_clique_id(node) == clique


def test_short_names_keep_the_plain_form_and_long_ones_differ_past_the_cut() -> None:
    assert names.no_clique_id("gpu-node-7") == "none-gpu-node-7"
    assert names.no_clique_id("a" * 58) == "none-" + "a" * 58
    long_a, long_b = "x" * 100 + "a", "x" * 100 + "b"
    assert names.no_clique_id(long_a) != names.no_clique_id(long_b)
    assert len(names.no_clique_id(long_a)) == 63


def test_node_side_and_controller_agree() -> None:
    node = "rack-42-" + "h" * 200 + ".cluster.example.com"
    host = ImexHost(clique_id="", channels_major=509)
    on_node = daemon_clique(host, node)
    pod = {"metadata": {"labels": {names.CLIQUE_LABEL: ""}}, "spec": {"nodeName": node},
           "status": {}}  # fmt: skip
    from_controller = daemon_of(pod)
    assert from_controller is not None
    assert on_node == from_controller.clique_id == names.no_clique_id(node)
