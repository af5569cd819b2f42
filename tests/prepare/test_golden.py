"""Golden CDI specs per emulated profile: the full claim spec of every device on the node.

Regenerate after an intended change with ``DRA_UPDATE_GOLDEN=1 pytest tests/prepare/test_golden.py``
and review the diff. Paths are stored relative to the emulated root (so ``/dev/nvidia0``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jsonschema
import pytest

from dra_driver.gpu.cdi import spec as cdi
from dra_driver.plugin.claims import AllocatedDevice, Claim, ClaimRef
from tests.prepare.emulated import GOLDEN_DIR, GOLDEN_UID, PROFILES, emulated

SCHEMA = json.loads((GOLDEN_DIR.parent / "schema.json").read_text())


def normalised_spec(profile: str, tmp_path: Path) -> dict:
    setup = emulated(profile, tmp_path)
    names = setup.device_names()
    assert names, f"profile {profile} publishes no devices"
    c = Claim(
        ref=ClaimRef("ns", "golden", GOLDEN_UID),
        devices=tuple(AllocatedDevice(request="all", pool="node", device=n) for n in names),
    )
    result = setup.preparer().prepare(c)
    assert [d.device_name for d in result] == names
    [path] = setup.cdi_dir.iterdir()
    text = path.read_text().replace(str(setup.node.host.root), "")
    return json.loads(text)


@pytest.mark.parametrize("profile", PROFILES)
def test_golden_spec(profile: str, tmp_path: Path) -> None:
    spec = normalised_spec(profile, tmp_path)
    jsonschema.validate(spec, SCHEMA)
    golden = GOLDEN_DIR / f"{profile}.json"
    if os.environ.get("DRA_UPDATE_GOLDEN") == "1":
        golden.write_text(json.dumps(spec, indent=2) + "\n")
    assert golden.exists(), f"no golden spec {golden}; run with DRA_UPDATE_GOLDEN=1"
    assert spec == json.loads(golden.read_text())


@pytest.mark.parametrize("profile", PROFILES)
def test_golden_specs_obey_version_and_name_rules(profile: str) -> None:
    data = json.loads((GOLDEN_DIR / f"{profile}.json").read_text())
    jsonschema.validate(data, SCHEMA)
    assert data["kind"] == "k8s.gpu.nvidia.com/claim"
    assert data["cdiVersion"] == "0.5.0"  # claim UIDs may start with a digit; hostPath is set
    names = [d["name"] for d in data["devices"]]
    assert len(set(names)) == len(names)
    for name in names:
        assert name.startswith(f"{GOLDEN_UID}-")
        cdi.validate_device_name(name)
        cdi.validate_kind(data["kind"])
