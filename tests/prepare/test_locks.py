"""NodeLocks.hold_if_free: never waits, takes all or nothing (threads and processes)."""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

from dra_driver.gpu.locks import NodeLocks


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
