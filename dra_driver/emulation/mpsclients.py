"""Emulated MPS limits as a CUDA client meets them: inherited defaults, tightened, never loosened.

The emulated control daemon (:mod:`~dra_driver.emulation.gputools`) keeps one
:class:`Daemon` and passes it every line that arrives on its ``control`` FIFO.
It remembers the default limits the driver sets, as the real daemon does:

* ``set_default_active_thread_percentage <pct>``
* ``set_default_device_pinned_mem_limit <GPU UUID or ordinal> <N>M`` (or ``<N>G``)

and serves an emulation-only client protocol, so that a plain ``sh`` (busybox)
in a container, which has the daemon's pipe directory at
``$CUDA_MPS_PIPE_DIRECTORY``, can act as a CUDA process. A client writes one
line per request to ``$CUDA_MPS_PIPE_DIRECTORY/control``:

``client <id> <CUDA_MPS_PINNED_DEVICE_MEM_LIMIT or -> <CUDA_MPS_ACTIVE_THREAD_PERCENTAGE or ->``
    connect, with the client's own variables (``-``: unset). The memory value is
    what CUDA takes: ``0=20G,1=512M`` per device ordinal, or one value for all.
``alloc <id> <MiB>``
    allocate device memory on ordinal 0; beyond the client's limit it fails with
    ``out of memory`` and allocates nothing (other clients are not affected).
``exit <id>``
    the client is gone (its memory freed, its answer file removed).

``<id>`` is 1-64 of ``[A-Za-z0-9._-]``. The daemon answers by rewriting
``$CUDA_MPS_PIPE_DIRECTORY/clients/<id>`` (atomically: temp file, rename) with
``key=value`` lines::

    daemon=<pid of the control daemon>
    memory_limit_mib=<N or unlimited>
    active_thread_percentage=<1..100>
    allocated_mib=<N>
    last=<connected | allocated <MiB> | out of memory: <MiB> more than the <N> MiB left>

The effective limits are the smaller of the daemon's default and the client's
request (a client can only tighten what it inherits); no default and no request
is unlimited (memory) or 100 (percent). Lines that are no client request are
ignored here (the daemon records them all).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
_AMOUNT = re.compile(r"(\d+)([MG]?)", re.IGNORECASE)


def _mib(text: str) -> int | None:
    m = _AMOUNT.fullmatch(text.strip())
    if m is None:
        return None
    return int(m.group(1)) * (1024 if m.group(2).upper() == "G" else 1)


def _smaller(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


@dataclass
class Client:
    memory_mib: int | None
    """Effective limit on ordinal 0; None: unlimited."""
    percent: int
    allocated_mib: int = 0
    last: str = "connected"


class Daemon:
    """One emulated control daemon's limits and clients."""

    def __init__(self, pipe_dir: Path, visible_devices: str) -> None:
        self.pipe_dir = pipe_dir
        self.uuids = [u for u in visible_devices.split(",") if u]
        self.default_percent: int | None = None
        self.default_memory: dict[int, int] = {}
        """MiB by device ordinal (a UUID is turned into its ordinal)."""
        self.clients: dict[str, Client] = {}

    def handle(self, line: str) -> None:
        words = line.split()
        if not words:
            return
        op, args = words[0], words[1:]
        if op == "set_default_active_thread_percentage" and len(args) == 1:
            if args[0].isdigit():
                self.default_percent = int(args[0])
        elif op == "set_default_device_pinned_mem_limit" and len(args) == 2:
            ordinal = self._ordinal(args[0])
            mib = _mib(args[1])
            if ordinal is not None and mib is not None:
                self.default_memory[ordinal] = mib
        elif op in ("client", "alloc", "exit") and args and _ID.fullmatch(args[0]):
            self._client_request(op, args[0], args[1:])

    def _ordinal(self, device: str) -> int | None:
        if device.isdigit():
            return int(device)
        return self.uuids.index(device) if device in self.uuids else None

    def _client_request(self, op: str, cid: str, args: list[str]) -> None:
        if op == "client" and len(args) == 2:
            memory, percent = args
            self.clients[cid] = Client(
                memory_mib=_smaller(self.default_memory.get(0), _client_memory(memory)),
                percent=min(self.default_percent or 100, _client_percent(percent)),
            )
        elif op == "alloc" and len(args) == 1 and args[0].isdigit() and cid in self.clients:
            client, want = self.clients[cid], int(args[0])
            left = None if client.memory_mib is None else client.memory_mib - client.allocated_mib
            if left is not None and want > left:
                client.last = f"out of memory: {want} MiB more than the {left} MiB left"
            else:
                client.allocated_mib += want
                client.last = f"allocated {want}"
        elif op == "exit":
            self.clients.pop(cid, None)
            (self.pipe_dir / "clients" / cid).unlink(missing_ok=True)
            return
        else:
            return
        self._answer(cid)

    def _answer(self, cid: str) -> None:
        client = self.clients[cid]
        limit = "unlimited" if client.memory_mib is None else str(client.memory_mib)
        text = (
            f"daemon={os.getpid()}\nmemory_limit_mib={limit}\n"
            f"active_thread_percentage={client.percent}\n"
            f"allocated_mib={client.allocated_mib}\nlast={client.last}\n"
        )
        folder = self.pipe_dir / "clients"
        folder.mkdir(exist_ok=True)
        tmp = folder / f".{cid}.tmp"
        tmp.write_text(text)
        tmp.replace(folder / cid)


def _client_memory(value: str) -> int | None:
    """``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` for ordinal 0: ``0=20G,1=1G`` or ``20G``."""
    if value == "-":
        return None
    for item in value.split(","):
        device, sep, amount = item.partition("=")
        if not sep:
            return _mib(device)
        if device.strip() == "0":
            return _mib(amount)
    return None


def _client_percent(value: str) -> int:
    return int(value) if value.isdigit() and 0 < int(value) <= 100 else 100
