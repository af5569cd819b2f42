"""The daemon path stays light: no generated kubernetes models (docs/footprint.md)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_plugin_entry_point_does_not_import_kubernetes_client_models() -> None:
    code = (
        "import sys, json, dra_driver.plugin.app, dra_driver.plugin.publishing;"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('kubernetes'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_the_http_stack_and_yaml_load_only_when_first_needed() -> None:
    """Start to registration socket: the daemon binds its sockets right after importing
    the plugin layer, so urllib3 (the API client's transport) and yaml (kubeconfig
    files only) must not be imported by it, nor by building a client."""
    code = (
        "import sys, json, dra_driver.plugin.app, dra_driver.daemon\n"
        "from dra_driver.plugin.kubeclient import KubeClient, KubeConfig\n"
        "c = KubeClient(KubeConfig(server='https://127.0.0.1:1', token='t'))\n"
        "before = sorted(m for m in sys.modules if m.split('.')[0] in ('urllib3', 'yaml'))\n"
        "c.close()\n"
        "try:\n"
        "    c.get_node('n')\n"
        "except Exception:\n"
        "    pass\n"
        "print(json.dumps([before, 'urllib3' in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [[], True]
