"""The plugin's container image, assembled here without Docker or a registry.

What the ``Dockerfile`` builds, made from the same inputs: the wheel built from
the files ``.dockerignore`` admits, installed with its runtime dependencies
(wheels from PyPI) over a Python 3.11 base, ``deploy/image/entrypoint.sh`` as
the entry point, NVIDIA's ``nvidia-cdi-hook`` (``scripts/build-cdi-hook.sh``, as the Dockerfile's
``hook`` stage runs it) at ``/usr/local/bin``, and the Dockerfile's ``ENV``,
``ENTRYPOINT`` and ``CMD``. With
no registry the base is not ``python:3.11-slim`` but Debian's own packages
(``apt-get download`` + ``dpkg -x``, the way distroless images are made): the
interpreter, its standard library, ``dash`` and ``coreutils`` for the entry
point, and their shared libraries. The result is an OCI archive that
containerd imports (:func:`build`, cached by the inputs' hash).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dra_driver.devcluster.ociimage import ImageConfig, LayerBuilder, write_archive

ROOT_PACKAGES = (
    "python3.11-minimal",
    "libpython3.11-stdlib",
    "libstdc++6",
    "dash",
    "coreutils",
    "mount",
)
"""Debian packages of the base (libstdc++ for grpcio, ``mount`` for the MPS shared-memory
tmpfs, as python:3.11-slim has them); their dependencies are added
(:func:`package_closure`)."""
EXCLUDED = frozenset(
    {"perl", "perl-base", "perl-modules-5.36", "libperl5.36", "mailcap", "mime-support",
     "dpkg", "install-info", "tar", "debconf", "init-system-helpers"}
)  # fmt: skip
"""Pulled in by maintainer scripts or MIME tooling the plugin never runs."""
SITE_PACKAGES = "usr/local/lib/python3.11/dist-packages"
"""Where Debian's python3.11 finds locally installed packages."""
NOT_COMPILED = "/(tests?|idle_test|lib2to3)/"
"""Paths compileall skips (as the Dockerfile's ``-x``): test files are never imported,
and some do not compile, which would fail the build."""
IMAGE_NAME = "localhost/dra-driver"
RUNTIME_UID = 65532


class ImageBuildError(RuntimeError):
    """A step of the image build failed; the message names it and its output."""


@dataclass(frozen=True)
class Dockerfile:
    """The runtime settings of the Dockerfile's final stage."""

    env: tuple[str, ...]
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> Dockerfile:
        final = re.split(r"^FROM .*$", text, flags=re.M)[-1]
        joined = re.sub(r"\\\n\s*", " ", final)
        env: list[str] = []
        entrypoint: list[str] = []
        cmd: list[str] = []
        for line in joined.splitlines():
            word, _, rest = line.strip().partition(" ")
            if word == "ENV":
                env += [f"{k}={v}" for k, v in re.findall(r"(\w+)=(\S+)", rest)]
            elif word == "ENTRYPOINT":
                entrypoint = json.loads(rest)
            elif word == "CMD":
                cmd = json.loads(rest)
        return cls(tuple(env), tuple(entrypoint), tuple(cmd))


def context_files(repo: Path) -> list[Path]:
    """Tracked files the ``.dockerignore`` admits into the build context (relative)."""
    rules = [
        line.strip()
        for line in (repo / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.split()
    keep = []
    for name in tracked:
        included = True
        for rule in rules:
            pattern = rule.lstrip("!").rstrip("/")
            if fnmatch.fnmatch(name, pattern) or name.startswith(pattern + "/"):
                included = rule.startswith("!")
        if included and (repo / name).is_file():
            keep.append(Path(name))
    return keep


def _run(argv: Sequence[str], what: str, cwd: Path | None = None) -> str:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ImageBuildError(f"{what} failed ({' '.join(argv[:4])} ...):\n{done.stderr[-2000:]}")
    return done.stdout


def package_closure(roots: Iterable[str], excluded: frozenset[str] = EXCLUDED) -> list[str]:
    """Debian packages ``roots`` need (Depends, Pre-Depends), minus ``excluded``."""
    wanted: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in wanted or name in excluded:
            continue
        wanted.add(name)
        argv = ["apt-cache", "depends", "--no-recommends", "--no-suggests", "--no-conflicts",
                "--no-breaks", "--no-replaces", "--no-enhances", name]  # fmt: skip
        out = _run(argv, f"apt-cache depends {name}")
        alternatives = False
        for line in out.splitlines()[1:]:
            match = re.match(r"\s*(\|)?(Pre)?Depends: (\S+)", line)
            if match is None:
                alternatives = False
                continue
            dep = match.group(3)
            if not alternatives and not dep.startswith("<"):
                todo.append(dep.split(":")[0])
            alternatives = bool(match.group(1))  # "|Depends:" means "or the next line"
    return sorted(wanted)


def input_key(repo: Path) -> str:
    digest = hashlib.sha256()
    for rel in [*context_files(repo), Path("Dockerfile"), Path("dra_driver/demo/pluginimage.py")]:
        digest.update(str(rel).encode() + b"\0" + (repo / rel).read_bytes())
    return digest.hexdigest()[:12]


def _download_debs(packages: Sequence[str], into: Path) -> None:
    argv = ["apt-get", "download", "-q", *packages]
    done = subprocess.run(argv, cwd=into, capture_output=True, text=True, check=False)
    if done.returncode != 0:  # a fresh machine has no package lists yet
        _run(["apt-get", "update", "-qq"], "apt-get update")
        _run(argv, "apt-get download", cwd=into)


def _install_python_packages(repo: Path, work: Path, rootfs: Path, python: str) -> None:
    context = work / "context"
    for rel in context_files(repo):
        (context / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / rel, context / rel)
    wheels = work / "wheels"
    _run([python, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(context)],
         "building the dra-driver wheel")  # fmt: skip
    (wheel,) = wheels.glob("dra_driver-*.whl")
    target = str(rootfs / SITE_PACKAGES)
    _run([python, "-m", "pip", "install", "-q", "--target", target,
          "--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
          "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64",
          "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_34_x86_64",
          str(wheel)], "pip install of the wheel and its dependencies")  # fmt: skip
    shutil.rmtree(rootfs / SITE_PACKAGES / "bin", ignore_errors=True)  # host-python shebangs


def assemble_rootfs(repo: Path, work: Path, python: str = sys.executable) -> Path:
    rootfs = work / "rootfs"
    debs = work / "debs"
    debs.mkdir(parents=True)
    _download_debs(package_closure(ROOT_PACKAGES), debs)
    for deb in sorted(debs.glob("*.deb")):
        _run(["dpkg-deb", "-x", str(deb), str(rootfs)], f"dpkg -x {deb.name}")
    shutil.rmtree(rootfs / "usr/share/doc", ignore_errors=True)
    shutil.rmtree(rootfs / "usr/share/man", ignore_errors=True)
    _install_python_packages(repo, work, rootfs, python)
    # What Debian's postinst (py3compile) would do: bytecode for the standard
    # library, so no container compiles it again at every start (same 3.11 magic);
    # and the optimized bytecode the Dockerfile compiles (it runs PYTHONOPTIMIZE=2).
    _run([python, "-m", "compileall", "-q", "-j", "0", str(rootfs / "usr/lib/python3.11")],
         "compiling the standard library")  # fmt: skip
    _run([python, "-OO", "-m", "compileall", "-q", "-j", "0", "-x", NOT_COMPILED,
          str(rootfs / "usr/lib/python3.11"), str(rootfs / SITE_PACKAGES)],
         "compiling optimized bytecode")  # fmt: skip
    local_bin = rootfs / "usr/local/bin"
    local_bin.mkdir(parents=True, exist_ok=True)
    hook = _run([str(repo / "scripts/build-cdi-hook.sh")], "building nvidia-cdi-hook")
    shutil.copy2(hook.strip().splitlines()[-1], local_bin / "nvidia-cdi-hook")
    shutil.copy2(repo / "deploy/image/entrypoint.sh", local_bin / "dra-driver-entrypoint")
    (local_bin / "dra-driver-entrypoint").chmod(0o755)
    script = local_bin / "dra-driver"
    script.write_text("#!/usr/bin/python3.11\nfrom dra_driver.cli import entry\n\nentry()\n")
    script.chmod(0o755)
    for link, target in (("usr/bin/python3", "python3.11"), ("bin/sh", "dash")):
        path = rootfs / link
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            path.symlink_to(target)
    etc = rootfs / "etc"
    etc.mkdir(exist_ok=True)
    (etc / "passwd").write_text(
        f"root:x:0:0:root:/root:/bin/sh\ndra:x:{RUNTIME_UID}:{RUNTIME_UID}::/:/usr/sbin/nologin\n"
    )
    (etc / "group").write_text(f"root:x:0:\ndra:x:{RUNTIME_UID}:\n")
    return rootfs


def image_cache(env: Mapping[str, str] | None = None) -> Path:
    """The cache the build scripts share (``$DRA_DRIVER_CACHE``, else ~/.cache/dra-driver)."""
    env = os.environ if env is None else env
    return Path(env.get("DRA_DRIVER_CACHE") or Path.home() / ".cache" / "dra-driver")


def build(repo: Path, cache: Path, python: str = sys.executable) -> tuple[Path, str]:
    """The image archive and its reference, built once per input hash."""
    key = input_key(repo)
    ref = f"{IMAGE_NAME}:{key}"
    out = cache / f"plugin-image-{key}" / "image.tar"
    if out.is_file():
        return out, ref
    dockerfile = Dockerfile.parse((repo / "Dockerfile").read_text())
    with tempfile.TemporaryDirectory(prefix="plugin-image-") as tmp:
        rootfs = assemble_rootfs(repo, Path(tmp), python)
        layer = LayerBuilder()
        layer.tree(rootfs)
        config = ImageConfig(
            entrypoint=dockerfile.entrypoint,
            cmd=dockerfile.cmd,
            env=(
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                *dockerfile.env,
            ),
            labels={"org.opencontainers.image.title": "dra-driver"},
        )
        write_archive(out, ref, [layer.tar()], config)
    prune(cache, keep=out.parent)
    return out, ref


def prune(cache: Path, *, keep: Path, others: int = 2) -> list[Path]:
    """Every source change builds a new image (~40 MB): keep ``keep`` and the ``others``
    most recently built before it (another tree's test run may be using one), remove the
    rest. Returns what was removed."""
    built = sorted(
        (d for d in cache.glob("plugin-image-*") if d.is_dir() and d != keep),
        key=lambda d: d.stat().st_mtime,
        reverse=True,
    )
    for old in built[others:]:
        shutil.rmtree(old, ignore_errors=True)
    return built[others:]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dra_driver.demo.pluginimage REPO CACHE``: prints ``ARCHIVE REF``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m dra_driver.demo.pluginimage REPO CACHE_DIR", file=sys.stderr)
        return 2
    try:
        archive, ref = build(Path(args[0]), Path(args[1]))
    except (ImageBuildError, OSError) as err:
        print(f"plugin image: {err}", file=sys.stderr)
        return 1
    print(archive, ref)
    return 0


if __name__ == "__main__":
    sys.exit(main())
