"""The plugin image's content, without a Docker engine: the files the
Dockerfile's build context admits (.dockerignore) build a wheel, and that wheel
alone runs the image's entry point with its package data (emulation profiles,
generated protobuf stubs)."""

from __future__ import annotations

import fnmatch
import gzip
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

from dra_driver.demo.pluginimage import prune
from tests.conftest import cdi_hook
from tests.e2e.helm import ROOT


def context_files() -> list[Path]:
    """Files of the repo the .dockerignore lets into the build context."""
    rules = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    keep = []
    for name in tracked:
        included = True
        for rule in rules:
            negate = rule.startswith("!")
            pattern = rule.lstrip("!").rstrip("/")
            if fnmatch.fnmatch(name, pattern) or name.startswith(pattern + "/"):
                included = negate
        if included:
            keep.append(Path(name))
    return keep


def test_build_context_is_only_the_package() -> None:
    files = context_files()
    tops = {f.parts[0] for f in files}
    assert tops == {"pyproject.toml", "README.md", "dra_driver", "deploy", "cdi", "scripts"}
    assert [f for f in files if f.parts[0] == "deploy"] == [Path("deploy/image/entrypoint.sh")]
    # NVIDIA's hook: its pinned Go module and the script that builds it, nothing else.
    assert sorted(f for f in files if f.parts[0] in ("cdi", "scripts")) == [
        Path("cdi/hook/go.mod"), Path("cdi/hook/go.sum"), Path("scripts/build-cdi-hook.sh"),
    ]  # fmt: skip


def test_wheel_from_the_context_runs_the_entry_point(tmp_path: Path) -> None:
    context = tmp_path / "context"
    for name in context_files():
        (context / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, context / name)
    wheels = tmp_path / "wheels"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(context)],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = wheels.glob("dra_driver-*.whl")
    target = tmp_path / "site"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
         str(wheel)],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    # The image's ENTRYPOINT is the console script; its CMD the kubelet plugin.
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["dra-driver-entrypoint"]' in dockerfile
    assert "COPY deploy/image/entrypoint.sh /usr/local/bin/dra-driver-entrypoint" in dockerfile
    assert 'CMD ["kubelet-plugin"]' in dockerfile
    assert (target / "bin" / "dra-driver").exists()
    env = {**os.environ, "PYTHONPATH": str(target)}
    probe = subprocess.run(
        [sys.executable, "-c", "import dra_driver, sys; print(dra_driver.__file__)"],
        capture_output=True, text=True, env=env, check=True, cwd=tmp_path,
    )  # fmt: skip
    assert probe.stdout.startswith(str(target)), "the wheel, not the checkout, must be imported"
    found = subprocess.run(
        [sys.executable, "-m", "dra_driver", "discover", "--emulate", "dgx-a100", "-o", "json"],
        capture_output=True, text=True, env=env, check=False, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert found.returncode == 0, found.stderr
    assert len(json.loads(found.stdout)["gpus"]) == 8
    usage = subprocess.run(
        [sys.executable, "-m", "dra_driver", "kubelet-plugin", "--help"],
        capture_output=True, text=True, env=env, check=False, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert usage.returncode == 0, usage.stderr
    assert "--kubelet-registry-dir" in usage.stdout


def test_entrypoint_exposes_only_nvml_from_the_driver_root(tmp_path: Path) -> None:
    """The host's lib dir must not be on the search path (its libc would shadow
    the image's); only a link to libnvidia-ml.so.1 is."""
    root = tmp_path / "driver-root"
    lib = root / "usr" / "lib" / "x86_64-linux-gnu"
    lib.mkdir(parents=True)
    (lib / "libnvidia-ml.so.1").write_text("")
    (lib / "libc.so.6").write_text("")
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    fake = fake_bin / "dra-driver"
    fake.write_text(
        '#!/bin/sh\necho "ARGS=$*"\necho "LD=$LD_LIBRARY_PATH"\nls "${LD_LIBRARY_PATH%%:*}"\n'
    )
    fake.chmod(0o755)
    env = {"PATH": f"{fake_bin}:/usr/bin:/bin", "DRIVER_ROOT": str(root),
           "TMPDIR": str(tmp_path / "tmp")}  # fmt: skip
    (tmp_path / "tmp").mkdir()
    done = subprocess.run(
        [str(ROOT / "deploy" / "image" / "entrypoint.sh"), "kubelet-plugin", "--x=1"],
        capture_output=True, text=True, env=env, check=False, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "ARGS=kubelet-plugin --x=1"
    private = tmp_path / "tmp" / "dra-driver-nvml"
    assert lines[1] == f"LD={private}"
    assert lines[2:] == ["libnvidia-ml.so.1"]
    assert (private / "libnvidia-ml.so.1").resolve() == lib / "libnvidia-ml.so.1"


def test_an_image_build_prunes_all_but_the_newest_older_images(tmp_path: Path) -> None:
    made = []
    for i in range(5):
        d = tmp_path / f"plugin-image-{i:012x}"
        d.mkdir()
        (d / "image.tar").write_bytes(b"x")
        os.utime(d, (1_000_000 + i, 1_000_000 + i))
        made.append(d)
    (tmp_path / "plugin-image.lock").touch()  # the build lock: a file, never removed
    (tmp_path / "k8s-v1.37.1-0e5382e25b84").mkdir()  # other caches are not touched
    current = made[0]  # just built (its mtime does not matter)
    removed = prune(tmp_path, keep=current)
    assert sorted(removed) == [made[1], made[2]]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([made[0].name, made[3].name, made[4].name, "plugin-image.lock",
                           "k8s-v1.37.1-0e5382e25b84"])  # fmt: skip


def image_content(archive: Path) -> tuple[dict[str, Any], dict[str, tuple[int, bytes | None]]]:
    """The image's config and its files: path -> (mode, content; None for non-files)."""
    with tarfile.open(archive) as outer:
        index = json.load(outer.extractfile("index.json"))  # type: ignore[arg-type]

        def blob(digest: str) -> bytes:
            member = outer.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")
            assert member is not None
            return member.read()

        manifest = json.loads(blob(index["manifests"][0]["digest"]))
        config = json.loads(blob(manifest["config"]["digest"]))
        files: dict[str, tuple[int, bytes | None]] = {}
        for layer in manifest["layers"]:
            with tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob(layer["digest"])))) as t:
                for info in t.getmembers():
                    data = t.extractfile(info) if info.isfile() else None
                    files[info.name.lstrip("./")] = (info.mode, data.read() if data else None)
    return config, files


def test_the_image_ships_nvidia_s_cdi_hook(plugin_image: tuple[Path, str]) -> None:
    """The plugin copies it onto the host at start (``--cdi-hook-source`` finds it on
    PATH): the binary built from the toolkit's pinned Go module, executable."""
    config, files = image_content(plugin_image[0])
    mode, data = files["usr/local/bin/nvidia-cdi-hook"]
    assert mode == 0o755
    assert data == cdi_hook().read_bytes()
    assert any(e.startswith("PATH=") and "/usr/local/bin" in e for e in config["config"]["Env"])


def test_the_image_runs_optimized_bytecode_it_ships(plugin_image: tuple[Path, str]) -> None:
    """PYTHONOPTIMIZE=2 (no docstrings: 1.5 MB less resident memory) only pays when the
    ``.opt-2.pyc`` files are in the image: without them every start would compile the
    package and its libraries (hundreds of ms of start to the registration socket)."""
    config, files = image_content(plugin_image[0])
    names = set(files)
    assert "PYTHONOPTIMIZE=2" in config["config"]["Env"]
    site = "usr/local/lib/python3.11/dist-packages"
    for pyc in (f"{site}/dra_driver/__pycache__/daemon.cpython-311.opt-2.pyc",
                f"{site}/dra_driver/plugin/__pycache__/healthz.cpython-311.opt-2.pyc",
                f"{site}/grpc/__pycache__/_server.cpython-311.opt-2.pyc",
                f"{site}/__pycache__/pynvml.cpython-311.opt-2.pyc",
                "usr/lib/python3.11/__pycache__/threading.cpython-311.opt-2.pyc"):  # fmt: skip
        assert pyc in names, pyc
