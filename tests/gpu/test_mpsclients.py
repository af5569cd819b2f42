"""The emulated MPS daemon's limits as clients meet them
(:mod:`dra_driver.emulation.mpsclients`): inherited defaults, tightened by a client,
never loosened; allocations within a client's limit."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dra_driver.emulation.mpsclients import Daemon

UUID = "GPU-11111111-2222-3333-4444-555555555555"


def answer(pipe: Path, cid: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in (pipe / "clients" / cid).read_text().splitlines())


@pytest.mark.parametrize(
    ("defaults", "asked", "memory", "percent"),
    [
        ([], "- -", "unlimited", "100"),
        ([f"set_default_device_pinned_mem_limit {UUID} 2G"], "- -", "2048", "100"),
        (["set_default_device_pinned_mem_limit 0 512M"], "0=1G 50", "512", "50"),
        (["set_default_active_thread_percentage 25"], "0=1G 100", "1024", "25"),
        (
            [
                "set_default_active_thread_percentage 25",
                f"set_default_device_pinned_mem_limit {UUID} 2048M",
            ],
            "40G 10",  # one value for every device
            "2048",
            "10",
        ),
        (["set_default_device_pinned_mem_limit 0 2G"], "1=100M,0=1G 7", "1024", "7"),
    ],
    ids=["nothing", "default-by-uuid", "default-by-ordinal", "percent", "one-value", "per-device"],
)
def test_a_client_gets_the_smaller_of_default_and_request(
    tmp_path: Path, defaults: list[str], asked: str, memory: str, percent: str
) -> None:
    daemon = Daemon(tmp_path, f"{UUID},GPU-other")
    for line in defaults:
        daemon.handle(line)
    daemon.handle(f"client c1 {asked}")
    got = answer(tmp_path, "c1")
    assert (got["memory_limit_mib"], got["active_thread_percentage"]) == (memory, percent)
    assert got["daemon"] == str(os.getpid()) and got["last"] == "connected"


def test_allocations_stop_at_the_limit_and_clients_are_apart(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path, UUID)
    daemon.handle(f"set_default_device_pinned_mem_limit {UUID} 100M")
    daemon.handle("client a - -")
    daemon.handle("client b - -")
    daemon.handle("alloc a 60")
    daemon.handle("alloc a 41")
    assert answer(tmp_path, "a")["allocated_mib"] == "60"
    assert answer(tmp_path, "a")["last"] == "out of memory: 41 MiB more than the 40 MiB left"
    daemon.handle("alloc b 100")
    assert answer(tmp_path, "b")["last"] == "allocated 100"
    daemon.handle("exit a")
    assert not (tmp_path / "clients" / "a").exists()
    daemon.handle("alloc a 1")  # gone: ignored
    daemon.handle("client ../x - -")  # not an id: ignored, nothing written outside
    assert sorted(p.name for p in (tmp_path / "clients").iterdir()) == ["b"]
