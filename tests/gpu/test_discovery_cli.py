"""``dra-driver discover`` and ``dra-driver slices`` as a user runs them (real subprocesses)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from dra_driver.commands.slices import resource_slices


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dra_driver", *args],
        capture_output=True,
        text=True,
        check=check,
        timeout=60,
    )


def test_discover_prints_a_readable_table() -> None:
    out = _run("discover", "--emulate", "dgx-a100-mig").stdout
    lines = out.splitlines()
    assert lines[0] == "NVIDIA driver 580.95.05, CUDA 13.0, 8 GPU(s)"
    assert lines[1].split() == ["IDX", "MINOR", "PRODUCT", "MEMORY", "SMS", "CC", "NUMA", "PCI",
                                "PCIE", "ROOT", "LINK", "MIG", "STATUS"]  # fmt: skip
    assert lines[2].split() == ["0", "0", "NVIDIA", "A100-SXM4-80GB", "80.0Gi", "108", "8.0", "0",
                                "0000:07:00.0", "pci0000:00", "gen4x16", "on(3)", "ok"]  # fmt: skip
    assert lines[3].split()[:4] == ["MIG", "3g.40gb", "gi=1", "ci=0"]
    assert sum(line.lstrip().startswith("MIG ") for line in lines) == 12


def test_discover_json_and_yaml_carry_the_inventory(tmp_path: Path) -> None:
    data = json.loads(_run("discover", "--emulate", "l4-x4", "-o", "json").stdout)
    assert data["driver_version"] == "580.95.05" and data["cuda_driver_version"] == [13, 0]
    assert [g["minor"] for g in data["gpus"]] == [2, 3, 0, 1]
    assert data["gpus"][0]["pci"] == {
        "bus_id": "0000:38:00.0", "pcie_root": "pci0000:37", "numa_node": 0, "numa_affinity": [0],
        "pcie_generation": 4, "pcie_link_width": 16,
    }  # fmt: skip
    assert yaml.safe_load(_run("discover", "--emulate", "l4-x4", "-o", "yaml").stdout) == data


def test_slices_prints_what_the_publisher_would_send(
    make_node, discover_node, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    args = ["--emulate", "dgx-a100-mig", "--host-root", str(root), "--node-uid", "1234"]
    out = _run("slices", "--node-name", "node-a", *args).stdout
    docs = list(yaml.safe_load_all(out))
    # Same emulated node -> same inventory (UUIDs are deterministic per profile).
    expected = resource_slices(
        discover_node(make_node("dgx-a100-mig")),
        driver_name="gpu.nvidia.com",
        node_name="node-a",
        node_uid="1234",
    )
    assert docs == expected
    assert docs[0]["metadata"]["ownerReferences"][0]["uid"] == "1234"
    assert (
        root / "sys" / "bus" / "pci" / "devices" / "0000:07:00.0"
    ).is_symlink()  # tree kept where asked
    as_json = json.loads(
        _run("slices", "--node-name", "node-a", "--emulate", "t4", "-o", "json").stdout
    )
    assert as_json["kind"] == "List" and "ownerReferences" not in as_json["items"][0]["metadata"]


def test_bad_input_fails_with_a_clear_message(tmp_path: Path) -> None:
    bad = _run("discover", "--emulate", "dgx-b200", check=False)
    assert bad.returncode == 1 and "neither a built-in profile" in bad.stderr and not bad.stdout
    profile = tmp_path / "p.yaml"
    profile.write_text("name: p\ndriverVersion: '1'\ncudaDriverVersion: 1\ngpus: [{model: X}]\n")
    bad = _run("slices", "--node-name", "n", "--emulate", str(profile), check=False)
    assert bad.returncode == 1 and "gpus[0].model: 'X' unknown" in bad.stderr
    bad = _run("slices", "--node-name", "Not_A_Node", "--emulate", "t4", check=False)
    assert bad.returncode == 1 and "node name: 'Not_A_Node' must be a DNS subdomain" in bad.stderr
    # Without emulation on this GPU-less machine: a node-level error, not a traceback.
    bad = _run("discover", "--host-root", str(tmp_path), check=False)
    assert bad.returncode == 1 and "cannot initialise NVML" in bad.stderr


def test_kubelet_plugin_start_failure_is_a_clear_error(tmp_path: Path) -> None:
    short = Path(tempfile.mkdtemp(prefix="kc-", dir="/tmp"))  # socket paths < 108 bytes
    dirs = ["--cdi-dir", str(short / "cdi"), "--kubelet-registry-dir", str(short / "reg")]
    dirs += ["--kubelet-plugins-dir", str(short / "plugins"), "--host-root", str(short / "h")]
    missing = _run("kubelet-plugin", "--node-name", "n", "--emulate", "t4", *dirs,
                   "--kubeconfig", str(tmp_path / "missing"), check=False)  # fmt: skip
    assert missing.returncode == 2  # a setting: refused before anything starts
    assert "--kubeconfig (DRA_KUBECONFIG)" in missing.stderr and "no such file" in missing.stderr
    (tmp_path / "broken").write_text("{clusters: [")
    bad = _run("kubelet-plugin", "--node-name", "n", "--emulate", "t4", *dirs,
               "--kubeconfig", str(tmp_path / "broken"), check=False)  # fmt: skip
    shutil.rmtree(short, ignore_errors=True)
    assert bad.returncode == 1
    last = bad.stderr.splitlines()[-1]
    assert last.startswith("dra-driver kubelet-plugin: cannot start: cannot load the kubeconfig")
    assert str(tmp_path / "broken") in last
    assert "Traceback" not in bad.stderr


def test_slices_numa_attribute_form_and_nvlink_domains() -> None:
    def attrs(*extra: str) -> list[dict]:
        out = _run("slices", "--node-name", "n", "--emulate", "a100-pcie-nvlink", "-o", "json",
                   *extra).stdout  # fmt: skip
        return [d["attributes"] for d in json.loads(out)["items"][0]["spec"]["devices"]]

    scalar = attrs()
    assert [a["resource.kubernetes.io/numaNode"] for a in scalar] == [
        {"int": 0}, {"int": 1}, {"int": 4}, {"int": 5}
    ]  # fmt: skip
    assert [a["nvlinkDomain"]["string"] for a in scalar] == [
        "nvlink-0000:21:00.0", "nvlink-0000:21:00.0", "nvlink-0000:a1:00.0", "nvlink-0000:a1:00.0"
    ]  # fmt: skip
    listed = attrs("--numa-attribute-form", "list")
    assert listed[1]["resource.kubernetes.io/numaNode"] == {"ints": [0, 1, 2, 3]}
    assert listed[1]["numaNode"] == {"int": 1}  # our own attribute stays a scalar
    bad = _run("slices", "--node-name", "n", "--emulate", "t4", "--numa-attribute-form", "lists",
               check=False)  # fmt: skip
    assert bad.returncode == 2 and "invalid choice: 'lists'" in bad.stderr


def test_slices_in_dynamic_mig_mode(make_node, discover_node) -> None:
    out = _run("slices", "--node-name", "n", "--emulate", "h100-l4-mixed", "--mig-mode", "dynamic")
    docs = list(yaml.safe_load_all(out.stdout))
    expected = resource_slices(
        discover_node(make_node("h100-l4-mixed")),
        driver_name="gpu.nvidia.com",
        node_name="n",
        mig_mode="dynamic",
    )
    assert docs == expected
    assert [len(d["spec"].get("sharedCounters", [])) for d in docs] == [2, 0]
    assert len(docs[1]["spec"]["devices"]) == 55
    bad = _run("slices", "--node-name", "n", "--emulate", "t4", "--mig-mode", "auto", check=False)
    assert bad.returncode == 2 and "invalid choice: 'auto'" in bad.stderr
