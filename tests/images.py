"""Root filesystems laid out like the images users run, for containers made from our specs.

No registry is reachable here, so the images are assembled from this (Debian)
host's own glibc, the way distroless images are made from Debian packages:

* :func:`debian_rootfs`: a Debian-family image (CUDA, NGC and PyTorch images are
  Ubuntu): merged ``/usr``, the multiarch loader, ``ldconfig``, ``ld.so.conf`` with
  its drop-in dir, an ld cache built as ``apt`` leaves one, and a busybox shell;
* :func:`distroless_rootfs`: a distroless image: glibc and the program, no shell, no
  ``ldconfig``, no ``ld.so.conf``, no ld cache;
* :func:`add_cuda_compat`: CUDA forward compatibility as NVIDIA's images ship it
  (``/usr/local/cuda/compat/libcuda.so.<newer driver>``).

Each holds ``/usr/local/bin/cudaprobe`` (``tests/data/cudaprobe.c``, built with the
host's C compiler): it ``dlopen``s ``libcuda.so.1`` and ``libcuda.so`` by name and
prints which file the loader chose and its ``cuDriverGetVersion``.
"""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
from pathlib import Path

from dra_driver.emulation.elfstub import shared_object

PROBE_SOURCE = Path(__file__).parent / "data" / "cudaprobe.c"
PROBE = "/usr/local/bin/cudaprobe"
MULTIARCH = f"{platform.machine()}-linux-gnu"
APPLETS = ("sh", "ls", "cat", "grep", "echo", "sleep", "env", "readlink", "test", "sort", "tr")


class ImageBuildError(RuntimeError):
    """A piece of a test image is missing on this host (the message says which)."""


def build_probe(out_dir: Path) -> Path:
    """``cudaprobe`` compiled for this host (C compiler: Debian's gcc, scripts/setup-host.sh)."""
    cc = shutil.which("cc")
    if cc is None:
        raise ImageBuildError("no C compiler to build cudaprobe (apt-get install gcc libc6-dev)")
    out_dir.mkdir(parents=True, exist_ok=True)
    probe = out_dir / "cudaprobe"
    done = subprocess.run(
        [cc, "-O2", "-o", str(probe), str(PROBE_SOURCE), "-ldl"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise ImageBuildError(f"building cudaprobe failed: {done.stderr}")
    return probe


def _glibc(probe: Path) -> tuple[Path, list[Path]]:
    """The loader and the libraries ``probe`` needs, as this host has them."""
    out = subprocess.run(["ldd", str(probe)], capture_output=True, text=True, check=True).stdout
    libs = [Path(p) for p in re.findall(r"=> (/\S+)", out)]
    loader = re.search(r"^\s*(/\S*ld-linux\S*)", out, re.M)
    if loader is None:
        raise ImageBuildError(f"no dynamic loader in `ldd {probe}`:\n{out}")
    return Path(loader.group(1)), libs


def _base(root: Path, probe: Path) -> None:
    """Merged-/usr skeleton, glibc at its multiarch path, the loader where programs ask
    for it (``PT_INTERP``), and the probe."""
    usr = root / "usr"
    for d in ("bin", "sbin", f"lib/{MULTIARCH}", "lib64", "local/bin"):
        (usr / d).mkdir(parents=True, exist_ok=True)
    for d in ("bin", "sbin", "lib", "lib64"):
        (root / d).symlink_to(f"usr/{d}")
    for d in ("etc", "dev", "proc", "sys", "tmp", "run"):
        (root / d).mkdir(exist_ok=True)
    loader, libs = _glibc(probe)
    libdir = usr / "lib" / MULTIARCH
    for lib in libs:
        shutil.copy(lib.resolve(), libdir / lib.name)
    shutil.copy(loader.resolve(), libdir / loader.name)
    interp = root / loader.relative_to("/")
    if not interp.exists():  # /lib64/ld-linux-x86-64.so.2 -> the multiarch copy
        interp.symlink_to(Path("../lib", MULTIARCH, loader.name))
    shutil.copy(probe, root / PROBE.lstrip("/"))


def debian_rootfs(root: Path, probe: Path) -> Path:
    """A Debian-family image whose loader searches only the multiarch dirs, ``/lib`` and
    ``/usr/lib`` (not ``/usr/lib64``), with ``ldconfig`` and an ld cache of its own."""
    _base(root, probe)
    busybox = shutil.which("busybox")
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    if busybox is None or not Path(ldconfig).is_file():
        raise ImageBuildError("busybox and ldconfig are needed (apt-get install busybox-static)")
    shutil.copy(busybox, root / "usr/bin/busybox")
    for applet in APPLETS:
        (root / "usr/bin" / applet).symlink_to("busybox")
    shutil.copy(Path(ldconfig).resolve(), root / "usr/sbin/ldconfig")
    etc = root / "etc"
    (etc / "debian_version").write_text("12.12\n")
    (etc / "os-release").write_text('ID=debian\nPRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\n')
    (etc / "ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (etc / "ld.so.conf.d").mkdir()
    (etc / "ld.so.conf.d" / f"{MULTIARCH}.conf").write_text(
        f"/usr/local/lib/{MULTIARCH}\n/lib/{MULTIARCH}\n/usr/lib/{MULTIARCH}\n"
    )
    subprocess.run([ldconfig, "-r", str(root)], check=True)  # as the image build left it
    return root


def distroless_rootfs(root: Path, probe: Path) -> Path:
    """A distroless image: glibc and the program only (no shell, ``ldconfig``,
    ``ld.so.conf`` or ld cache)."""
    _base(root, probe)
    (root / "etc" / "os-release").write_text('PRETTY_NAME="Distroless"\n')
    return root


def add_cuda_compat(root: Path, driver_version: str, cuda_version: int) -> Path:
    """CUDA forward compatibility as NVIDIA's CUDA images ship it: a ``libcuda`` of a newer
    driver (whose ``cuDriverGetVersion`` answers ``cuda_version``) in
    ``/usr/local/cuda/compat``, with its SONAME link."""
    compat = root / "usr/local/cuda/compat"
    compat.mkdir(parents=True)
    lib = compat / f"libcuda.so.{driver_version}"
    lib.write_bytes(shared_object("libcuda.so.1", {"cuDriverGetVersion": cuda_version}))
    lib.chmod(0o755)
    (compat / "libcuda.so.1").symlink_to(lib.name)
    return lib
