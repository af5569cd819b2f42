"""``dra-driver simulate`` end to end: emulated slices from ``dra-driver slices``, our classes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dra_driver.cli import main

REPO = Path(__file__).resolve().parents[2]
CLASSES = REPO / "deploy" / "deviceclasses"
H100 = "device.attributes['gpu.nvidia.com'].productName.contains('H100')"


@pytest.fixture(scope="module")
def emulated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sim")
    for node, profile in (("node-a", "dgx-h100"), ("node-b", "dgx-a100-mig")):
        slices = subprocess.run(
            [
                sys.executable,
                "-m",
                "dra_driver",
                "slices",
                "--emulate",
                profile,
                "--node-name",
                node,
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        (out / f"{node}.yaml").write_text(slices)
    claims = [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "h100"},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": "gpu.nvidia.com",
                                "selectors": [{"cel": {"expression": H100}}],
                            },
                        }
                    ]
                }
            },
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "mig-first"},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "acc",
                            "firstAvailable": [
                                {"name": "mig", "deviceClassName": "mig.nvidia.com"},
                                {"name": "gpu", "deviceClassName": "gpu.nvidia.com"},
                            ],
                        }
                    ]
                }
            },
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "too-many"},
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 9}}
                    ]
                }
            },
        },
    ]
    (out / "claims.yaml").write_text(yaml.safe_dump_all(claims))
    return out


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["simulate", *args, "-o", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_shape_per_claim(emulated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    body = run_json(capsys, "-f", str(emulated), "-f", str(CLASSES))
    claims = {c["name"]: c for c in body["claims"]}
    assert body["engine"] == "cel-expr-python" and body["nodes"] == 2
    assert claims["h100"] == {
        "name": "h100",
        "namespace": "default",
        "allocated": True,
        "node": "node-a",
        "devices": {"gpu": ["gpu-0"]},
    }
    # Only the A100 node has MIG devices; the earlier subrequest wins the node.
    assert claims["mig-first"]["node"] == "node-b"
    assert list(claims["mig-first"]["devices"]) == ["acc/mig"]
    assert claims["too-many"]["allocated"] is False and claims["too-many"]["reason"]
    assert set(claims["too-many"]) == {"name", "namespace", "allocated", "reason"}


def test_node_flag_restricts(emulated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    body = run_json(capsys, "-f", str(emulated), "-f", str(CLASSES), "--node", "node-a")
    claims = {c["name"]: c for c in body["claims"]}
    assert claims["mig-first"]["devices"] == {"acc/gpu": ["gpu-1"]}


def test_table_output_and_bad_input(
    emulated: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "-f", str(emulated), "-f", str(CLASSES)]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split() == ["CLAIM", "ALLOCATED", "NODE", "DEVICES", "/", "REASON"]
    assert "default/h100" in table
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: Secret\nmetadata: {name: x}\n")
    assert main(["simulate", "-f", str(bad)]) == 2
    assert "unsupported object kind 'Secret'" in capsys.readouterr().err
    assert main(["simulate", "-f", str(emulated), "--node", "nope"]) == 2
