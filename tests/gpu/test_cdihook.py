"""Putting NVIDIA's nvidia-cdi-hook on the host, and a node that cannot run it.

The source is the real binary this session built from the toolkit's Go module
(``tests.conftest.cdi_hook``); "cannot run" cases use small executables that fail
the way a broken install does.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from pathlib import Path

import pytest

from dra_driver.emulation import EmulatedNode
from dra_driver.gpu.cdi import hooks as cdihook
from dra_driver.plugin.claims import AllocatedDevice, Claim, ClaimRef
from tests.conftest import cdi_hook
from tests.gpu.test_devices_driver import gpu_driver

LOG = logging.getLogger("tests.gpu.cdihook")


def script(path: Path, body: str) -> Path:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def test_installs_nvidia_s_hook_executable_by_root_only_writable(tmp_path: Path) -> None:
    target = tmp_path / "plugins" / "gpu.nvidia.com" / "nvidia-cdi-hook"
    assert cdihook.install(cdi_hook(), target) == ""
    assert target.read_bytes() == cdi_hook().read_bytes()
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    assert [p.name for p in target.parent.iterdir()] == ["nvidia-cdi-hook"]  # no temp left


def test_an_identical_hook_is_left_in_place_and_a_different_one_replaced(tmp_path: Path) -> None:
    target = tmp_path / "nvidia-cdi-hook"
    assert cdihook.install(cdi_hook(), target) == ""
    inode = target.stat().st_ino
    assert cdihook.install(cdi_hook(), target) == ""
    assert target.stat().st_ino == inode  # a runtime may be running it: not rewritten
    target.write_bytes(b"an old release")
    assert cdihook.install(cdi_hook(), target) == ""
    assert target.stat().st_ino != inode  # replaced by rename, never written in place
    assert target.read_bytes() == cdi_hook().read_bytes()


def test_a_bare_source_name_is_found_on_path(tmp_path: Path) -> None:
    # tests/conftest.py put the built hook's dir on PATH, as the image has /usr/local/bin.
    assert cdihook.install(Path("nvidia-cdi-hook"), tmp_path / "hook") == ""
    assert (tmp_path / "hook").read_bytes() == cdi_hook().read_bytes()


def test_what_each_broken_install_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "dir" / "nvidia-cdi-hook"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert cdihook.install(Path("nvidia-cdi-hook"), target) == (
        f"no nvidia-cdi-hook on PATH to install at {target}: set --cdi-hook-source, or "
        "--cdi-hook-source=none with NVIDIA's own hook installed at --cdi-hook-path"
    )
    assert cdihook.install(tmp_path / "missing", target) == (
        f"cannot install the CDI hook {target}: No such file or directory ({tmp_path / 'missing'})"
    )
    assert cdihook.install(None, target) == (
        f"cannot check the CDI hook {target}: No such file or directory ({target})"
    )
    broken = script(
        tmp_path / "broken", "echo 'libc.so.6: version GLIBC_2.34 not found' >&2\nexit 1"
    )
    assert cdihook.install(broken, target) == (
        f"CDI hook {target} --version exited 1: libc.so.6: version GLIBC_2.34 not found "
        "(expected 'NVIDIA CDI Hook version')"
    )
    other = script(tmp_path / "other", "echo something else")
    assert cdihook.install(other, target).endswith(
        "--version exited 0: something else (expected 'NVIDIA CDI Hook version')"
    )
    assert cdihook.install(cdi_hook(), Path("relative/hook")) == (
        "CDI hook path relative/hook is not absolute"
    )


def test_a_hook_others_could_replace_is_refused(tmp_path: Path) -> None:
    """It runs as root on the host for every container: a dir anyone may write to is a
    way to root."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    target = shared / "nvidia-cdi-hook"
    assert cdihook.install(cdi_hook(), target) == (
        f"CDI hook {target}: {shared} is writable by others (mode 777)"
    )


def test_a_node_that_cannot_run_the_hook_prepares_nothing_until_fixed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node = EmulatedNode.create("t4", tmp_path / "host")
    source = tmp_path / "source" / "nvidia-cdi-hook"
    source.parent.mkdir()
    target = tmp_path / "plugins" / "nvidia-cdi-hook"
    with node.nvml(), caplog.at_level(logging.ERROR, logger=LOG.name):
        driver = gpu_driver(
            node,
            tmp_path,
            logger=LOG,
            health_policy=None,
            cdi_hook=cdihook.HookPlacement(path=target, local=target, source=source),
        )
        why = f"cannot install the CDI hook {target}: No such file or directory ({source})"
        assert driver.problems() == [why]
        assert [r.getMessage() for r in caplog.records] == [
            f"this node prepares no claims until the CDI hook is fixed: {why}"
        ]
        claim = Claim(ref=ClaimRef("ns", "c", "0b1c2d3e-4f50-4617-8a9b-0c1d2e3f4a5b"),
                      devices=(AllocatedDevice("gpu", "node-a", "gpu-0"),))  # fmt: skip
        with pytest.raises(cdihook.HookError, match=re.escape(f"prepare claim ns/c: {why}")):
            driver.prepare(claim)
        assert not (tmp_path / "cdi").exists() or not list((tmp_path / "cdi").iterdir())

        driver.refresh()  # still broken: said once, not again
        assert len(caplog.records) == 1
        os.link(cdi_hook(), source)
        driver.refresh()  # the next re-discovery (or SIGHUP) installs it
        assert driver.problems() == []
        assert len(driver.prepare(claim)) == 1
        spec = next((tmp_path / "cdi").iterdir()).read_text()
        assert f'"path":"{target}"' in spec.replace(" ", "")
        driver.unprepare(claim.ref)
        driver.close()
