"""NodeLocks: hold_if_free never waits and takes all or nothing (threads and processes);
hold lets go of everything it took when it fails."""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

import pytest

from dra_driver.gpu.host.files import LockTimeout, NodeLocks


def _free_in_another_thread(locks: NodeLocks, names: list[str]) -> bool:
    result: list[bool] = []

    def look() -> None:
        with locks.hold_if_free(names) as held:
            result.append(held)

    t = threading.Thread(target=look)
    t.start()
    t.join(5)
    return result[0]


def test_free_locks_are_held_for_the_block_and_released_after(tmp_path: Path) -> None:
    locks = NodeLocks(tmp_path)
    with locks.hold_if_free(["gpu-1", "gpu-0"]) as held:
        assert held
        assert not _free_in_another_thread(locks, ["gpu-0"])
        assert not _free_in_another_thread(locks, ["gpu-1"])
        assert _free_in_another_thread(locks, ["gpu-2"])
    assert _free_in_another_thread(locks, ["gpu-0", "gpu-1"])
    locks.close()


def test_one_busy_lock_means_none_is_held_and_nothing_waits(tmp_path: Path) -> None:
    locks = NodeLocks(tmp_path)
    with locks.hold(["gpu-1"], timeout_s=1):
        # gpu-0 is taken first (sorted), then gpu-1 is busy: gpu-0 must be let go.
        assert not _free_in_another_thread(locks, ["gpu-0", "gpu-1"])
        assert _free_in_another_thread(locks, ["gpu-0"])
    locks.close()


def test_a_lock_another_process_holds_is_busy(tmp_path: Path) -> None:
    """A second plugin instance holds the flock (another open file description of the
    lock file is what another process has): busy, and this process's side let go."""
    locks = NodeLocks(tmp_path)
    with locks.hold(["gpu-0"], timeout_s=1):
        pass  # creates the lock file
    other = os.open(locks.path("gpu-0"), os.O_RDWR)
    try:
        fcntl.flock(other, fcntl.LOCK_EX)
        with locks.hold_if_free(["gpu-0"]) as held:
            assert not held
        fcntl.flock(other, fcntl.LOCK_UN)
        with locks.hold_if_free(["gpu-0"]) as held:
            assert held
            # now ours: the other side cannot take it
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                raise AssertionError("the flock was not held")
            except BlockingIOError:
                pass
    finally:
        os.close(other)
        locks.close()


def test_a_hold_that_times_out_or_a_block_that_raises_leaves_nothing_held(
    tmp_path: Path,
) -> None:
    locks = NodeLocks(tmp_path)
    busy, done = threading.Event(), threading.Event()

    def holder() -> None:
        with locks.hold(["gpu-1"], timeout_s=1):
            busy.set()
            done.wait(5)

    t = threading.Thread(target=holder)
    t.start()
    assert busy.wait(5)
    # gpu-0 is taken first (sorted), then gpu-1 times out: gpu-0 must be let go.
    with pytest.raises(LockTimeout, match="gpu-1"), locks.hold(["gpu-1", "gpu-0"], timeout_s=0.1):
        raise AssertionError("entered without gpu-1")
    assert _free_in_another_thread(locks, ["gpu-0"])
    done.set()
    t.join(5)
    with pytest.raises(RuntimeError), locks.hold(["gpu-0", "gpu-1"], timeout_s=1):
        raise RuntimeError("the block failed")
    assert _free_in_another_thread(locks, ["gpu-0", "gpu-1"])
    locks.close()
