"""GPU tools die with the plugin (issue 40 item 4).

A plugin SIGKILLed alone (not its process group: a host process, or a container whose
runtime leaves its children) while ``nvidia-smi -c DEFAULT`` runs: before the fix the
tool went on, and landed after the restarted plugin had set the GPU up again (a GPU in
DEFAULT under a live MPS daemon). Now each tool is SIGKILLed with the plugin, before it
acts. Real processes: the emulated tool is held in flight by its ``.hold`` file.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from dra_driver.devcluster import wait_until
from dra_driver.emulation.gputools import install, read_record

UUID = "GPU-0c9f0000-0000-4000-8000-000000000001"

PLUGIN = """
import logging, sys
from pathlib import Path
from dra_driver.gpu.sharing.tools import GpuCommands, GpuTools
tools = GpuTools(nvidia_smi=Path(sys.argv[1]))
GpuCommands(tools=tools, logger=logging.getLogger()).set_compute_mode(sys.argv[2], "DEFAULT")
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_a_tool_in_flight_dies_with_a_sigkilled_plugin_and_never_acts(tmp_path: Path) -> None:
    record = tmp_path / "tools.jsonl"
    smi = install(tmp_path / "bin", record)["nvidia-smi"]
    Path(f"{record}.hold").write_text("-c DEFAULT\n")
    plugin = subprocess.Popen(
        [sys.executable, "-c", PLUGIN, str(smi), UUID],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    try:
        (call,) = wait_until(lambda: read_record(record), timeout=30, what="tool in flight")
        tool = int(call["pid"])
        assert _alive(tool)
        plugin.send_signal(signal.SIGKILL)  # the plugin alone, not its group
        plugin.wait(10)
        killed_at = time.monotonic()
        wait_until(lambda: not _alive(tool), timeout=5, what=f"tool {tool} gone")
        assert time.monotonic() - killed_at < 1.0
        Path(f"{record}.hold").unlink()  # what would let a surviving tool act now
        time.sleep(0.5)
        assert not Path(f"{record}.mode.{UUID}").exists()  # the mode was never set
    finally:
        Path(f"{record}.hold").unlink(missing_ok=True)
        if plugin.poll() is None:
            plugin.kill()
