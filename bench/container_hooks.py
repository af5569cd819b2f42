"""Benchmark: what NVIDIA's hooks in our CDI specs add to a container's start (not a test).

One claim on an emulated T4 (driver libraries as real ELF objects), its spec injected
by the real CDI Go library, ``runc run`` of a Debian-family image's ``sh -c 'exit 0'``
on a fresh root filesystem each time (the hooks write its ld cache), alternating the
spec as written (four ``createContainer`` hooks of ``nvidia-cdi-hook``) and the same
spec without its hooks. The pod-level figure (pod creation to Running through the
kubelet) is ``bench.real_pod_start`` run on two trees.

    .venv/bin/python -m bench.container_hooks [--runs 20]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
from pathlib import Path

from dra_driver.demo.runtime import ContainerRuntime, find_cdi_harness
from dra_driver.plugin.claims import AllocatedDevice, Claim, ClaimRef
from tests.images import build_probe, debian_rootfs
from tests.prepare.emulated import emulated

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="hook-bench-", dir="/tmp"))
    try:
        setup = emulated("t4", tmp / "node")
        claim = Claim(ref=ClaimRef("ns", "c", "7e1a0c5e-4d2b-4c1e-9f3a-5b6c7d8e9f00"),
                      devices=(AllocatedDevice("gpu", "node", "gpu-0"),))  # fmt: skip
        hook = Path(shutil.which("nvidia-cdi-hook") or "nvidia-cdi-hook")
        ids = [i for d in setup.preparer(hook).prepare(claim) for i in d.cdi_device_ids]
        (spec,) = setup.cdi_dir.iterdir()
        with_hooks = spec.read_text()
        bare = json.loads(with_hooks)
        bare["containerEdits"].pop("hooks")
        runtime = ContainerRuntime(cdi_harness=find_cdi_harness(ROOT), workdir=tmp / "rt")
        probe = build_probe(tmp / "probe")
        times: dict[str, list[float]] = {"with hooks": [], "without": []}
        for i in range(args.runs):
            for mode, text in (("with hooks", with_hooks), ("without", json.dumps(bare))):
                spec.write_text(text)
                rootfs = debian_rootfs(tmp / f"rootfs-{i}-{len(mode)}", probe)
                run = runtime.run(cdi_dirs=[setup.cdi_dir], cdi_ids=ids,
                                  argv=["/bin/sh", "-c", "exit 0"], rootfs=rootfs)  # fmt: skip
                if run.returncode != 0:
                    raise SystemExit(f"container failed: {run.stderr}")
                times[mode].append(run.run_s * 1000)
        for mode, ms in times.items():
            ms.sort()
            print(f"runc run, {mode}: p50 {statistics.median(ms):.0f} ms, "
                  f"p90 {ms[int(len(ms) * 0.9) - 1]:.0f} ms, max {ms[-1]:.0f} ms")  # fmt: skip
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
