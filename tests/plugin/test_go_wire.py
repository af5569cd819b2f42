"""Wire compatibility: the official k8s.io/kubelet Go clients talk to our sockets.

tests/go/wire registers and calls the plugin exactly as the kubelet does
(GetInfo with a 1 s deadline, version negotiation over the plugin's list,
NotifyRegistrationStatus, prepare/unprepare with a 45 s deadline, health
stream). A proto field or package mismatch shows up here as Unimplemented or
as a missing field.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.plugin.conftest import RunningPlugin, StartPlugin
from tests.plugin.fakes import DRIVER, claim_object

pytestmark = pytest.mark.go

ROOT = Path(__file__).resolve().parents[2]
UID_OK = "77777777-0000-4000-8000-000000000001"
UID_BAD = "77777777-0000-4000-8000-000000000002"
SHARE = "88888888-0000-4000-8000-000000000001"


@pytest.fixture(scope="module")
def wire_harness() -> Path:
    proc = subprocess.run(
        [str(ROOT / "scripts" / "build-wire-harness.sh")], capture_output=True, text=True
    )
    if proc.returncode != 0:
        pytest.fail(f"building the wire harness failed:\n{proc.stderr[-3000:]}", pytrace=False)
    return Path(proc.stdout.strip().splitlines()[-1])


def _run(harness: Path, run: RunningPlugin, *extra: str) -> dict[str, Any]:
    run.api.add_claim(
        claim_object(
            "ok",
            UID_OK,
            results=[
                {
                    "request": "gpu/fast",
                    "driver": DRIVER,
                    "pool": "node-a",
                    "device": "gpu-1",
                    "shareID": SHARE,
                }
            ],
        )
    )
    proc = subprocess.run(
        [
            str(harness),
            f"-registry-dir={run.settings.registry_dir}",
            f"-claims=default/ok/{UID_OK},default/missing/{UID_BAD}",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def test_kubelet_wire_v1_registration_prepare_unprepare_health(
    wire_harness: Path, start_plugin: StartPlugin
) -> None:
    run = start_plugin()
    out = _run(wire_harness, run)
    assert out["type"] == "DRAPlugin" and out["name"] == DRIVER
    assert out["endpoint"] == str(run.plugin.paths.dra)
    assert out["get_info_ms"] < 1000
    assert out["chosen_version"] == "v1.DRAPlugin"
    assert out["health_version"] == "v1.DRAResourceHealth"
    assert run.plugin.readiness().registered  # the harness's NotifyRegistrationStatus arrived
    ok = out["prepare"][UID_OK]
    assert ok["error"] == ""
    assert ok["devices"] == [
        {
            "request_names": ["gpu"],
            "pool": "node-a",
            "device": "gpu-1",
            "cdi_device_ids": [f"{DRIVER}/gpu={UID_OK}-gpu-1"],
            "share_id": SHARE,
        }
    ]
    assert "not found" in out["prepare"][UID_BAD]["error"]
    assert out["unprepare"] == {UID_OK: "", UID_BAD: ""}
    assert [(h["device"], h["health"]) for h in out["health"]] == [
        ("gpu-0", "HEALTHY"),
        ("gpu-1", "HEALTHY"),
    ]


def test_kubelet_wire_v1beta1_and_health_v1alpha1(
    wire_harness: Path, start_plugin: StartPlugin
) -> None:
    run = start_plugin()
    out = _run(
        wire_harness,
        run,
        "-version=v1beta1.DRAPlugin",
        "-health-version=v1alpha1.DRAResourceHealth",
    )
    assert out["chosen_version"] == "v1beta1.DRAPlugin"
    assert out["health_version"] == "v1alpha1.DRAResourceHealth"
    assert [(h["device"], h["health"]) for h in out["health"]] == [
        ("gpu-0", "HEALTHY"),
        ("gpu-1", "HEALTHY"),
    ]
    assert all(h["timeout_s"] >= 30 for h in out["health"])
    ok = out["prepare"][UID_OK]
    assert ok["error"] == "" and ok["devices"][0]["device"] == "gpu-1"
    assert "share_id" not in ok["devices"][0]
    assert out["unprepare"][UID_OK] == ""
