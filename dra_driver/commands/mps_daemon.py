"""``dra-driver mps-daemon``: one MPS control daemon in the foreground, as a daemon pod's
container runs it (:mod:`dra_driver.mpspods` creates those pods).

It starts ``nvidia-cuda-mps-control -f`` with the daemon's pipe and log dirs and GPUs,
waits until its control pipe exists, sends the ``--setup`` commands (the default
limits; every start sends them, so a container the kubelet restarts serves with the
same limits), then writes ``--ready-file`` (the daemon's PID): the plugin waits for
that file. It stays until the daemon ends (its exit code is the container's, and the
kubelet restarts it) or SIGTERM/SIGINT arrives: then it sends ``quit``, waits for the
daemon to exit (SIGKILL after ``--stop-timeout``) and exits 0.

A control pipe left by a daemon that was killed (no process of this pipe dir lives) is
removed first, or the new daemon would take it for a running one. Imports only the
standard library and :mod:`dra_driver.gpu.sharing.mpsrunners` (no NVML, no Kubernetes).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import time
from pathlib import Path
from types import FrameType

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pipe-dir", type=Path, required=True, help="CUDA_MPS_PIPE_DIRECTORY of the daemon"
    )
    parser.add_argument(
        "--log-dir", type=Path, required=True, help="CUDA_MPS_LOG_DIRECTORY of the daemon"
    )
    parser.add_argument(
        "--mps-control", type=Path, required=True, help="nvidia-cuda-mps-control to run"
    )
    parser.add_argument(
        "--visible-devices",
        default="",
        help="CUDA_VISIBLE_DEVICES of the daemon: GPU UUIDs joined by ','",
    )
    parser.add_argument(
        "--setup",
        default="",
        help="control commands sent once the daemon serves, separated by ';' (its default "
        "limits, e.g. 'set_default_active_thread_percentage 50')",
    )
    parser.add_argument(
        "--library-path",
        default="",
        help="LD_LIBRARY_PATH of the MPS tool only: the driver's libraries",
    )
    parser.add_argument(
        "--ready-file",
        type=Path,
        required=True,
        help="written with the daemon's PID once it serves with its limits",
    )
    parser.add_argument(
        "--start-timeout",
        type=float,
        default=30.0,
        help="seconds to wait for the daemon to serve (default %(default)g)",
    )
    parser.add_argument(
        "--stop-timeout",
        type=float,
        default=10.0,
        help="seconds between 'quit' and SIGKILL (default %(default)g)",
    )


class _Stop:
    def __init__(self) -> None:
        self.signal = 0

    def __call__(self, signum: int, _frame: FrameType | None) -> None:
        self.signal = signum


def run(args: argparse.Namespace) -> int:
    from dra_driver.errors import DriverError
    from dra_driver.gpu.sharing.mpsrunners import daemon_pids

    pipe: Path = args.pipe_dir
    env = {
        **os.environ,
        "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
        "CUDA_MPS_LOG_DIRECTORY": str(args.log_dir),
        "CUDA_VISIBLE_DEVICES": args.visible_devices,
    }
    if args.library_path:
        env["LD_LIBRARY_PATH"] = args.library_path
    ready: Path = args.ready_file
    ready.unlink(missing_ok=True)
    control = pipe / "control"
    if control.exists() and not daemon_pids(Path("/proc"), pipe):
        logger.warning(
            "removing the control pipe of a daemon that was killed", extra={"pipe_dir": str(pipe)}
        )
        control.unlink(missing_ok=True)
    stop = _Stop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    mps = str(args.mps_control)
    child = subprocess.Popen([mps, "-f"], env=env, stdin=subprocess.DEVNULL)
    try:
        _serve(args, env, child, stop, control)
    except DriverError:
        _quit(mps, env, child, args.stop_timeout)
        raise
    if stop.signal:
        logger.info(
            "stopping the MPS control daemon",
            extra={"signal": signal.Signals(stop.signal).name, "pid": child.pid},
        )
        _quit(mps, env, child, args.stop_timeout)
        ready.unlink(missing_ok=True)
        return 0
    ready.unlink(missing_ok=True)
    logger.error("the MPS control daemon exited", extra={"code": child.returncode})
    return child.returncode or 1


def _serve(
    args: argparse.Namespace,
    env: dict[str, str],
    child: subprocess.Popen[bytes],
    stop: _Stop,
    control: Path,
) -> None:
    """Until the daemon serves with its limits (ready file written), then until it ends
    or a signal arrives."""
    from dra_driver.errors import DriverError

    deadline = time.monotonic() + args.start_timeout
    setup = [c.strip() for c in args.setup.split(";") if c.strip()]
    while not stop.signal and child.poll() is None:
        if control.exists():
            sent = (
                subprocess.run(
                    [str(args.mps_control)],
                    env=env,
                    check=False,
                    input="".join(f"{c}\n" for c in setup).encode(),
                    capture_output=True,
                )
                if setup
                else None
            )
            if sent is None or sent.returncode == 0:
                break
            problem = (sent.stderr or sent.stdout).decode(errors="replace").strip()
        else:
            problem = f"no control pipe {control} yet"
        if time.monotonic() > deadline:
            raise DriverError(
                f"MPS control daemon not serving after {args.start_timeout:g} s: {problem}"
            )
        time.sleep(0.01)
    if stop.signal or child.poll() is not None:
        return
    args.ready_file.write_text(f"{child.pid}\n")
    logger.info(
        "MPS control daemon serving",
        extra={"pid": child.pid, "pipe_dir": str(args.pipe_dir), "setup": setup},
    )
    while not stop.signal:
        try:
            child.wait(timeout=0.2)
            return
        except subprocess.TimeoutExpired:
            continue


def _quit(mps: str, env: dict[str, str], child: subprocess.Popen[bytes], grace_s: float) -> None:
    if child.poll() is None:
        subprocess.run([mps], env=env, input=b"quit\n", capture_output=True, check=False)
    try:
        child.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
