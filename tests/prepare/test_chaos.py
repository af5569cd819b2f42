"""Seeded chaos: hundreds of prepare and unprepare calls on an emulated 12-GPU node with
slow tools (exclusive, time-slicing, MPS, both in one claim, enforced MPS shares of one
GPU, time-sliced shares of another; in the ``slots`` variant, on a 580 driver, MPS slots of
one GPU instead of the enforced shares), a plugin process SIGKILLed alone (its tools must
die with it) at random points of calls and of its start-up recovery, and restarted at
random. After every call and every restart, what runs on the node is what the checkpoint
says; at the end every claim is unprepared and nothing is left: no spec, entry, daemon,
directory, mount, temp file or GPU setting.

``DRA_CHAOS_SEED=<n>`` repeats a run (the seed is in every failure message; without it
each run draws a new one), ``DRA_CHAOS_OPS=<n>`` sets the number of calls (300).
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import sys
import time
from collections import Counter, deque
from pathlib import Path
from typing import IO, Any

import pytest

from dra_driver.plugin.claims import Claim
from tests.prepare.chaos import VARIANTS, claims_for, open_chaos_node
from tests.prepare.hosttree import Node

REPO = Path(__file__).parents[2]
PREPARED, UNPREPARED, INTERRUPTED = "prepared", "unprepared", "interrupted"
KILL_RANGE = {"step": 11, "tool-before": 6, "tool-after": 6, "write": 4}
"""Kill point kind -> N drawn from 1..this (a call with fewer points finishes)."""
KILL_P, RECOVERY_KILL_P, IDLE_RESTART_P = 0.35, 0.3, 0.05
REPLY_TIMEOUT_S = 60.0
TEMP_MAX_AGE_S = 60.0
"""The plugin removes checkpoint temp files older than this at start (another instance
may be writing a younger one)."""


class Died(Exception):
    """The worker process is gone (it was SIGKILLed)."""


class Worker:
    """One plugin process (:mod:`tests.prepare.chaos`) in its own process group."""

    def __init__(self, root: Path, log: IO[str], kill: dict[str, Any] | None, variant: str) -> None:
        argv = [sys.executable, "-m", "tests.prepare.chaos", str(root)]
        self.proc = subprocess.Popen(
            argv + ([json.dumps(kill)] if kill else []),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO), "DRA_CHAOS_VARIANT": variant},
            start_new_session=True,
        )
        self.read()  # {"ready": true} once recovery is done

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], REPLY_TIMEOUT_S)
        assert ready, f"no answer from the plugin in {REPLY_TIMEOUT_S} s"
        line = self.proc.stdout.readline()
        if not line:
            self._reap()
            assert self.proc.returncode == -signal.SIGKILL, f"exit {self.proc.returncode}"
            raise Died
        reply: dict[str, Any] = json.loads(line)
        return reply

    def call(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self.read()

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)  # the plugin alone: its tools die with it
        self._reap()

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        assert self.proc.wait(REPLY_TIMEOUT_S) == 0
        self._reap()

    def _reap(self) -> None:
        """Wait for the process and every tool of its group (never the detached daemons):
        a tool that outlives the plugin fails the run."""
        self.proc.wait(REPLY_TIMEOUT_S)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while group_members(self.proc.pid):
            assert time.monotonic() < deadline, f"group {self.proc.pid} outlived SIGKILL"
            time.sleep(0.01)


def group_members(pgid: int) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            found.append(int(proc.name))
    return found


class ToolRecord:
    """The emulated tools' record file, read on from where the last look ended (it grows
    by thousands of lines in a run): what each GPU was last told, daemons started."""

    def __init__(self, node: Node) -> None:
        self.node, self.offset, self.calls = node, 0, 0
        self.told: dict[str, tuple[str, str]] = {}
        self.started: dict[int, str] = {}

    def update(self) -> ToolRecord:
        if not self.node.record.exists():
            return self
        with self.node.record.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.decode().splitlines():
            call = json.loads(line)
            argv = call.get("argv", [])
            if call["tool"] == "mps-daemon" and call.get("event") == "started":
                self.started[call["pid"]] = str(Path(call["env"]["CUDA_MPS_PIPE_DIRECTORY"]).parent)
            if call["tool"] != "mps-daemon":
                self.calls += 1
            if call["tool"] != "nvidia-smi":
                continue
            if argv[:1] == ["-i"] and argv[2] != "-c":  # -i <uuid> --query-gpu=...
                continue
            if argv[:1] == ["-i"]:  # -i <uuid> -c <mode>
                self.told[argv[1]] = (argv[3], self.told.get(argv[1], ("DEFAULT", "0"))[1])
            else:  # compute-policy -i <uuid> --set-timeslice <n>
                self.told[argv[2]] = (self.told.get(argv[2], ("DEFAULT", "0"))[0], argv[4])
        return self

    def daemon_dirs(self) -> set[str]:
        """Directories (``<state>/mps/<id>``) of the live daemons."""
        live = self.node.live_daemons()
        assert set(live) <= set(self.started), "a live daemon that no record shows starting"
        return {self.started[pid] for pid in live}


def checkpoint(node: Node) -> dict[str, Any]:
    path = node.state_dir / "checkpoint.json"
    if not path.exists():
        return {"claims": {}, "shared": {}}
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def assert_consistent(
    node: Node, record: ToolRecord, model: dict[str, str], claims: dict[str, Claim]
) -> dict[str, Any]:
    """What runs on the node is what the checkpoint says, and the checkpoint agrees with
    what the calls answered (``model``: claim name -> what its last call said)."""
    cp = checkpoint(node)
    record.update()
    entries, shared = cp["claims"], cp["shared"]
    assert {u: e["state"] for u, e in entries.items() if e["state"] != "Prepared"} == {}
    for name, known in model.items():
        uid = claims[name].uid
        if known != INTERRUPTED:
            assert (uid in entries) == (known == PREPARED), f"{name} is {known} by its last call"
    specs = {p.name for p in node.cdi_dir.iterdir()} if node.cdi_dir.exists() else set()
    assert specs == {f"k8s.gpu.nvidia.com-claim_{uid}.json" for uid in entries}
    units = [u for e in entries.values() for u in e["units"]]
    daemon_dirs = {str(node.state_dir / "mps" / u["record"]["daemonId"]) for u in units
                   if "daemonId" in u["record"]}  # fmt: skip
    assert record.daemon_dirs() == daemon_dirs, "live MPS daemons"
    assert len(node.live_daemons()) == len(daemon_dirs), "one daemon per recorded daemon"
    mps = node.state_dir / "mps"
    assert ({str(p) for p in mps.iterdir()} if mps.exists() else set()) == daemon_dirs
    assert sorted(node.mounts()) == sorted(f"{d}/shm" for d in daemon_dirs)
    assert {k: v["state"] for k, v in shared.items()} == {
        k: "Ready" for u in units for k in u["shared"]
    }
    exclusive = {g for u in units for g in u["record"].get("exclusive", ())}
    exclusive |= {v["record"]["gpu"] for v in shared.values()
                  if v["record"]["computeMode"] == "EXCLUSIVE_PROCESS"}  # fmt: skip
    timeslices = {u["record"]["gpu"]: str(u["record"]["timeslice"]) for u in units
                  if u["strategy"] == "TimeSlicing"}  # fmt: skip
    for gpu in node.inventory.gpus:
        mode = "EXCLUSIVE_PROCESS" if gpu.uuid in exclusive else "DEFAULT"
        expected = (mode, timeslices.get(gpu.uuid, "0"))
        told = record.told.get(gpu.uuid, ("DEFAULT", "0"))
        assert told == expected, f"gpu-{gpu.index}: compute mode and time-slice"
    temps = [p.name for p in node.state_dir.glob("*.tmp")]
    assert all(t.startswith("checkpoint.json.") for t in temps), temps
    return cp


def assert_nothing_left(node: Node, record: ToolRecord, claims: dict[str, Claim]) -> None:
    cp = assert_consistent(node, record, dict.fromkeys(claims, UNPREPARED), claims)
    assert cp["claims"] == {} and cp["shared"] == {}
    assert node.live_daemons() == [] and node.mounts() == []
    assert not (node.state_dir / "mps").exists() or list((node.state_dir / "mps").iterdir()) == []
    assert not node.cdi_dir.exists() or list(node.cdi_dir.iterdir()) == []
    assert list(node.state_dir.glob("*.tmp")) == []
    assert all(v == ("DEFAULT", "0") for v in record.told.values())


def kill_point(rng: random.Random) -> dict[str, Any]:
    at = rng.choice(sorted(KILL_RANGE))
    return {"at": at, "n": rng.randint(1, KILL_RANGE[at])}


class Chaos:
    def __init__(self, node: Node, seed: int, log: IO[str], variant: str) -> None:
        self.variant, self.claims = variant, claims_for(variant)
        self.node, self.rng, self.log = node, random.Random(seed), log
        self.model = dict.fromkeys(self.claims, UNPREPARED)
        self.record = ToolRecord(node)
        self.worker: Worker | None = None
        self.stats: Counter[str] = Counter()
        self.history: deque[str] = deque(maxlen=12)
        self.most_together: Counter[str] = Counter()
        """Claim name prefix (``share``, ``slot``) -> most claims of it prepared at once."""

    def start(self, kills: bool = True) -> Worker:
        """A new plugin process, perhaps killed during its recovery (then started again)."""
        while True:
            kill = kill_point(self.rng) if kills and self.rng.random() < RECOVERY_KILL_P else None
            self.history.append(f"start, kill in recovery at {kill}")
            self.stats["starts"] += 1
            try:
                worker = Worker(self.node.root, self.log, kill, self.variant)
            except Died:
                self.stats[f"killed in recovery at {kill and kill['at']}"] += 1
                continue
            cp = assert_consistent(self.node, self.record, self.model, self.claims)
            for name, known in self.model.items():  # what recovery made of interrupted calls
                if known == INTERRUPTED:
                    self.model[name] = (
                        PREPARED if self.claims[name].uid in cp["claims"] else UNPREPARED
                    )
            return worker

    def step(self) -> None:
        if self.worker is None:
            self.worker = self.start()
        if self.rng.random() < IDLE_RESTART_P:
            how = self.rng.choice(["sigkill", "exit"])
            self.history.append(f"restart ({how})")
            self.worker.kill() if how == "sigkill" else self.worker.stop()
            self.worker = None
            return
        name = self.rng.choice(sorted(self.claims))
        if self.model[name] == PREPARED:
            op = "unprepare" if self.rng.random() < 0.7 else "prepare"
        else:
            op = "prepare" if self.rng.random() < 0.8 else "unprepare"
        kill = kill_point(self.rng) if self.rng.random() < KILL_P else None
        self.history.append(f"{op} {name}, kill at {kill}")
        tool_calls = self.record.update().calls
        try:
            reply = self.worker.call({"op": op, "claim": name, "kill": kill})
        except Died:
            self.stats[f"killed at {kill and kill['at']}"] += 1
            self.model[name] = INTERRUPTED
            self.worker = None
            return
        assert reply["ok"], reply["error"]
        self.stats[op] += 1
        if op == "prepare" and self.model[name] == PREPARED:
            # Prepared and consistent: a second pod of the claim gets it as it is.
            assert self.record.update().calls == tool_calls, "a prepared claim was prepared again"
            self.stats["repeated prepare"] += 1
        if op == "prepare":
            assert reply["devices"] == [d.device for d in self.claims[name].devices]
        self.model[name] = PREPARED if op == "prepare" else UNPREPARED
        together = Counter(n.split("-")[0] for n, known in self.model.items() if known == PREPARED)
        for kind, count in together.items():
            self.most_together[kind] = max(self.most_together[kind], count)
        assert_consistent(self.node, self.record, self.model, self.claims)

    def finish(self) -> None:
        """Unprepare every claim, then start once more a minute later (temp files of
        killed checkpoint writes go then): nothing may be left."""
        if self.worker is None:
            self.worker = self.start(kills=False)
        for name in sorted(self.claims):
            self.history.append(f"final unprepare {name}")
            assert self.worker.call({"op": "unprepare", "claim": name})["ok"], name
        self.worker.stop()
        self.worker = None
        old = time.time() - TEMP_MAX_AGE_S - 1
        for tmp in self.node.state_dir.glob("*.tmp"):
            os.utime(tmp, (old, old))
            self.stats["checkpoint temp files left by kills"] += 1
        self.model = dict.fromkeys(self.claims, UNPREPARED)
        self.start(kills=False).stop()
        assert_nothing_left(self.node, self.record, self.claims)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.kill()


@pytest.mark.parametrize("variant", VARIANTS)
def test_random_sigkills_leave_nothing_behind(tmp_path: Path, variant: str) -> None:
    seed = int(os.environ.get("DRA_CHAOS_SEED") or random.SystemRandom().randrange(1 << 32))
    ops = int(os.environ.get("DRA_CHAOS_OPS", "300"))
    node = open_chaos_node(tmp_path / "node", create=True, variant=variant)
    log_path = tmp_path / "plugin.log"
    with log_path.open("w") as log:
        chaos = Chaos(node, seed, log, variant)
        try:
            for _ in range(ops):
                chaos.step()
            chaos.finish()
        except AssertionError as exc:
            tail = "\n".join(log_path.read_text().splitlines()[-30:])
            raise AssertionError(
                f"chaos seed {seed} (repeat with DRA_CHAOS_SEED={seed}): {exc}\n"
                f"last calls: {list(chaos.history)}\nplugin log tail:\n{tail}"
            ) from exc
        finally:
            chaos.close()
            for pid in node.live_daemons():
                os.kill(pid, signal.SIGKILL)
    print(f"chaos seed {seed}: {dict(chaos.stats)}")
    shared = "slot" if variant == "slots" else "share"  # one GPU's shares or slots, together
    assert chaos.most_together[shared] >= 2, f"seed {seed}: {dict(chaos.most_together)}"
    fired = {k.split(" at ")[-1] for k in chaos.stats if k.startswith("killed")}
    assert set(KILL_RANGE) <= fired, f"seed {seed}: kill points never hit: {chaos.stats}"
