"""Emulated ``nvidia-smi`` and ``nvidia-cuda-mps-control`` executables.

The preparer runs the GPU tools as real subprocesses, exactly as on a GPU node;
under emulation :func:`install` writes stand-ins into the emulated bin dir.
Each invocation appends one JSON line to a *record* file (argv, stdin, the
MPS environment, pid) that tests assert on, so a test proves which commands
the driver ran, not which functions it called.

``nvidia-cuda-mps-control -d`` starts a real long-running daemon process (it
detaches like the real one: the starting command returns once the daemon is
ready); ``-f`` runs the same daemon in the foreground (as a daemon pod's
``dra-driver mps-daemon`` does). The daemon reads control commands from a FIFO named ``control`` in
``$CUDA_MPS_PIPE_DIRECTORY``, records each, and exits on ``quit`` or SIGTERM.
Without ``-d`` the tool forwards its stdin lines to that FIFO. The daemon also
writes ``/dev/shm/nvidia-mps-emulated.<pid>`` so tests can see which
``/dev/shm`` it shares with the containers.

Slow tools: if ``<record>.delay`` holds a number of seconds, every invocation
sleeps that long before it acts (a real ``nvidia-smi`` takes 50-500 ms), and
records ``start``/``end`` times (``time.time()``) so tests can see overlap.

Compute modes: ``nvidia-smi -i <uuid> -c <mode>`` keeps the mode in
``<record>.mode.<uuid>``, which ``nvidia-smi -i <uuid> --query-gpu=compute_mode
--format=csv,noheader`` reads back (``Default`` when never set).

MPS limits and clients: the daemon remembers its default limits and serves an
emulation-only client protocol through the same ``control`` FIFO, so a shell in
a container can act as a CUDA client (:mod:`~dra_driver.emulation.mpsclients`).

Faults: if ``<record>.fail`` exists, any invocation whose space-joined argv
contains one of its lines exits 1 with a message, like a failing tool.

Holds: an invocation whose space-joined argv and stdin contain a line of
``<record>.hold`` waits, after it was recorded and before it acts, until that
line is gone from the file: a test can stop the driver exactly while a tool
call is in flight (to SIGKILL it there).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

NVIDIA_SMI = "nvidia-smi"
MPS_CONTROL = "nvidia-cuda-mps-control"
COMPUTE_MODES = ("DEFAULT", "EXCLUSIVE_PROCESS", "PROHIBITED", "0", "2", "3")
_MODE_NAMES = {"0": "DEFAULT", "2": "PROHIBITED", "3": "EXCLUSIVE_PROCESS"}

_WRAPPER = """#!{python}
# Emulated {tool}: written by dra_driver.emulation.gputools.install
import importlib.util, sys
spec = importlib.util.spec_from_file_location("gputools", {module!r})
tools = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tools)
sys.exit(tools.main({tool!r}, {record!r}, sys.argv[1:]))
"""


def install(bin_dir: Path, record: Path, *, python: str = sys.executable) -> dict[str, Path]:
    """Write the emulated tools into ``bin_dir``; returns their paths by tool name."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    module = str(Path(__file__).resolve())  # loaded by path: no package import cost per call
    paths: dict[str, Path] = {}
    for tool in (NVIDIA_SMI, MPS_CONTROL):
        path = bin_dir / tool
        path.write_text(
            _WRAPPER.format(python=python, tool=tool, record=str(record), module=module)
        )
        path.chmod(0o755)
        paths[tool] = path
    return paths


def read_record(record: Path) -> list[dict[str, Any]]:
    """All recorded invocations, oldest first."""
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text().splitlines() if line.strip()]


def _append(record: Path, entry: dict[str, Any]) -> None:
    line = (json.dumps(entry, sort_keys=True) + "\n").encode()
    fd = os.open(record, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def _mps_env() -> dict[str, str]:
    keys = ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY", "CUDA_VISIBLE_DEVICES")
    return {k: os.environ[k] for k in keys if k in os.environ}


def _hold(record: Path, argv: list[str], stdin: str) -> None:
    hold = Path(f"{record}.hold")
    call = " ".join([*argv, stdin])
    while True:
        try:
            patterns = hold.read_text().splitlines()
        except OSError:
            return
        if not any(p and p in call for p in patterns):
            return
        time.sleep(0.02)


def _delay(record: Path) -> float:
    try:
        return float(Path(f"{record}.delay").read_text())
    except (OSError, ValueError):
        return 0.0


def _injected_failure(record: Path, argv: list[str]) -> str | None:
    fail = Path(f"{record}.fail")
    if not fail.exists():
        return None
    joined = " ".join(argv)
    for pattern in fail.read_text().splitlines():
        if pattern and pattern in joined:
            return pattern
    return None


def main(tool: str, record_path: str, argv: list[str]) -> int:
    record = Path(record_path)
    stdin = "" if tool == NVIDIA_SMI or argv in (["-d"], ["-f"]) else sys.stdin.read()
    entry: dict[str, Any] = {"tool": tool, "argv": argv, "pid": os.getpid(), "env": _mps_env()}
    if stdin:
        entry["stdin"] = stdin
    delay = _delay(record)
    if delay:
        entry["start"] = time.time()
        time.sleep(delay)
        entry["end"] = time.time()
    _append(record, entry)
    _hold(record, [tool, *argv], stdin)
    pattern = _injected_failure(record, [tool, *argv])
    if pattern is not None:
        print(f"{tool}: injected failure ({pattern})", file=sys.stderr)
        return 1
    if tool == NVIDIA_SMI:
        return _nvidia_smi(record, argv)
    if argv == ["-d"]:
        return _start_daemon(record)
    if argv == ["-f"]:
        return _start_daemon(record, foreground=True)
    if argv:
        print(f"{MPS_CONTROL}: unknown arguments {argv}", file=sys.stderr)
        return 2
    return _send_commands(stdin)


def _nvidia_smi(record: Path, argv: list[str]) -> int:
    if len(argv) == 4 and argv[0] == "-i" and argv[2] == "-c" and argv[3] in COMPUTE_MODES:
        mode = _MODE_NAMES.get(argv[3], argv[3])
        kept = Path(f"{record}.mode.{argv[1]}")
        kept.with_name(kept.name + ".tmp").write_text(mode)
        kept.with_name(kept.name + ".tmp").replace(kept)
        print(f"Set compute mode to {mode} for GPU {argv[1]}.")
        return 0
    if argv[:1] == ["-i"] and argv[2:] == ["--query-gpu=compute_mode", "--format=csv,noheader"]:
        try:
            mode = Path(f"{record}.mode.{argv[1]}").read_text()
        except FileNotFoundError:
            mode = "DEFAULT"
        print(mode.title())  # Default, Exclusive_Process, Prohibited
        return 0
    if (
        len(argv) == 5
        and argv[:2] == ["compute-policy", "-i"]
        and argv[3] == "--set-timeslice"
        and argv[4] in ("0", "1", "2", "3")
    ):
        print(f"Set timeslice to {argv[4]} for GPU {argv[2]}.")
        return 0
    print(f"nvidia-smi (emulated): unsupported arguments {argv}", file=sys.stderr)
    return 2


def _pipe_dir() -> Path | None:
    value = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
    return Path(value) if value else None


def _start_daemon(record: Path, *, foreground: bool = False) -> int:
    pipe, log = _pipe_dir(), os.environ.get("CUDA_MPS_LOG_DIRECTORY")
    if pipe is None or not pipe.is_dir() or not log or not Path(log).is_dir():
        print(f"{MPS_CONTROL}: pipe and log directories must exist", file=sys.stderr)
        return 1
    control = pipe / "control"
    if control.exists():
        print(f"{MPS_CONTROL}: An instance of this daemon is already running", file=sys.stderr)
        return 1
    os.mkfifo(control, 0o600)
    if foreground:
        _daemon_loop(record, control, Path(log), None)
        return 0
    ready_r, ready_w = os.pipe()
    if os.fork() > 0:
        os.close(ready_w)
        ok = os.read(ready_r, 1) == b"1"
        return 0 if ok else 1
    os.close(ready_r)
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    _daemon_loop(record, control, Path(log), ready_w)
    os._exit(0)


def _daemon_loop(record: Path, control: Path, log_dir: Path, ready_w: int | None) -> None:
    pipe_dir = control.parent

    def stop(_sig: int, _frame: object) -> None:
        marker.unlink(missing_ok=True)
        control.unlink(missing_ok=True)
        _append(record, {"tool": "mps-daemon", "pid": os.getpid(), "event": "terminated"})
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    fd = os.open(control, os.O_RDWR)  # RDWR: never sees EOF when a client closes
    # Shows which /dev/shm the daemon uses: the claim's tmpfs when started through
    # dra_driver.gpu.sharing.mpslaunch (tests look for it there and inside the container).
    marker = Path("/dev/shm") / f"nvidia-mps-emulated.{os.getpid()}"
    marker.write_text(str(pipe_dir) + "\n")
    _append(
        record, {"tool": "mps-daemon", "pid": os.getpid(), "event": "started", "env": _mps_env()}
    )
    with (log_dir / "control.log").open("a") as logf:
        logf.write(f"[{time.time():.3f}] emulated MPS control daemon {os.getpid()} started\n")
    clients = _load_clients().Daemon(pipe_dir, os.environ.get("CUDA_VISIBLE_DEVICES", ""))
    if ready_w is not None:
        os.write(ready_w, b"1")
        os.close(ready_w)
    buffered = b""
    with os.fdopen(fd, "rb", buffering=0) as fifo:
        while True:
            chunk = fifo.read(4096)
            if not chunk:
                time.sleep(0.01)
                continue
            buffered += chunk
            while b"\n" in buffered:
                raw, buffered = buffered.split(b"\n", 1)
                command = raw.decode().strip()
                if not command:
                    continue
                _append(record, {"tool": "mps-daemon", "pid": os.getpid(), "command": command})
                clients.handle(command)
                if command == "quit":
                    marker.unlink(missing_ok=True)
                    control.unlink(missing_ok=True)
                    return


def _load_clients() -> Any:
    """:mod:`.mpsclients`, loaded by path like this module (no package import)."""
    path = Path(__file__).with_name("mpsclients.py")
    spec = importlib.util.spec_from_file_location("mpsclients", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["mpsclients"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _send_commands(stdin: str) -> int:
    pipe = _pipe_dir()
    control = pipe / "control" if pipe else None
    if control is None or not control.exists():
        print(f"{MPS_CONTROL}: Cannot find MPS control daemon process", file=sys.stderr)
        return 1
    try:
        fd = os.open(control, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        print(f"{MPS_CONTROL}: Cannot find MPS control daemon process", file=sys.stderr)
        return 1
    try:
        os.write(fd, stdin.encode() if stdin.endswith("\n") else (stdin + "\n").encode())
    finally:
        os.close(fd)
    return 0
