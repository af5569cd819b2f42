"""Stock images run unchanged: a container made from our spec finds libcuda as it would
with NVIDIA's container toolkit, whatever the image's and the host's layout.

Real pieces: our spec from an emulated node whose driver libraries are real ELF
shared objects with the driver's sonames; the real CDI Go library (as containerd
uses it) and runc; NVIDIA's own ``nvidia-cdi-hook`` (built from its Go module)
running the spec's hooks with the host's real ``ldconfig``; image root filesystems
laid out like the images users run (:mod:`tests.images`). Inside, ``cudaprobe``
loads ``libcuda.so.1`` and ``libcuda.so`` by name through the image's own loader.

Three layouts, as the issue asks: (a) a Debian-family image on a Debian-layout host;
(b) a host whose driver libraries live under ``/usr/lib64`` (RHEL family) with a
Debian image whose loader never searches there; (c) a distroless image (no ld cache,
no ``ldconfig``). Then, one hook at a time removed from the spec, what breaks.
``disable-device-node-modification`` only acts where the host has
``/proc/driver/nvidia/params`` (a real driver): here it runs and must not fail.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from dra_driver.demo.runtime import ContainerRun, ContainerRuntime
from dra_driver.plugin.claims import AllocatedDevice, Claim, ClaimRef
from tests.conftest import cdi_hook
from tests.images import (
    MULTIARCH,
    PROBE,
    add_cuda_compat,
    build_probe,
    debian_rootfs,
    distroless_rootfs,
)
from tests.prepare.emulated import PROFILES_DIR, emulated

pytestmark = [pytest.mark.go, pytest.mark.runc]

UID = "7e1a0c5e-4d2b-4c1e-9f3a-5b6c7d8e9f00"
HOST_CUDA = 13000  # t4.yaml: driver 580.95.05, CUDA 13.0
LIB_DIR = {"debian": f"/usr/lib/{MULTIARCH}", "rhel": "/usr/lib64"}
Image = Callable[[Path, Path], Path]


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_probe(tmp_path_factory.mktemp("probe"))


@pytest.fixture
def runtime(harness: Path, tmp_path: Path) -> ContainerRuntime:
    return ContainerRuntime(cdi_harness=harness, workdir=tmp_path / "runtime")


def prepared(tmp_path: Path, layout: str) -> tuple[Path, list[str], dict[str, object]]:
    """A T4 node with the driver laid out as ``layout``, one GPU claim prepared:
    (CDI dir, CDI IDs, the spec)."""
    profile = tmp_path / f"t4-{layout}.yaml"
    profile.write_text((PROFILES_DIR / "t4.yaml").read_text() + f"driverLayout: {layout}\n")
    setup = emulated(profile, tmp_path / "node")
    claim = Claim(ref=ClaimRef("ns", "c", UID), devices=(AllocatedDevice("gpu", "node", "gpu-0"),))
    result = setup.preparer(cdi_hook()).prepare(claim)
    (spec_file,) = setup.cdi_dir.iterdir()
    return (
        setup.cdi_dir,
        [i for d in result for i in d.cdi_device_ids],
        json.loads(spec_file.read_text()),
    )


def run(runtime: ContainerRuntime, cdi_dir: Path, ids: list[str], rootfs: Path) -> ContainerRun:
    done = runtime.run(cdi_dirs=[cdi_dir], cdi_ids=ids, argv=[PROBE], rootfs=rootfs)
    assert done.oci_spec, f"the CDI library refused the spec: {done.stderr}"
    return done


def canonical(rootfs: Path, path: str) -> str:
    """``path`` in the container with its directory's links resolved (merged ``/usr``:
    ``/lib/x86_64-linux-gnu`` is ``/usr/lib/x86_64-linux-gnu``)."""
    where = Path(path)
    resolved = (rootfs / where.parent.relative_to("/")).resolve()
    return str(Path("/", resolved.relative_to(rootfs.resolve()), where.name))


def loaded(rootfs: Path, stdout: str) -> dict[str, tuple[str, int]]:
    """``{name: (path the loader chose, cuDriverGetVersion)}`` from cudaprobe's output."""
    found = {}
    for name, path, version in re.findall(r"^DLOPEN (\S+) (\S+) (-?\d+)$", stdout, re.M):
        found[name] = (canonical(rootfs, path), int(version))
    return found


def ld_cache(rootfs: Path) -> dict[str, str]:
    """The container's ld cache, read with the host's real ``ldconfig``: soname -> path."""
    out = subprocess.run(
        ["ldconfig", "-p", "-C", str(rootfs / "etc" / "ld.so.cache")],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return {
        name: canonical(rootfs, path)
        for name, path in re.findall(r"^\s+(\S+) \(.*\) => (\S+)$", out, re.M)
    }


@pytest.mark.parametrize(
    ("image", "layout"),
    [(debian_rootfs, "debian"), (debian_rootfs, "rhel"), (distroless_rootfs, "debian"),
     (distroless_rootfs, "rhel")],
    ids=["debian-image-debian-host", "debian-image-rhel-host", "distroless-debian-host",
         "distroless-rhel-host"],
)  # fmt: skip
def test_a_stock_image_finds_libcuda_through_its_ld_cache(
    runtime: ContainerRuntime, probe: Path, tmp_path: Path, image: Image, layout: str
) -> None:
    cdi_dir, ids, spec = prepared(tmp_path, layout)
    lib = LIB_DIR[layout]
    mounts = [m["containerPath"] for m in spec["containerEdits"]["mounts"]]  # type: ignore[index]
    assert f"{lib}/libcuda.so.580.95.05" in mounts  # host path relative to the driver root
    rootfs = image(tmp_path / "rootfs", probe)

    done = run(runtime, cdi_dir, ids, rootfs)

    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert loaded(rootfs, done.stdout) == {
        "libcuda.so.1": (f"{lib}/libcuda.so.1", HOST_CUDA),
        "libcuda.so": (f"{lib}/libcuda.so", HOST_CUDA),
    }
    cache = ld_cache(rootfs)
    assert cache["libcuda.so.1"] == f"{lib}/libcuda.so.1"
    assert cache["libcuda.so"] == f"{lib}/libcuda.so"
    assert cache["libnvidia-ml.so.1"] == f"{lib}/libnvidia-ml.so.1"
    assert (rootfs / lib.lstrip("/") / "libcuda.so").readlink() == Path("libcuda.so.1")


def test_an_image_with_newer_cuda_compat_gets_its_own_libcuda(
    runtime: ContainerRuntime, probe: Path, tmp_path: Path
) -> None:
    """``enable-cuda-compat``: the image's forward-compatibility libcuda (driver 590,
    CUDA 13.1) goes before the host's older one (580, CUDA 13.0) in the ld cache."""
    cdi_dir, ids, _ = prepared(tmp_path, "debian")
    rootfs = debian_rootfs(tmp_path / "rootfs", probe)
    add_cuda_compat(rootfs, "590.44.01", 13010)

    done = run(runtime, cdi_dir, ids, rootfs)

    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert loaded(rootfs, done.stdout)["libcuda.so.1"] == (
        "/usr/local/cuda/compat/libcuda.so.1",
        13010,
    )


def without(cdi_dir: Path, hook: str) -> None:
    """Rewrite the claim's spec without the ``hook`` subcommand."""
    (path,) = cdi_dir.iterdir()
    spec = json.loads(path.read_text())
    edits = spec["containerEdits"]
    kept = [h for h in edits["hooks"] if h["args"][1] != hook]
    assert len(kept) == len(edits["hooks"]) - 1
    edits["hooks"] = kept
    path.write_text(json.dumps(spec))


def test_without_update_ldcache_a_rhel_host_s_libcuda_is_not_found(
    runtime: ContainerRuntime, probe: Path, tmp_path: Path
) -> None:
    cdi_dir, ids, _ = prepared(tmp_path, "rhel")
    without(cdi_dir, "update-ldcache")
    done = run(runtime, cdi_dir, ids, debian_rootfs(tmp_path / "rootfs", probe))
    assert done.returncode == 1
    assert "DLOPEN libcuda.so.1 FAILED" in done.stdout


def test_without_create_symlinks_libcuda_so_is_missing(
    runtime: ContainerRuntime, probe: Path, tmp_path: Path
) -> None:
    cdi_dir, ids, _ = prepared(tmp_path, "debian")
    without(cdi_dir, "create-symlinks")
    rootfs = debian_rootfs(tmp_path / "rootfs", probe)
    done = run(runtime, cdi_dir, ids, rootfs)
    assert done.returncode == 1
    assert "DLOPEN libcuda.so FAILED" in done.stdout
    assert "libcuda.so" not in ld_cache(rootfs)


def test_without_enable_cuda_compat_the_host_s_older_libcuda_is_loaded(
    runtime: ContainerRuntime, probe: Path, tmp_path: Path
) -> None:
    cdi_dir, ids, _ = prepared(tmp_path, "debian")
    without(cdi_dir, "enable-cuda-compat")
    rootfs = debian_rootfs(tmp_path / "rootfs", probe)
    add_cuda_compat(rootfs, "590.44.01", 13010)
    done = run(runtime, cdi_dir, ids, rootfs)
    assert done.returncode == 0, done.stderr
    assert loaded(rootfs, done.stdout)["libcuda.so.1"] == (
        f"{LIB_DIR['debian']}/libcuda.so.1",
        HOST_CUDA,
    )
