"""The controller's list+watch cache on the real kube-apiserver: everything listed is
handed over before the cache says it is synced (the controller's map of live domains
relies on it), later changes arrive as watch events, deletions too, and a resync hands
everything over again."""

from __future__ import annotations

import threading
import time

from dra_driver.computedomain.controller.informers import Informer
from dra_driver.computedomain.controller.kubeapi import ControllerApi, Obj, Resource
from dra_driver.devcluster import Cluster
from dra_driver.plugin import kubeauth
from tests.cluster.computedomains import wait_for

CONFIGMAPS = Resource("/api/v1", "configmaps", True)


def test_listed_watched_deleted_and_resynced(cluster: Cluster, cluster_namespace: str) -> None:
    path = f"/api/v1/namespaces/{cluster_namespace}/configmaps"
    for i in range(10):
        cluster.rest.create(path, {"metadata": {"name": f"cm-{i}", "labels": {"pick": "yes"}}})
    cluster.rest.create(path, {"metadata": {"name": "other"}})
    seen: list[tuple[str, bool]] = []
    lock = threading.Lock()

    def on_change(obj: Obj) -> None:
        time.sleep(0.02)  # a slow consumer: sync must still wait for every hand-over
        with lock:
            seen.append((obj["metadata"]["name"], bool(obj["metadata"].get("deletionTimestamp"))))

    api = ControllerApi(kubeauth.kubeconfig(str(cluster.kubeconfig)))
    informer = Informer(api, CONFIGMAPS, namespace=cluster_namespace, label_selector="pick",
                        on_change=on_change, resync_s=2.0)  # fmt: skip
    informer.start()
    try:
        assert informer.synced.wait(30)
        with lock:
            assert sorted(n for n, _ in seen) == [f"cm-{i}" for i in range(10)]
        cluster.rest.create(path, {"metadata": {"name": "cm-new", "labels": {"pick": "yes"}}})
        wait_for(lambda: informer.get((cluster_namespace, "cm-new")), what="watched create")
        cluster.rest.delete(f"{path}/cm-0")
        wait_for(lambda: informer.get((cluster_namespace, "cm-0")) is None, what="watched delete")
        with lock:
            before = len(seen)
        wait_for(lambda: len(seen) >= before + 10, what="a resync of everything")
        assert {n for n, _ in seen} == {f"cm-{i}" for i in range(10)} | {"cm-new"}
        assert informer.get((cluster_namespace, "other")) is None
    finally:
        informer.stop()
        api.close()
