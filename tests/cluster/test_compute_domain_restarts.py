"""A ComputeDomain controller killed between any two of its writes, while it sets a
domain up or tears one down, is replaced by a fresh one that converges: everything the
domain needs exists, or nothing of it is left, and no write of the new one is refused
with 409. The controller runs in this process under the shipped RBAC's ServiceAccount;
"killed" is its API client refusing to send the n-th write, which ends the controller
as a crash of its worker does (the Deployment would start a new process).

Also: labels of a domain that is gone are removed from nodes; another domain's stay.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from dra_driver.computedomain import names
from dra_driver.computedomain.controller import objects
from dra_driver.computedomain.controller.controller import Controller, ControllerSettings
from dra_driver.computedomain.controller.events import EventRecorder
from dra_driver.computedomain.controller.kubeapi import ControllerApi, Obj
from dra_driver.devcluster import Cluster
from dra_driver.plugin import kubeauth
from tests.cluster.computedomains import (
    CD_API,
    RESOURCE_API,
    controller_rbac,
    domain,
    force_delete_terminating,
    get_or_none,
    install_crds,
    play_kubelet,
    wait_for,
)
from tests.plugin.clusterkit import unique

CLIQUE = "5b4f6e2a-0000-4000-8000-000000000001.7"


class Killed(BaseException):
    """The controller's process ends here (not an error it could handle)."""


class DyingApi(ControllerApi):
    """Sends ``die_at - 1`` writes, then dies at the next."""

    def __init__(self, *args: Any, die_at: int = 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._die_at = die_at

    def write(self, method: str, path: str, body: Any = None, **kw: Any) -> Obj:
        if self._die_at and self.counts.writes + 1 >= self._die_at:
            raise Killed(f"killed before write {self._die_at}: {method} {path}")
        return super().write(method, path, body, **kw)


@pytest.fixture(scope="module")
def setup(cluster: Cluster, cluster_namespace: str) -> Iterator[tuple[str, str]]:
    """The controller's namespace and kubeconfig; after the module, a controller tears
    down every domain left in the module's namespace (a later module's controller would
    otherwise find them)."""
    install_crds(cluster)
    namespace, account = controller_rbac(cluster)
    made = namespace, str(cluster.service_account_kubeconfig(namespace, account))
    yield made
    domains = f"{CD_API}/namespaces/{cluster_namespace}/{names.DOMAIN_PLURAL}"
    with running(made):
        cluster.rest.request("DELETE", domains)
        wait_for(lambda: not cluster.rest.get(domains)["items"], what="domains gone", timeout=90)


@contextmanager
def running(setup: tuple[str, str], die_at: int = 0, events: bool = False) -> Iterator[Controller]:
    namespace, kubeconfig = setup
    api = DyingApi(kubeauth.kubeconfig(kubeconfig), die_at=die_at)
    settings = ControllerSettings(
        daemon=objects.DaemonSettings(namespace=namespace, image="img:test"), workers=2,
        resync_s=2.0,
    )  # fmt: skip
    controller = Controller(api, settings, EventRecorder(api, "test") if events else None)
    stop = threading.Event()
    thread = threading.Thread(target=controller.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield controller
    finally:
        stop.set()
        thread.join(10)
        api.close()


def _set_up(cluster: Cluster, namespace: str, user_ns: str, name: str) -> bool:
    obj = get_or_none(cluster, f"{CD_API}/namespaces/{user_ns}/{names.DOMAIN_PLURAL}/{name}")
    if obj is None or obj.get("status", {}).get("status") != "NotReady":
        return False
    uid = obj["metadata"]["uid"]
    return (
        obj["metadata"].get("finalizers") == [names.FINALIZER]
        and get_or_none(cluster, f"{RESOURCE_API}/namespaces/{user_ns}/resourceclaimtemplates/"
                        f"{name}-ch") is not None
        and get_or_none(cluster, f"{RESOURCE_API}/namespaces/{namespace}/resourceclaimtemplates/"
                        f"{objects.daemon_template_name(uid)}") is not None
        and get_or_none(cluster, f"/apis/apps/v1/namespaces/{namespace}/daemonsets/"
                        f"{objects.daemonset_name(uid)}") is not None
    )  # fmt: skip


def _left(cluster: Cluster, uid: str) -> list[str]:
    selector = {"labelSelector": f"{names.DOMAIN_LABEL}={uid}"}
    found = []
    for path in ("/apis/apps/v1/daemonsets", f"{RESOURCE_API}/resourceclaimtemplates",
                 f"{CD_API}/{names.CLIQUE_PLURAL}", "/api/v1/nodes"):  # fmt: skip
        found += [o["metadata"]["name"] for o in cluster.rest.get(path, selector)["items"]]
    return found


@pytest.mark.parametrize("die_at", [1, 2, 3, 4, 5])
def test_killed_while_setting_a_domain_up(
    cluster: Cluster, cluster_namespace: str, setup: tuple[str, str], die_at: int
) -> None:
    namespace = setup[0]
    name = unique("up")
    with running(setup, die_at) as first:
        cluster.rest.create(f"{CD_API}/namespaces/{cluster_namespace}/{names.DOMAIN_PLURAL}",
                            domain(name, f"{name}-ch"))  # fmt: skip
        wait_for(lambda: first.failed, what="the first controller's death")
    assert first.api.counts.writes == die_at - 1
    with running(setup) as second:
        wait_for(lambda: _set_up(cluster, namespace, cluster_namespace, name),
                 what="the domain set up by the second controller")  # fmt: skip
        assert second.api.counts.conflicts == 0
        assert second.failed is None


@pytest.mark.parametrize("die_at", [1, 2, 4, 6])
def test_killed_while_tearing_a_domain_down(
    cluster: Cluster, cluster_namespace: str, setup: tuple[str, str], die_at: int
) -> None:
    """Writes of a teardown: the DaemonSet, two templates, two node labels, the finalizer."""
    namespace = setup[0]
    name = unique("down")
    path = f"{CD_API}/namespaces/{cluster_namespace}/{names.DOMAIN_PLURAL}/{name}"
    with running(setup) as before:
        cluster.rest.create(f"{CD_API}/namespaces/{cluster_namespace}/{names.DOMAIN_PLURAL}",
                            domain(name, f"{name}-ch"))  # fmt: skip
        wait_for(lambda: _set_up(cluster, namespace, cluster_namespace, name), what="set up")
        uid = cluster.rest.get(path)["metadata"]["uid"]
        for _ in range(2):  # labelled by the node side; no devices: daemon pods stay Pending
            node = cluster.create_node(unique("cd-down"))["metadata"]["name"]
            label = {"metadata": {"labels": {names.DOMAIN_LABEL: uid}}}
            cluster.rest.merge_patch(f"/api/v1/nodes/{node}", label)
        assert before.failed is None
    with running(setup, die_at) as dying:
        wait_for(lambda: dying.synced(), what="caches")
        cluster.rest.delete(path)
        wait_for(lambda: dying.failed, what="the dying controller's death")
    assert get_or_none(cluster, path) is not None  # the finalizer holds it
    with running(setup) as after:
        wait_for(lambda: get_or_none(cluster, path) is None, what="domain gone", timeout=90)
        assert _left(cluster, uid) == []
        assert after.api.counts.conflicts == 0


def test_labels_of_a_domain_that_is_gone_are_removed(
    cluster: Cluster, cluster_namespace: str, setup: tuple[str, str]
) -> None:
    """A domain whose finalizer was removed by hand left its label on a node; a node of
    a live domain keeps its label."""
    name = unique("live")
    cluster.rest.create(f"{CD_API}/namespaces/{cluster_namespace}/{names.DOMAIN_PLURAL}",
                        domain(name, f"{name}-ch"))  # fmt: skip
    live = cluster.rest.get(f"{CD_API}/namespaces/{cluster_namespace}/"
                            f"{names.DOMAIN_PLURAL}/{name}")["metadata"]["uid"]  # fmt: skip
    gone_uid = "0badc0de-0000-4000-8000-00000000000a"
    stale, kept = (cluster.create_node(unique(p))["metadata"]["name"] for p in ("stale", "kept"))
    for node, uid in ((stale, gone_uid), (kept, live)):
        cluster.rest.merge_patch(f"/api/v1/nodes/{node}",
                                 {"metadata": {"labels": {names.DOMAIN_LABEL: uid}}})  # fmt: skip
    with running(setup) as controller:

        def unlabelled() -> bool:
            labels = cluster.rest.get(f"/api/v1/nodes/{stale}")["metadata"]["labels"]
            return names.DOMAIN_LABEL not in labels

        wait_for(unlabelled, what="stale label removed")
        wait_for(lambda: _set_up(cluster, setup[0], cluster_namespace, name), what="live set up")
        labels = cluster.rest.get(f"/api/v1/nodes/{kept}")["metadata"]["labels"]
        assert labels[names.DOMAIN_LABEL] == live
        assert controller.failed is None


def test_a_template_name_already_taken_is_left_alone_and_said(
    cluster: Cluster, cluster_namespace: str, setup: tuple[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    name = unique("taken")
    theirs = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
              "metadata": {"name": f"{name}-ch", "namespace": cluster_namespace},
              "spec": {"spec": {"devices": {"requests": [
                  {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}
              ]}}}}  # fmt: skip
    path = f"{RESOURCE_API}/namespaces/{cluster_namespace}/resourceclaimtemplates"
    before = cluster.rest.create(path, theirs)
    cluster.rest.create(f"{CD_API}/namespaces/{cluster_namespace}/{names.DOMAIN_PLURAL}",
                        domain(name, f"{name}-ch"))  # fmt: skip
    uid = cluster.rest.get(f"{CD_API}/namespaces/{cluster_namespace}/"
                           f"{names.DOMAIN_PLURAL}/{name}")["metadata"]["uid"]  # fmt: skip
    with caplog.at_level("ERROR"), running(setup, events=True) as controller:
        ds = f"/apis/apps/v1/namespaces/{setup[0]}/daemonsets/{objects.daemonset_name(uid)}"
        wait_for(lambda: get_or_none(cluster, ds), what="the domain's DaemonSet")
        wait_for(lambda: [r for r in caplog.records if "is not this domain's" in r.getMessage()],
                 what="the error")  # fmt: skip
        assert controller.failed is None

        def warnings() -> list[dict[str, Any]]:
            listing = cluster.rest.get(
                f"/apis/events.k8s.io/v1/namespaces/{cluster_namespace}/events"
            )
            return [e for e in listing["items"] if e["regarding"].get("uid") == uid
                    and e["type"] == "Warning"]  # fmt: skip

        (warning,) = wait_for(warnings, what="a Warning event on the domain")
        assert warning["reason"] == "TemplateNameTaken"
        assert f"{name}-ch" in warning["note"]
    stored = cluster.rest.get(f"{path}/{name}-ch")
    assert names.DOMAIN_LABEL not in (stored["metadata"].get("labels") or {})
    assert stored["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


class DoublePostApi(ControllerApi):
    """POSTs each clique object twice, as a pass does whose cache has not caught up with
    the object an earlier pass created: the second is the API server's real 409."""

    doubled = 0

    def write(self, method: str, path: str, body: Any = None, **kw: Any) -> Obj:
        done = super().write(method, path, body, **kw)
        if method == "POST" and path.endswith(f"/{names.CLIQUE_PLURAL}"):
            self.doubled += 1
            super().write(method, path, body, **kw)
        return done


def test_a_clique_posted_again_before_the_cache_has_it_does_not_fail_the_pass(
    cluster: Cluster, cluster_namespace: str, setup: tuple[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    namespace, kubeconfig = setup
    name = unique("again")
    created = cluster.rest.create(
        f"{CD_API}/namespaces/{cluster_namespace}/{names.DOMAIN_PLURAL}",
        domain(name, f"{name}-ch"),
    )
    uid = created["metadata"]["uid"]
    # A daemon pod as the DaemonSet would make it, bound and Ready in clique 7.
    pod = cluster.rest.create(f"/api/v1/namespaces/{namespace}/pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": unique("daemon"), "labels": {names.DOMAIN_LABEL: uid}},
        "spec": {"nodeName": unique("ghost"), "containers": [{"name": "c", "image": "i"}]},
    })  # fmt: skip
    play_kubelet(cluster, pod, CLIQUE, "10.55.0.1")
    api = DoublePostApi(kubeauth.kubeconfig(kubeconfig))
    settings = ControllerSettings(
        daemon=objects.DaemonSettings(namespace=namespace, image="img:test"), resync_s=60.0
    )
    controller = Controller(api, settings)
    stop = threading.Event()
    thread = threading.Thread(target=controller.run, args=(stop,), daemon=True)
    path = f"{CD_API}/namespaces/{cluster_namespace}/{names.DOMAIN_PLURAL}/{name}"
    with caplog.at_level("WARNING"):
        thread.start()
        try:
            ready = wait_for(lambda: (d := cluster.rest.get(path)).get("status", {}).get(
                "status") == "Ready" and d, what="the domain Ready")  # fmt: skip
        finally:
            stop.set()
            thread.join(10)
            api.close()
            cluster.rest.delete(f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}")
            force_delete_terminating(cluster, namespace)
    assert api.doubled == 1  # one clique, POSTed twice: the second answered 409
    assert [n["name"] for n in ready["status"]["nodes"]] == [pod["spec"]["nodeName"]]
    failed = [r for r in caplog.records if "reconcile failed" in r.getMessage()
              and name in str(getattr(r, "key", ""))]  # fmt: skip
    assert not failed, [r.__dict__ for r in failed]
    assert controller.failed is None
