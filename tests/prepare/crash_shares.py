"""What the emulated host says about shares: GPU compute modes, live MPS daemons."""

from __future__ import annotations

from pathlib import Path

from tests.prepare.hosttree import Node


def gpu_modes(node: Node) -> dict[str, str]:
    """Each GPU's compute mode as the emulated nvidia-smi was last told (GPUs never told
    anything are left out)."""
    modes: dict[str, str] = {}
    for call in node.calls("nvidia-smi"):
        argv = call["argv"]
        if isinstance(argv, list) and argv[:1] == ["-i"] and argv[2] == "-c":
            modes[argv[1]] = argv[3]
    return modes


def daemons_by_dir(node: Node) -> dict[str, int]:
    """Live emulated MPS control daemons: their directory (``<state>/mps/<id>``) -> PID."""
    live = set(node.live_daemons())
    out = {}
    for call in node.calls("mps-daemon"):
        pid = call["pid"]
        if call.get("event") == "started" and pid in live:
            env = call["env"]
            assert isinstance(env, dict) and isinstance(pid, int)
            out[str(Path(env["CUDA_MPS_PIPE_DIRECTORY"]).parent)] = pid
    return out
