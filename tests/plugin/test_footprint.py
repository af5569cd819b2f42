"""The daemon path stays light: no generated kubernetes models (docs/footprint.md), nothing
but what the kubelet sockets need before they are up."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def test_plugin_entry_point_does_not_import_kubernetes_client_models() -> None:
    code = (
        "import sys, json, dra_driver.plugin.app, dra_driver.plugin.publishing;"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('kubernetes'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_the_daemon_binds_its_sockets_before_the_gpu_layer_and_the_api_library(
    tmp_path: Path,
) -> None:
    """Start to registration socket: parsing the flags and binding the sockets pull in
    none of the GPU layer (its devices, shares, inventory and health modules cost
    ~50 ms), only the two small modules the flags turn into (``--consumable-gpus``, the
    health policy), and neither the ``kubernetes`` library (~0.6 s of imports) nor
    prometheus-client (~30 ms), which are loaded by the time the plugin has started (its
    API client connected, its metrics counting)."""
    work = Path(tempfile.mkdtemp(prefix="fp-", dir="/tmp"))  # short: socket paths
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
            }
        )
    )
    argv = ["kubelet-plugin", "--emulate=l4-x4", f"--host-root={work / 'host'}",
            f"--cdi-dir={work / 'cdi'}", f"--state-dir={work / 'state'}",
            f"--kubelet-registry-dir={work / 'reg'}", f"--kubelet-plugins-dir={work / 'plugins'}",
            "--health-port=0"]  # fmt: skip
    # The daemon's own start path; serve() and start() are wrapped to look right after
    # they returned, then the daemon is stopped (as SIGTERM would, through its exit stack).
    code = (
        "import json, sys\n"
        "from dra_driver.plugin.app import KubeletPlugin\n"
        "serve, start = KubeletPlugin.serve, KubeletPlugin.start\n"
        "seen = []\n"
        "def loaded(prefixes, allowed=()):\n"
        "    return sorted(m for m in sys.modules if m.startswith(prefixes) and m not in allowed)\n"
        "def look_serve(self):\n"
        "    serve(self)\n"
        "    if seen:  # start() serves too (a no-op then)\n"
        "        return\n"
        "    flag_types = ('dra_driver.gpu.hardware', 'dra_driver.gpu.hardware.consumable',\n"
        "                  'dra_driver.gpu.monitoring', 'dra_driver.gpu.monitoring.healthpolicy')\n"
        "    seen.append([self.paths.registration.exists(),\n"
        "                 loaded(('dra_driver.gpu.',), flag_types),\n"
        "                 loaded(('kubernetes', 'urllib3', 'prometheus_client'))])\n"
        "def look_start(self):\n"
        "    start(self)\n"
        "    assert self.metrics is not None\n"
        "    seen.append([m in sys.modules for m in ('kubernetes.client', 'prometheus_client')])\n"
        "    print(json.dumps(seen))\n"
        "    raise SystemExit(0)\n"
        "KubeletPlugin.serve, KubeletPlugin.start = look_serve, look_start\n"
        "from dra_driver.cli import main\n"
        f"main({argv!r})\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRA_")}
    env |= {"DRA_NODE_NAME": "node-a", "DRA_KUBECONFIG": str(kubeconfig)}
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [[True, [], []], [True, True]]
