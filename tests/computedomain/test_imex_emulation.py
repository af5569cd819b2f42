"""The emulated IMEX host files and the emulated nvidia-imex / nvidia-imex-ctl executables."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from dra_driver.emulation import EmulatedNode, imextools, load_profile
from dra_driver.emulation.imexhost import FABRIC_IMEX_MGMT_MINOR, IMEX_CHANNELS_MAJOR


def test_host_tree_has_the_imex_channel_driver_and_fabric_capability(tmp_path: Path) -> None:
    node = EmulatedNode.create("hgx-h100-fabric", tmp_path / "root")
    devices = node.host.proc("devices").read_text()
    assert f"{IMEX_CHANNELS_MAJOR} nvidia-caps-imex-channels\n" in devices
    assert devices.index("nvidia-caps-imex-channels") < devices.index("Block devices")
    params = node.host.proc("driver", "nvidia", "params").read_text()
    assert "ImexChannelCount: 2048\n" in params
    cap = node.host.proc("driver", "nvidia", "capabilities", "fabric-imex-mgmt").read_text()
    assert f"DeviceFileMinor: {FABRIC_IMEX_MGMT_MINOR}\n" in cap
    assert node.host.dev("nvidia-caps", f"nvidia-cap{FABRIC_IMEX_MGMT_MINOR}").exists()
    assert node.host.dev("nvidia-caps-imex-channels", "channel0").exists()


def test_clique_profiles_differ_only_in_fabric_membership() -> None:
    a, b = load_profile("hgx-h100-fabric"), load_profile("hgx-h100-fabric-clique8")
    none = load_profile("hgx-h100-no-clique")
    assert {g.fabric.clique_id for g in a.gpus if g.fabric} == {7}
    assert {g.fabric.clique_id for g in b.gpus if g.fabric} == {8}
    assert {g.fabric.cluster_uuid for g in b.gpus if g.fabric} == {a.gpus[0].fabric.cluster_uuid}  # type: ignore[union-attr]
    assert all(g.fabric is not None and g.fabric.state != 3 for g in none.gpus)
    assert {g.uuid for g in a.gpus}.isdisjoint(g.uuid for g in b.gpus)


@pytest.fixture
def tools(tmp_path: Path) -> tuple[dict[str, Path], Path, Path]:
    record = tmp_path / "imex.jsonl"
    paths = imextools.install(tmp_path / "bin", record)
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "nodes.cfg").write_text("127.0.0.1\nlocalhost\n")
    config = etc / "config.cfg"
    config.write_text(f"# test\nSERVER_PORT=50000\n{imextools.NODES_KEY}={etc / 'nodes.cfg'}\n")
    return paths, record, config


def _query(paths: dict[str, Path], config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([paths[imextools.IMEX_CTL], "-q", "-c", str(config)],
                          capture_output=True, text=True, timeout=30)  # fmt: skip


def _wait(predicate, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_daemon_resolves_peers_reloads_on_sigusr1_and_answers_ready(
    tools: tuple[dict[str, Path], Path, Path],
) -> None:
    paths, record, config = tools
    assert _query(paths, config).stdout.strip() == "NOT_READY"  # nothing runs yet
    proc = subprocess.Popen([paths[imextools.IMEX], "-c", str(config)])
    try:
        state = imextools.state_file(config)
        _wait(state.exists)
        started = json.loads(state.read_text())
        assert [p["host"] for p in started["peers"]] == ["127.0.0.1", "localhost"]
        assert all(p["address"] for p in started["peers"])
        done = _query(paths, config)
        assert (done.returncode, done.stdout.strip()) == (0, "READY")

        (config.parent / "nodes.cfg").write_text("127.0.0.1\nno-such-peer.invalid\n")
        proc.send_signal(signal.SIGUSR1)
        _wait(lambda: any(e.get("event") == "reloaded" for e in imextools.read_record(record)))
        reloaded = [e for e in imextools.read_record(record) if e.get("event") == "reloaded"]
        assert [p["host"] for p in reloaded[-1]["peers"]] == ["127.0.0.1", "no-such-peer.invalid"]
        assert reloaded[-1]["peers"][1]["address"] is None
        assert _query(paths, config).returncode == 1  # an unresolved peer: not ready
    finally:
        proc.terminate()
        assert proc.wait(timeout=20) == 0
    assert imextools.read_record(record)[-1]["event"] == "terminated"
    assert not imextools.state_file(config).exists()


def test_a_daemon_stopping_after_its_successor_leaves_the_successor_s_state(
    tools: tuple[dict[str, Path], Path, Path],
) -> None:
    """A force-deleted daemon pod's nvidia-imex may stop after the new pod's started on
    the same domain directory: the new one stays READY."""
    paths, _record, config = tools
    old = subprocess.Popen([paths[imextools.IMEX], "-c", str(config)])
    new: subprocess.Popen[bytes] | None = None
    try:
        _wait(imextools.state_file(config).exists)
        new = subprocess.Popen([paths[imextools.IMEX], "-c", str(config)])
        _wait(lambda: json.loads(imextools.state_file(config).read_text())["pid"] == new.pid)
        old.terminate()
        assert old.wait(timeout=20) == 0
        assert _query(paths, config).stdout.strip() == "READY"
    finally:
        for proc in (old, new):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=20)
    assert not imextools.state_file(config).exists()  # the last one's, removed by it


def test_hold_delay_and_fail_switches(tools: tuple[dict[str, Path], Path, Path]) -> None:
    paths, record, config = tools
    Path(f"{record}.imex.fail").write_text("nvidia-imex -c\n")
    failed = subprocess.run([paths[imextools.IMEX], "-c", str(config)], capture_output=True,
                            text=True, timeout=30)  # fmt: skip
    assert failed.returncode == 1 and "injected failure" in failed.stderr
    Path(f"{record}.imex.fail").unlink()
    Path(f"{record}.imex.hold").touch()
    Path(f"{record}.imex.delay").write_text("1.5")
    proc = subprocess.Popen([paths[imextools.IMEX], "-c", str(config)])
    try:
        _wait(imextools.state_file(config).exists)
        assert _query(paths, config).stdout.strip() == "NOT_READY"
        Path(f"{record}.imex.hold").unlink()
        started = json.loads(imextools.state_file(config).read_text())["started"]
        if time.time() < started + 1.2:
            assert _query(paths, config).stdout.strip() == "NOT_READY"  # still delayed
        _wait(lambda: _query(paths, config).returncode == 0)
        assert time.time() >= started + 1.5
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
