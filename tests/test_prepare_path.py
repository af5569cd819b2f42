"""The path of one prepare stays short: few of our modules, few returns to one already
passed (issue 29). Measured by :mod:`bench.prepare_trace`: the shipped
``kubelet-plugin`` command on an emulated node, one v1 ``NodePrepareResources`` for
one exclusive GPU, every call into a ``dra_driver`` module recorded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[1]
UID = "0a0b0c0d-1111-4222-8333-000000000029"

MAX_MODULES = 13
MAX_REENTRIES = 38
"""Both one hop up from 12 and 36 (stop 42): ``plugin.k8snames``, the Kubernetes name
rules a claim's UID, namespace and name are checked by, is one module shared with
slices, settings and both kubelet plugins instead of four private copies; the checks
cost the path that module and two returns to ``plugin.claims``."""


def test_one_exclusive_gpu_prepare_passes_through_few_modules() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.prepare_trace", "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["error"] == ""
    assert report["cdi_device_ids"] == [[f"k8s.gpu.nvidia.com/claim={UID}-gpu-0"]]
    described = "\n".join(report["modules"]) + "\n" + json.dumps(report["reentered"], indent=1)
    assert report["module_count"] <= MAX_MODULES, described
    assert report["reentries"] <= MAX_REENTRIES, described
