"""The daemon pods the controller's DaemonSet makes: their readiness probe is the daemon's
``check`` and gives it the time it may take (two Python starts on a busy node: with the
1 s default every probe timed out in the two-node e2e test and workloads waited)."""

from __future__ import annotations

import inspect

from dra_driver.computedomain.controller.objects import DaemonSettings, Domain, daemonset
from dra_driver.computedomain.node import imexdaemon

UID = "0b0e2a4c-1d2e-4f50-8a6b-7c8d9e0f1a2b"


def test_the_readiness_probe_outlasts_the_check_s_own_limit() -> None:
    domain = Domain("team", "job", UID, "job-channel", "Single")
    ds = daemonset(domain, DaemonSettings(namespace="dra", image="img:1"))
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    probe = container["readinessProbe"]
    assert probe["exec"]["command"] == ["dra-driver", "compute-domain-daemon", "check"]
    own_limit = inspect.signature(imexdaemon.check).parameters["timeout_s"].default
    assert probe["timeoutSeconds"] > own_limit
