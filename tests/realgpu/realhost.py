"""Helpers of the real-GPU tier: run NVIDIA's own tools, keep what they said, and
look for anything a claim left behind (daemons, mounts, compute modes)."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from dra_driver.gpu.sharing.tools import GpuTools
from dra_driver.plugin.claims import Claim
from tests.prepare.hosttree import claim, gpu_config

REPO = Path(__file__).parents[2]
CLIENT = str(Path(__file__).with_name("cudaclient.py"))


def sh(*argv: str, env: dict[str, str] | None = None, timeout: float = 60) -> str:
    done = subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout, check=False, env=env
    )
    assert done.returncode == 0, f"{argv}: rc={done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def tool(name: str) -> str:
    """``name`` from ``$DRA_GPU_TOOLS`` (a dir carried to the GPU node) or ``PATH``."""
    where = os.environ.get("DRA_GPU_TOOLS")
    path = Path(where) / name if where else None
    found = str(path) if path and path.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} not found (set DRA_GPU_TOOLS or install it)", pytrace=False)
    return found


def record(name: str, text: str) -> None:
    """Keep what the real tools said, for the notes (under $DRA_GPU_RECORD)."""
    out = os.environ.get("DRA_GPU_RECORD")
    if out:
        with open(Path(out) / "realgpu-record.txt", "a") as f:
            f.write(f"### {name}\n{text.rstrip()}\n\n")


def smi(tools: GpuTools, *args: str) -> str:
    return sh(str(tools.nvidia_smi), *args)


def query(tools: GpuTools, fields: list[str]) -> list[dict[str, str]]:
    out = smi(tools, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits")
    return [
        dict(zip(fields, (v.strip() for v in line.split(",")), strict=True))
        for line in out.strip().splitlines()
    ]


def real_claim(device: str, sharing: dict[str, object] | None = None) -> Claim:
    """A fresh claim (new UID) on one device, with a GpuConfig when ``sharing`` is given."""
    configs = [gpu_config(sharing)] if sharing is not None else []
    return claim(uid=str(uuid.uuid4()), devices=[("gpu", device)], configs=configs)


def spec_of(cdi_dir: Path) -> dict[str, Any]:
    (path,) = cdi_dir.iterdir()
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def mps_processes() -> list[str]:
    """Live (not zombie) MPS processes; zombies are init's to reap in the test VM."""
    out = sh("ps", "-eo", "stat=,pid=,comm=")
    live = (line for line in out.splitlines() if not line.lstrip().startswith("Z"))
    return [line for line in live if "mps" in line]


def mounts_under(path: Path) -> list[str]:
    return [
        line.split()[4]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if line.split()[4].startswith(str(path))
    ]


class Client:
    """One CUDA process talking to an MPS daemon as a claim's container would."""

    def __init__(self, label: str, pipe: str | None, shm: str | None, **limits: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}
        if pipe is not None:
            env["CUDA_MPS_PIPE_DIRECTORY"] = pipe
        env.update(limits)
        argv = [sys.executable, CLIENT]
        if shm is not None:
            argv = [sys.executable, "-m", "dra_driver.gpu.sharing.mpslaunch", shm, *argv]
        self.label = label
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=env, cwd=REPO,
        )  # fmt: skip
        self.hello = self._read(30)

    def _read(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return {"timeout_s": timeout}
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(10)
            err = self.proc.stderr.read() if self.proc.stderr else ""
            return {"exit": self.proc.returncode, "stderr": err[-500:]}
        return json.loads(line)  # type: ignore[no-any-return]

    @property
    def up(self) -> bool:
        return self.hello.get("ctx") == 0

    def alloc(self, gib: float) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"alloc {gib}\n")
        self.proc.stdin.flush()
        return int(self._read(60).get("rc", -1))

    def close(self) -> None:
        try:
            self.proc.communicate("quit\n", timeout=20)
        except (BrokenPipeError, ValueError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.communicate(timeout=10)


def mps_mounts(cdi_dir: Path, uid: str) -> tuple[str, str]:
    """The claim's MPS pipe and /dev/shm host paths, from its CDI spec."""
    spec = json.loads((cdi_dir / f"k8s.gpu.nvidia.com-claim_{uid}.json").read_text())
    mounts = {
        m["containerPath"]: m["hostPath"]
        for d in spec["devices"]
        for m in d["containerEdits"].get("mounts", [])
    }
    return mounts["/tmp/nvidia-mps"], mounts["/dev/shm"]


def compute_mode(tools: GpuTools, index: int) -> str:
    return query(tools, ["compute_mode"])[index]["compute_mode"]


def assert_nothing_left(tools: GpuTools, index: int, state: Path, pipes: list[str]) -> None:
    deadline = time.monotonic() + 15
    while (mps_processes() or any(Path(p).exists() for p in pipes)) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.2)
    assert mps_processes() == []
    assert [p for p in pipes if Path(p).exists()] == []
    assert mounts_under(state) == []
    assert compute_mode(tools, index) == "Default"
