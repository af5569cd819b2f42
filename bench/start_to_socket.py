"""Benchmark: start of ``dra-driver kubelet-plugin`` to its registration socket (not a test).

Runs the daemon (4 emulated L4s, or with ``--real`` this node's GPUs through the
real NVML, as root) against an unreachable API server, so only the start path
counts, from one or more source trees, starts alternating between them.
Two figures per start: the wall time until the registration socket exists, seen
from outside; and, in a second process whose ``serve()`` is wrapped to exit when it
returns (sockets in place), the CPU time the process used to get there, which the
machine's load moves much less. Compare a change with its parent by exporting it::

    git archive HEAD~1 dra_driver | tar -x -C /tmp/before
    .venv/bin/python -m bench.start_to_socket --trees /tmp/before,. --starts 9
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.bytecode import PLUGIN_ENV, compile_package

KUBECONFIG = {
    "apiVersion": "v1",
    "kind": "Config",
    "current-context": "c",
    "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
    "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    "users": [{"name": "u", "user": {"token": "t"}}],
}
HOOK = """\
import resource, sys
from dra_driver.plugin.app import KubeletPlugin
serve = KubeletPlugin.serve
def at_socket(self):
    serve(self)
    r = resource.getrusage(resource.RUSAGE_SELF)
    print((r.ru_utime + r.ru_stime) * 1000, flush=True)
    raise SystemExit(0)
KubeletPlugin.serve = at_socket
from dra_driver.cli import main
main(sys.argv[1:])
"""


def _start(tree: Path, *, hook: bool, real: bool = False) -> float:
    """Wall ms to the registration socket, or (``hook``) CPU ms to serve()'s return."""
    work = Path(tempfile.mkdtemp(prefix="sts-", dir="/tmp"))  # short: socket paths
    try:
        (work / "kubeconfig").write_text(json.dumps(KUBECONFIG))
        env = {k: v for k, v in os.environ.items() if not k.startswith("DRA_")}
        env |= PLUGIN_ENV | {
            "DRA_NODE_NAME": "node-a",
            "DRA_KUBECONFIG": str(work / "kubeconfig"),
            "PYTHONPATH": os.pathsep.join(
                [str(tree), *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
        }
        gpus = [] if real else ["--emulate=l4-x4", f"--host-root={work / 'host'}"]
        args = ["kubelet-plugin", *gpus, f"--cdi-dir={work / 'cdi'}",
                f"--state-dir={work / 'state'}",
                f"--kubelet-registry-dir={work / 'reg'}",
                f"--kubelet-plugins-dir={work / 'plugins'}", "--health-port=0"]  # fmt: skip
        if hook:
            cmd = [sys.executable, "-c", HOOK, *args]
            out = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True,
                                 check=False, timeout=60)  # fmt: skip
            if out.returncode != 0:
                raise SystemExit(f"{tree}: the daemon exited {out.returncode}:\n{out.stderr}")
            return float(out.stdout.split()[-1])
        socket = work / "reg" / "gpu.nvidia.com-reg.sock"
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "dra_driver", *args], cwd=tree, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            while not socket.exists():
                if proc.poll() is not None or time.perf_counter() - t0 > 60:
                    raise SystemExit(f"{tree}: no registration socket (exit {proc.poll()})")
                time.sleep(0.001)
            return (time.perf_counter() - t0) * 1000
        finally:
            proc.terminate()
            proc.wait()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", default=".", help="comma-separated source trees")
    parser.add_argument("--starts", type=int, default=7, help="starts per tree and figure")
    parser.add_argument("--real", action="store_true", help="this node's real GPUs (root)")
    args = parser.parse_args()
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    for tree in trees:  # bytecode as installed, then warm the page cache
        compile_package(tree)
        _start(tree, hook=True, real=args.real)
    wall: dict[Path, list[float]] = {t: [] for t in trees}
    cpu: dict[Path, list[float]] = {t: [] for t in trees}
    load = [os.getloadavg()[0]]
    for _ in range(args.starts):
        for tree in trees:
            wall[tree].append(_start(tree, hook=False, real=args.real))
            cpu[tree].append(_start(tree, hook=True, real=args.real))
    load.append(os.getloadavg()[0])
    for tree in trees:
        print(json.dumps({
            "tree": str(tree),
            "gpus": "real" if args.real else "emulated l4-x4",
            "socket_wall_ms_median": round(statistics.median(wall[tree]), 1),
            "serve_cpu_ms_median": round(statistics.median(cpu[tree]), 1),
            "socket_wall_ms": [round(x) for x in wall[tree]],
            "serve_cpu_ms": [round(x) for x in cpu[tree]],
        }))  # fmt: skip
    print(json.dumps({"load1_start_end": [round(x, 2) for x in load]}))


if __name__ == "__main__":
    main()
