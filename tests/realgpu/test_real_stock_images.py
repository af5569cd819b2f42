"""Tier 5: stock GPU workloads in containers built from our spec, on a real GPU.

What users run, as they run it: PyTorch (a CUDA matmul and a ``torch.compile``d
function, whose Triton kernels need ``libcuda`` in the ld cache), JAX ``jit`` and
``nvidia-smi``, in a container whose root filesystem has no driver files of its own
(an image built elsewhere), made from our CDI spec by the CDI Go library and run by
runc, with the spec's hooks run by NVIDIA's ``nvidia-cdi-hook``. An exclusive claim
only: nothing here changes a GPU setting.

The root filesystem: an overlay of this node's own root (whose Python has PyTorch,
Triton and JAX) with the driver's files whited out in the overlay only (the driver
root, the driver's libraries and tools outside it, ld.so.conf entries naming it) and
its ld cache rebuilt; the host itself is not touched. Then the same spec without
its hooks, to show what they are for.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.gpu.hardware.inventory import Inventory
from dra_driver.gpu.host.hostpaths import LIB_DIRS, HostPaths
from dra_driver.gpu.preparing import ClaimPreparer
from tests.realgpu.realhost import real_claim, record, sh, spec_of, tool
from tests.realgpu.test_real_gpu import cdi_harness

PYTORCH = """
import json, torch
out = {"device": torch.cuda.get_device_name(0), "count": torch.cuda.device_count()}
a, b = torch.randn(1024, 1024, device="cuda"), torch.randn(1024, 1024, device="cuda")
out["matmul"] = bool(torch.allclose((a @ b).cpu(), a.cpu() @ b.cpu(), rtol=1e-2, atol=1e-2))
f = torch.compile(lambda x: torch.sin(x) * 2 + x)
x = torch.randn(1 << 16, device="cuda")
out["compile"] = bool(torch.allclose(f(x), torch.sin(x) * 2 + x, atol=1e-5))
print("RESULT " + json.dumps(out))
"""
JAX = """
import json, jax, jax.numpy as jnp
g = jax.jit(lambda v: jnp.sum(v * v))
print("RESULT " + json.dumps({"platform": jax.devices()[0].platform,
                              "sum": float(g(jnp.arange(1000.0)))}))
"""
ENV = [
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME=/tmp", "TRITON_CACHE_DIR=/tmp/triton", "XLA_PYTHON_CLIENT_PREALLOCATE=false",
]  # fmt: skip
DRIVER_FILES = re.compile(r"^(libcuda\.so|libnvidia-|libcudadebugger\.so|libnvcuvid\.so|"
                          r"libnvoptix\.so|libnvidia-ml\.so)")  # fmt: skip


def _mountpoint(path: Path) -> Path:
    while not os.path.ismount(path):
        path = path.parent
    return path


@pytest.fixture(scope="module")
def stock_rootfs(host: HostPaths) -> Iterator[Path]:
    """This node's root without its driver: an overlay whose upper layer (a tmpfs) holds
    the whiteouts and the rebuilt ld cache; unmounted after."""
    work = Path(tempfile.mkdtemp(prefix="stock-", dir="/tmp"))
    layer, merged = work / "layer", work / "rootfs"
    layer.mkdir()
    merged.mkdir()
    sh("mount", "-t", "tmpfs", "-o", "size=8g", "tmpfs", str(layer))
    try:
        (layer / "upper").mkdir()
        (layer / "work").mkdir()
        sh("mount", "-t", "overlay", "overlay", "-o",
           f"lowerdir=/,upperdir={layer}/upper,workdir={layer}/work", str(merged))  # fmt: skip
        # Python and its packages may sit on mounts of their own: bring them in (read-only).
        for where in {_mountpoint(Path(p)) for p in (sys.prefix, *sys.path) if p}:
            inside = merged / where.relative_to("/")
            if str(where) != "/" and not where.is_relative_to(host.driver_root) and inside.is_dir():
                sh("mount", "--rbind", "-o", "ro", str(where), str(inside))
        driver = host.driver_root
        if str(driver) != "/":
            shutil.rmtree(merged / driver.relative_to("/"), ignore_errors=True)
        for rel in (*LIB_DIRS, "usr/lib"):
            for entry in (merged / rel).glob("*") if (merged / rel).is_dir() else ():
                if DRIVER_FILES.match(entry.name):
                    entry.unlink()
        for name in ("nvidia-smi", "nvidia-debugdump", "nvidia-cuda-mps-control"):
            for d in ("usr/bin", "usr/local/bin", "bin"):
                (merged / d / name).unlink(missing_ok=True)
        for conf in (merged / "etc/ld.so.conf.d").glob("*.conf"):
            if (str(driver) != "/" and str(driver) in conf.read_text()) or "nvidia" in conf.name:
                conf.unlink()
        sh("ldconfig", "-r", str(merged))
        cache = sh("ldconfig", "-p", "-C", str(merged / "etc/ld.so.cache"))
        assert "libcuda" not in cache, "the stock root filesystem still has libcuda"
        yield merged
    finally:
        subprocess.run(["umount", "-R", str(merged)], check=False)
        subprocess.run(["umount", str(layer)], check=False)
        shutil.rmtree(work, ignore_errors=True)


def run_in_container(
    rootfs: Path, cdi_dir: Path, ids: list[str], args: list[str], tmp: Path, name: str
) -> tuple[int, str]:
    bundle = tmp / name
    bundle.mkdir()
    runc = tool("runc")
    sh(runc, "spec", "--bundle", str(bundle))
    base = json.loads((bundle / "config.json").read_text())
    base["process"].update(terminal=False, args=args, env=ENV)
    base["root"] = {"path": str(rootfs), "readonly": False}
    (bundle / "base.json").write_text(json.dumps(base))
    sh(cdi_harness(), "-spec-dir", str(cdi_dir), "-base", str(bundle / "base.json"),
       "-out", str(bundle / "config.json"), *ids)  # fmt: skip
    done = subprocess.run(
        [runc, "--root", str(tmp / "runc"), "run", "--bundle", str(bundle), name],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    subprocess.run([runc, "--root", str(tmp / "runc"), "delete", "-f", name], check=False)
    return done.returncode, done.stdout + done.stderr


def result(out: str) -> dict[str, object]:
    found = re.search(r"^RESULT (.*)$", out, re.M)
    assert found, out[-3000:]
    return json.loads(found.group(1))  # type: ignore[no-any-return]


def test_pytorch_compile_jax_and_nvidia_smi_run_in_a_stock_root_filesystem(
    preparer: ClaimPreparer, inventory: Inventory, stock_rootfs: Path, tmp_path: Path
) -> None:
    gpu = min(inventory.gpus, key=lambda g: g.minor)
    c = real_claim(f"gpu-{gpu.minor}")
    ids = [i for d in preparer.prepare(c) for i in d.cdi_device_ids]
    cdi = tmp_path / "cdi"
    spec = spec_of(cdi)
    (smi,) = [m["containerPath"] for m in spec["containerEdits"]["mounts"]
              if m["containerPath"].endswith("/nvidia-smi")]  # fmt: skip
    py = sys.executable

    rc, ldconfig = run_in_container(stock_rootfs, cdi, ids, ["ldconfig", "-p"], tmp_path, "ld")
    rc_t, torch_out = run_in_container(stock_rootfs, cdi, ids, [py, "-c", PYTORCH], tmp_path, "pt")
    rc_j, jax_out = run_in_container(stock_rootfs, cdi, ids, [py, "-c", JAX], tmp_path, "jax")
    rc_s, smi_out = run_in_container(
        stock_rootfs, cdi, ids, [smi, "--query-gpu=uuid,name", "--format=csv,noheader"],
        tmp_path, "smi",
    )  # fmt: skip
    record("stock rootfs: ldconfig -p | grep libcuda",
           "\n".join(line for line in ldconfig.splitlines() if "libcuda" in line))  # fmt: skip
    record("stock rootfs: PyTorch matmul + torch.compile", torch_out[-3000:])
    record("stock rootfs: JAX jit", jax_out[-3000:])
    record("stock rootfs: nvidia-smi", smi_out)
    assert rc == 0 and re.search(r"^\s+libcuda\.so\.1 \(", ldconfig, re.M), ldconfig
    assert re.search(r"^\s+libcuda\.so \(", ldconfig, re.M), ldconfig
    torch_result = result(torch_out)
    assert rc_t == 0 and torch_result["matmul"] is True and torch_result["compile"] is True
    assert torch_result["count"] == 1  # only the claim's GPU
    jax_result = result(jax_out)
    assert rc_j == 0 and jax_result == {"platform": "gpu", "sum": 332833500.0}
    assert rc_s == 0 and smi_out.strip() == f"{gpu.uuid}, {gpu.product_name}"

    # The same claim's spec without NVIDIA's hooks: what users saw before.
    (path,) = cdi.iterdir()
    bare = json.loads(path.read_text())
    bare["containerEdits"].pop("hooks")
    path.write_text(json.dumps(bare))
    rc_b, bare_out = run_in_container(stock_rootfs, cdi, ids, [py, "-c", PYTORCH], tmp_path, "bare")
    record("stock rootfs, spec without hooks: PyTorch", bare_out[-3000:])
    assert rc_b != 0, bare_out[-3000:]
    preparer.unprepare(c.ref)
