"""Two ``dra-driver compute-domain-controller`` processes against one control plane, as
two replicas of the chart's Deployment under the shipped RBAC: only the Lease's holder
reconciles, the standby answers its probes as ready and writes nothing; when the
leader is killed the standby takes the Lease and converges (a new domain set up, a
deleted one torn down); a clean stop gives the Lease up. The leader's Events are on
the domain."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.computedomain import names
from dra_driver.computedomain.controller import objects
from dra_driver.computedomain.controller.events import REPORTING_CONTROLLER
from dra_driver.devcluster import Cluster
from tests.cluster.computedomains import (
    CD_API,
    controller_rbac,
    domain,
    get_or_none,
    install_crds,
    wait_for,
)
from tests.cluster.test_compute_domain_controller import ControllerProcess


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def probe(port: int, path: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


class Replica(ControllerProcess):
    def __init__(self, kubeconfig: Path, namespace: str, log: Path) -> None:
        self.port = free_port()
        self.log = log
        super().__init__(kubeconfig, namespace, log, [f"--health-port={self.port}"])

    def said(self, msg: str) -> bool:
        if not self.log.exists():
            return False
        lines = self.log.read_text().splitlines()
        return any(json.loads(line).get("msg") == msg for line in lines if line.startswith("{"))

    def writes(self) -> int | None:
        for line in self.log.read_text().splitlines():
            if line.startswith("{") and json.loads(line).get("msg") == "api writes":
                return int(json.loads(line)["writes"])
        return None


@pytest.fixture()
def replicas(cluster: Cluster, tmp_path: Path) -> Iterator[tuple[str, Replica, Replica]]:
    install_crds(cluster)
    namespace, account = controller_rbac(cluster)
    kubeconfig = cluster.service_account_kubeconfig(namespace, account)
    first = Replica(kubeconfig, namespace, tmp_path / "first.log")
    second = Replica(kubeconfig, namespace, tmp_path / "second.log")
    try:
        yield namespace, first, second
    finally:
        for replica in (first, second):
            replica.kill()
            if replica.log.exists():
                print(replica.log.read_text()[-4000:])


def _lease(cluster: Cluster, namespace: str) -> dict[str, Any]:
    path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/compute-domain-controller"
    return cluster.rest.get(path)


def _daemonset(cluster: Cluster, namespace: str, uid: str) -> dict[str, Any] | None:
    path = f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{objects.daemonset_name(uid)}"
    return get_or_none(cluster, path)


def _create(cluster: Cluster, user_ns: str, name: str) -> str:
    created = cluster.rest.create(f"{CD_API}/namespaces/{user_ns}/{names.DOMAIN_PLURAL}",
                                  domain(name, f"{name}-channel"))  # fmt: skip
    return str(created["metadata"]["uid"])


def test_one_replica_reconciles_and_the_other_takes_over(
    cluster: Cluster, cluster_namespace: str, replicas: tuple[str, Replica, Replica]
) -> None:
    namespace, first, second = replicas
    user_ns = cluster_namespace
    first.start()
    wait_for(lambda: first.said("leading"), what="the first replica leading")
    second.start()
    wait_for(lambda: second.said("waiting to lead"), what="the second replica standing by")
    holder = _lease(cluster, namespace)["spec"]["holderIdentity"]

    uid = _create(cluster, user_ns, "one")
    wait_for(lambda: _daemonset(cluster, namespace, uid), what="the leader's DaemonSet")
    wait_for(lambda: probe(first.port, "/readyz")[0] == 200, what="the leader ready")
    # The standby: alive and ready (a rolling update can proceed), and it did nothing.
    assert probe(second.port, "/healthz")[0] == 200
    code, body = probe(second.port, "/readyz")
    assert code == 200 and body["ok"] is True, body
    assert not second.said("leading") and not second.said("created")
    assert first.said("created")

    # The leader's Events are on the domain (events.k8s.io/v1, under the shipped RBAC).
    def created_events() -> list[dict[str, Any]]:
        listing = cluster.rest.get(f"/apis/events.k8s.io/v1/namespaces/{user_ns}/events")
        return [e for e in listing["items"] if e["regarding"].get("uid") == uid
                and e["reason"] == "Created"]  # fmt: skip

    events = wait_for(created_events, what="Created events on the domain")
    assert {e["reportingController"] for e in events} == {REPORTING_CONTROLLER}
    assert {e["reportingInstance"] for e in events} == {holder}
    assert any("DaemonSet" in e["note"] for e in events)

    # The leader dies without giving the Lease up: the standby takes it after the
    # lease duration (3 s) and converges: a new domain is set up, a deleted one is
    # torn down (its finalizer removed, so it goes).
    first.kill()
    cluster.rest.delete(f"{CD_API}/namespaces/{user_ns}/{names.DOMAIN_PLURAL}/one")
    uid_two = _create(cluster, user_ns, "two")
    wait_for(lambda: second.said("leading"), what="the standby leading", timeout=30)
    assert _lease(cluster, namespace)["spec"]["holderIdentity"] not in ("", None, holder)
    wait_for(lambda: _daemonset(cluster, namespace, uid_two), what="the new leader's DaemonSet")
    wait_for(lambda: get_or_none(cluster, f"{CD_API}/namespaces/{user_ns}/"
             f"{names.DOMAIN_PLURAL}/one") is None, what="domain one gone")  # fmt: skip
    assert _daemonset(cluster, namespace, uid) is None

    # A clean stop gives the Lease up at once (no holder), with exit code 0.
    assert second.stop() == 0
    assert not _lease(cluster, namespace)["spec"].get("holderIdentity")
    assert second.said("lease released")


def test_a_standby_writes_nothing(
    cluster: Cluster, cluster_namespace: str, replicas: tuple[str, Replica, Replica]
) -> None:
    """A second replica sees a domain appear and does not touch it while the first leads."""
    namespace, first, second = replicas
    first.start()
    wait_for(lambda: first.said("leading"), what="the first replica leading")
    second.start()
    wait_for(lambda: second.said("waiting to lead"), what="the second replica standing by")
    uid = _create(cluster, cluster_namespace, "standby")
    wait_for(lambda: _daemonset(cluster, namespace, uid), what="the leader's DaemonSet")
    assert second.stop() == 0
    assert second.writes() == 0
    assert _lease(cluster, namespace)["spec"]["holderIdentity"]  # still the first's
    path = f"{CD_API}/namespaces/{cluster_namespace}/{names.DOMAIN_PLURAL}/standby"
    cluster.rest.delete(path)
    wait_for(lambda: get_or_none(cluster, path) is None, what="the domain torn down")
