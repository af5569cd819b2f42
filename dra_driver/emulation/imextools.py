"""Emulated ``nvidia-imex`` and ``nvidia-imex-ctl`` executables (ComputeDomain daemons).

In the pattern of :mod:`.gputools`: :func:`install` writes stand-ins into a bin dir,
each invocation appends one JSON line to a *record* file, and switch files next to the
record steer them, so a test proves what the IMEX daemon was told, not which functions
ran.

``nvidia-imex -c <config>`` reads the config file (``KEY=VALUE`` lines; it needs
``IMEX_NODE_CONFIG_FILE``, the nodes file: one peer IP or host name a line), resolves
every peer (``getaddrinfo``), and runs in the foreground until SIGTERM/SIGINT. SIGUSR1
re-reads the nodes file and resolves again (recorded as ``reloaded`` with the peers).
Its state (pid, peers, start time, reload count) is kept in ``<config>.state``, which
``nvidia-imex-ctl -q [-c <config>]`` reads to answer ``READY`` (exit 0) or
``NOT_READY`` (exit 1): ready once the daemon runs and every peer resolved.

Switches (files next to the record):

* ``<record>.imex.fail``: an invocation whose space-joined argv contains one of its
  lines exits 1 with a message (``nvidia-imex -c`` to fail the daemon's start,
  ``nvidia-imex-ctl`` to fail the query);
* ``<record>.imex.hold``: while it exists, ``-q`` answers ``NOT_READY`` (an IMEX domain
  without quorum);
* ``<record>.imex.delay``: seconds after the daemon's start before ``-q`` answers ``READY``.

Emulation only: no IMEX protocol runs, no quorum is formed, no fabric handles move.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

IMEX = "nvidia-imex"
IMEX_CTL = "nvidia-imex-ctl"
DEFAULT_CONFIG = "/etc/nvidia-imex/config.cfg"
NODES_KEY = "IMEX_NODE_CONFIG_FILE"

_WRAPPER = """#!{python}
# Emulated {tool}: written by dra_driver.emulation.imextools.install
import importlib.util, sys
spec = importlib.util.spec_from_file_location("imextools", {module!r})
tools = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tools)
sys.exit(tools.main({tool!r}, {record!r}, sys.argv[1:]))
"""


def install(bin_dir: Path, record: Path, *, python: str = sys.executable) -> dict[str, Path]:
    """Write the emulated tools into ``bin_dir``; returns their paths by tool name."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    module = str(Path(__file__).resolve())
    paths: dict[str, Path] = {}
    for tool in (IMEX, IMEX_CTL):
        path = bin_dir / tool
        text = _WRAPPER.format(python=python, tool=tool, record=str(record), module=module)
        tmp = path.with_name(f".{tool}.tmp")
        tmp.write_text(text)
        tmp.chmod(0o755)
        tmp.replace(path)  # a daemon starting meanwhile runs the old or the new file
        paths[tool] = path
    return paths


def read_record(record: Path) -> list[dict[str, Any]]:
    """All recorded invocations and daemon events, oldest first."""
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text().splitlines() if line.strip()]


def state_file(config: Path) -> Path:
    return config.with_name(config.name + ".state")


def _append(record: Path, entry: dict[str, Any]) -> None:
    line = (json.dumps(entry, sort_keys=True) + "\n").encode()
    fd = os.open(record, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def _switch(record: Path, name: str) -> Path:
    return Path(f"{record}.imex.{name}")


def _injected_failure(record: Path, argv: list[str]) -> str | None:
    try:
        patterns = _switch(record, "fail").read_text().splitlines()
    except OSError:
        return None
    joined = " ".join(argv)
    return next((p for p in patterns if p and p in joined), None)


def read_config(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines; ``#`` comments and blank lines skipped."""
    out: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"{path}: line {raw!r} is not KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def _resolve(host: str) -> str | None:
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return None
    return str(infos[0][4][0]) if infos else None


def _peers(nodes_file: Path) -> list[dict[str, Any]]:
    hosts = [h.strip() for h in nodes_file.read_text().splitlines()]
    return [{"host": h, "address": _resolve(h)} for h in hosts if h and not h.startswith("#")]


def _config_arg(argv: list[str]) -> Path:
    if "-c" in argv:
        i = argv.index("-c")
        if i + 1 < len(argv):
            return Path(argv[i + 1])
    return Path(DEFAULT_CONFIG)


def main(tool: str, record_path: str, argv: list[str]) -> int:
    record = Path(record_path)
    _append(record, {"tool": tool, "argv": argv, "pid": os.getpid(), "time": time.time()})
    pattern = _injected_failure(record, [tool, *argv])
    if pattern is not None:
        print(f"{tool}: injected failure ({pattern})", file=sys.stderr)
        return 1
    config = _config_arg(argv)
    if tool == IMEX_CTL:
        if "-q" not in argv:
            print(f"{IMEX_CTL} (emulated): only -q is supported, got {argv}", file=sys.stderr)
            return 2
        ready = _ready(record, config)
        print("READY" if ready else "NOT_READY")
        return 0 if ready else 1
    try:
        settings = read_config(config)
        nodes = Path(settings[NODES_KEY])
        peers = _peers(nodes)
    except (OSError, ValueError, KeyError) as exc:
        print(f"{IMEX}: cannot read config {config}: {exc!r}", file=sys.stderr)
        return 1
    return _run_daemon(record, config, nodes, peers)


def _write_state(config: Path, state: dict[str, Any]) -> None:
    target = state_file(config)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(state, sort_keys=True))
    tmp.replace(target)


def _run_daemon(record: Path, config: Path, nodes: Path, peers: list[dict[str, Any]]) -> int:
    reload_wanted = False
    stop_wanted = False

    def on_usr1(_s: int, _f: object) -> None:
        nonlocal reload_wanted
        reload_wanted = True

    def on_stop(_s: int, _f: object) -> None:
        nonlocal stop_wanted
        stop_wanted = True

    signal.signal(signal.SIGUSR1, on_usr1)
    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    state: dict[str, Any] = {"pid": os.getpid(), "started": time.time(), "peers": peers,
                             "reloads": 0}  # fmt: skip
    _write_state(config, state)
    _append(record, {"tool": IMEX, "pid": os.getpid(), "event": "started", "peers": peers})
    while not stop_wanted:
        if reload_wanted:
            reload_wanted = False
            try:
                state["peers"] = _peers(nodes)
            except OSError as exc:
                print(f"{IMEX}: cannot read nodes file {nodes}: {exc}", file=sys.stderr)
                continue
            state["reloads"] = int(state["reloads"]) + 1
            _write_state(config, state)
            _append(record, {"tool": IMEX, "pid": os.getpid(), "event": "reloaded",
                             "peers": state["peers"]})  # fmt: skip
        time.sleep(0.02)
    _append(record, {"tool": IMEX, "pid": os.getpid(), "event": "terminated"})
    _remove_own_state(config)
    return 0


def _remove_own_state(config: Path) -> None:
    """The state file, unless a newer daemon on this config wrote it (a force-deleted
    daemon pod's ``nvidia-imex`` can stop after its successor started)."""
    try:
        owner = json.loads(state_file(config).read_text()).get("pid")
    except (OSError, ValueError):
        return
    if owner == os.getpid():
        state_file(config).unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _ready(record: Path, config: Path) -> bool:
    try:
        state = json.loads(state_file(config).read_text())
    except (OSError, ValueError):
        return False
    if not _alive(int(state["pid"])) or _switch(record, "hold").exists():
        return False
    try:
        delay = float(_switch(record, "delay").read_text())
    except (OSError, ValueError):
        delay = 0.0
    if time.time() < float(state["started"]) + delay:
        return False
    return all(p["address"] for p in state["peers"])
