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
