"""Tier 4: our specs through the real CDI Go library (as containerd uses it) and runc.

Needs root, Go (``scripts/build-cdi-harness.sh``), ``runc`` and ``busybox``
(Debian: ``apt-get install runc busybox-static``). Missing pieces fail the test.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from dra_driver.plugin.claims import AllocatedDevice, Claim, ClaimRef, OpaqueConfig
from tests.conftest import cdi_hook
from tests.prepare.conftest import need
from tests.prepare.emulated import GOLDEN_DIR, emulated

REPO = Path(__file__).parents[2]
pytestmark = [pytest.mark.go, pytest.mark.runc]


@pytest.mark.parametrize("golden", sorted(GOLDEN_DIR.glob("*.json")), ids=lambda p: p.stem)
def test_real_cdi_library_loads_the_golden_spec(
    harness: Path, golden: Path, tmp_path: Path
) -> None:
    # One dir per spec: the goldens share a claim UID, and equal qualified names in two
    # files of one dir make the library drop both (the reason device names carry the UID).
    shutil.copy(golden, tmp_path)
    done = subprocess.run(
        [str(harness), "-spec-dir", str(tmp_path), "-list"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    spec = json.loads(golden.read_text())
    assert done.stdout.split() == sorted(f"{spec['kind']}={d['name']}" for d in spec["devices"])


def test_real_cdi_library_rejects_a_too_low_version(harness: Path, tmp_path: Path) -> None:
    spec = json.loads((GOLDEN_DIR / "t4.json").read_text())
    spec["cdiVersion"] = "0.4.0"  # names start with a digit: needs 0.5.0
    (tmp_path / "bad.json").write_text(json.dumps(spec))
    done = subprocess.run(
        [str(harness), "-spec-dir", str(tmp_path), "-list"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0
    assert "bad.json" in done.stderr


def busybox_bundle(bundle: Path, script: str) -> Path:
    rootfs = bundle / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    shutil.copy(need("busybox"), rootfs / "bin" / "busybox")
    for applet in ("sh", "ls", "cat", "env", "stat", "test", "echo"):
        (rootfs / "bin" / applet).symlink_to("busybox")
    for d in ("dev", "proc", "sys", "tmp", "etc"):
        (rootfs / d).mkdir()
    subprocess.run([need("runc"), "spec", "--bundle", str(bundle)], check=True)
    base = json.loads((bundle / "config.json").read_text())
    base["process"]["terminal"] = False
    base["process"]["args"] = ["/bin/sh", "-c", script]
    base["root"]["readonly"] = False
    (bundle / "base.json").write_text(json.dumps(base))
    return bundle / "base.json"


INSIDE = r"""
echo "ENV:$(env | grep -E '^(NVIDIA_VISIBLE_DEVICES|CUDA_MPS_PIPE_DIRECTORY)=' \
  | sort | tr '\n' ' ')"
for n in /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools /dev/nvidia1 /dev/nvidia0 \
         /dev/nvidia-caps/nvidia-cap$GI /dev/nvidia-caps/nvidia-cap$CI; do
  echo "NODE:$n:$(stat -c '%F:%t:%T' $n 2>&1)"
done
echo "OTHER:$(ls /dev | grep -E '^nvidia[0-9]+$' | tr '\n' ' ')"
for f in /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/bin/nvidia-smi; do
  test -f $f && echo "FILE:$f"
done
test -p /tmp/nvidia-mps/control && echo "MPS:control-pipe"
echo "SHM:$(ls /dev/shm | tr '\n' ' ')"
"""


def test_container_sees_exactly_its_devices_env_and_mounts(harness: Path, tmp_path: Path) -> None:
    setup = emulated("dgx-a100-mig", tmp_path / "node")
    gpu = "gpu-1"
    mig = next(n for n in setup.device_names() if n.startswith("gpu-0-mig-1g"))
    uid = str(uuid.uuid4())
    mps = OpaqueConfig(
        source="FromClaim",
        requests=("full",),
        parameters={
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "GpuConfig",
            "sharing": {"strategy": "MPS"},
        },
    )
    claim = Claim(
        ref=ClaimRef("ns", "c", uid),
        devices=(AllocatedDevice("full", "node", gpu), AllocatedDevice("part", "node", mig)),
        configs=(mps,),
    )
    preparer = setup.preparer(cdi_hook())
    result = preparer.prepare(claim)
    ids = [i for d in result for i in d.cdi_device_ids]
    spec = json.loads(next(setup.cdi_dir.iterdir()).read_text())
    caps = [
        n
        for d in spec["devices"]
        for n in d["containerEdits"]["deviceNodes"]
        if "caps" in n["path"]
    ]
    gi, ci = (c["minor"] for c in caps)
    bundle = tmp_path / "bundle"
    base = busybox_bundle(bundle, f"GI={gi}; CI={ci}\n{INSIDE}")
    done = subprocess.run(
        [str(harness), "-spec-dir", str(setup.cdi_dir), "-base", str(base),
         "-out", str(bundle / "config.json"), *ids],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    state = tmp_path / "runc-state"
    run = subprocess.run(
        [need("runc"), "--root", str(state), "run", "--no-pivot",
         "--bundle", str(bundle), f"t-{uid[:8]}"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    try:
        assert run.returncode == 0, run.stderr
        lines = run.stdout.splitlines()
        env = next(line for line in lines if line.startswith("ENV:"))
        assert "NVIDIA_VISIBLE_DEVICES=void" in env
        assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in env
        nodes = {
            line.split(":")[1]: line.split(":", 2)[2] for line in lines if line.startswith("NODE:")
        }
        assert nodes["/dev/nvidiactl"] == "character special file:c3:ff"  # 195, 255 in hex
        assert nodes["/dev/nvidia-uvm"].startswith("character special file:")
        assert nodes["/dev/nvidia1"] == "character special file:c3:1"  # the full GPU
        assert nodes["/dev/nvidia0"] == "character special file:c3:0"  # the MIG device's parent
        assert nodes[f"/dev/nvidia-caps/nvidia-cap{gi}"] == f"character special file:1ff:{gi:x}"
        assert nodes[f"/dev/nvidia-caps/nvidia-cap{ci}"] == f"character special file:1ff:{ci:x}"
        assert "OTHER:nvidia0 nvidia1 " in lines  # no GPU of another claim
        assert "FILE:/usr/lib/x86_64-linux-gnu/libcuda.so.1" in lines
        assert "FILE:/usr/bin/nvidia-smi" in lines
        assert "MPS:control-pipe" in lines  # the claim's live MPS daemon pipe, mounted
        shm = next(line for line in lines if line.startswith("SHM:"))
        assert "nvidia-mps-emulated." in shm  # the daemon's /dev/shm is the container's
    finally:
        subprocess.run([need("runc"), "--root", str(state), "delete", "-f", f"t-{uid[:8]}"],
                       capture_output=True, check=False)  # fmt: skip
        preparer.unprepare(claim.ref)
    assert list(setup.cdi_dir.iterdir()) == []
