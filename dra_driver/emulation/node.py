"""An emulated GPU node: host tree on disk plus an NVML library to install into ``pynvml``.

Usage::

    node = EmulatedNode.create("dgx-a100-mig", tmp_path)
    with node.nvml():
        inventory = discover(node.host, logger)

:meth:`EmulatedNode.nvml` swaps ``pynvml.nvmlLib`` for the emulated library
and clears the binding's function-pointer cache, then restores both (and the
binding's init refcount) on exit, so nothing leaks into the next test and a
real GPU node is unaffected. It is not re-entrant across different nodes: the
binding holds one library per process.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_driver.emulation.hardware import EmulatedProfile
from dra_driver.emulation.hosttree import (
    LAYOUTS,
    remove_gpu_files,
    write_host_tree,
    write_process_cgroup,
)
from dra_driver.emulation.library import EmulatedNvmlLibrary
from dra_driver.emulation.migstate import STATE_FILE as MIG_STATE_FILE
from dra_driver.emulation.migstate import MigState
from dra_driver.emulation.profile import load_profile
from dra_driver.emulation.runtime import CONTROL_FILE, RECOVERY_ACTIONS, append_op, check_op
from dra_driver.gpu.host.hostpaths import HostPaths

PROFILE_FILE = Path("emulation/profile.yaml")
"""Copy of the profile YAML inside the emulated root, for emulated tools run as subprocesses."""

UNPLUGGED_FILE = Path("emulation/unplugged")
"""Profile indexes of GPUs unplugged at run time, one per line."""

_install_lock = threading.Lock()


@dataclass
class EmulatedNode:
    profile: EmulatedProfile
    host: HostPaths
    library: EmulatedNvmlLibrary

    @classmethod
    def create(
        cls,
        profile: str | Path | EmulatedProfile,
        root: Path,
        *,
        call_delays: dict[str, float] | None = None,
    ) -> EmulatedNode:
        """Write the node's files under ``root`` (created if missing) for a profile name or file.

        ``root`` may be empty, missing, or an earlier emulated node (refreshed in place:
        MIG instances created since survive, as they survive a plugin restart on a real
        node); anything else with a ``sys/`` directory is refused so a real host is never
        touched. ``call_delays`` replaces the profile's ``callDelays``.
        """
        loaded = profile if isinstance(profile, EmulatedProfile) else load_profile(profile)
        root = Path(root)
        if (root / "sys").exists() and not (root / PROFILE_FILE).exists():
            raise FileExistsError(
                f"{root} holds a sys/ tree that is not an emulated node; refusing to write an "
                "emulated node over what may be a real host root"
            )
        # The profile first: it marks the root as an emulated node, so a start killed
        # while writing the tree leaves one the next start refreshes, not refuses.
        profile_file = root / PROFILE_FILE
        profile_file.parent.mkdir(parents=True, exist_ok=True)
        profile_file.write_text(loaded.source)
        host = write_host_tree(loaded, root)
        (host.root / UNPLUGGED_FILE).unlink(missing_ok=True)
        mig = MigState(
            loaded,
            path=host.root / MIG_STATE_FILE,
            host=host,
            device_node_delay=loaded.device_node_delay,
        )
        mig.sync_host()
        library = EmulatedNvmlLibrary(loaded, mig, control_file=host.root / CONTROL_FILE)
        if call_delays is not None:
            library.delays = dict(call_delays)
        return cls(profile=loaded, host=host, library=library)

    @property
    def mig(self) -> MigState:
        """The GPU and compute instances that exist now (shared with other processes)."""
        return self.library.mig

    @property
    def bin_dir(self) -> Path:
        """Where GPU tools (``nvidia-smi``, MPS control) live; emulated tools are written here."""
        return self.host.driver(LAYOUTS[self.profile.driver_layout].bin_dir)

    @property
    def profile_file(self) -> Path:
        return self.host.root / PROFILE_FILE

    def remove_gpu(self, index: int) -> None:
        """Hot-unplug the GPU with this profile index: NVML and the host tree stop showing it.

        Also recorded in ``emulation/unplugged`` so another process emulating the same
        root (a plugin under test) applies it on its next :meth:`sync`.
        """
        self.library.remove_gpu(index)
        remove_gpu_files(self.host, self.profile.gpus[index])
        unplugged = self.host.root / UNPLUGGED_FILE
        with unplugged.open("a") as out:
            out.write(f"{index}\n")

    def sync(self) -> None:
        """Apply unplugs recorded by other processes (see :meth:`remove_gpu`)."""
        unplugged = self.host.root / UNPLUGGED_FILE
        if unplugged.exists():
            for line in unplugged.read_text().split():
                index = int(line)
                if 0 <= index < len(self.profile.gpus):
                    self.library.remove_gpu(index)

    # ---- hardware events and state (also seen by other processes emulating this root) ----
    def control(self, op: dict[str, Any]) -> None:
        """Append a control operation (:func:`~.runtime.check_op`) and apply it here now.

        A plugin process emulating the same root applies it on its next NVML call
        (within ~20 ms while it waits for events).
        """
        check_op(op, len(self.profile.gpus))
        append_op(self.host.root / CONTROL_FILE, op)
        self.library.runtime(op["gpu"])  # reads the file: applied once, in order

    def inject_xid(
        self, gpu: int, xid: int, *, gi: int | None = None, ci: int | None = None
    ) -> None:
        """An Xid error event on a GPU (profile index), or on one of its MIG devices."""
        op: dict[str, Any] = {"op": "xid", "gpu": gpu, "xid": xid}
        if gi is not None:
            op |= {"gi": gi, "ci": ci}
        self.control(op)

    def inject_double_bit_ecc(self, gpu: int) -> None:
        self.control({"op": "ecc", "gpu": gpu})

    def set_recovery_action(self, gpu: int, action: str) -> None:
        """What NVML says must happen before the GPU is usable again (``none`` when done)."""
        self.control({"op": "recovery", "gpu": gpu, "action": RECOVERY_ACTIONS[action]})

    def set_lost(self, gpu: int, lost: bool = True) -> None:
        """The GPU fell off the bus (every query answers GPU_IS_LOST), or came back."""
        self.control({"op": "lost", "gpu": gpu, "lost": lost})

    def reset_gpu(self, gpu: int) -> None:
        """A GPU reset: reachable again, no recovery pending, volatile ECC cleared, no processes."""
        self.control({"op": "reset", "gpu": gpu})

    def set_processes(
        self, gpu: int, processes: list[dict[str, Any]], pods: dict[int, str] | None = None
    ) -> None:
        """The CUDA processes now on a GPU: ``{pid, usedMiB, smUtil, memUtil, gi?, ci?}``;
        ``pods`` maps PIDs to the pod UID whose cgroup they run in (``/proc/<pid>/cgroup``)."""
        op = check_op({"op": "processes", "gpu": gpu, "processes": processes},
                      len(self.profile.gpus))  # fmt: skip
        for p in processes:
            write_process_cgroup(self.host, int(p["pid"]), (pods or {}).get(int(p["pid"])))
        self.control(op)

    def reboot(self) -> str:
        """Give the node a new boot ID (what a reboot changes for checkpoints); returns it."""
        boot_id = str(uuid.uuid4())
        self.host.proc("sys", "kernel", "random", "boot_id").write_text(boot_id + "\n")
        self.library.mig.reset()  # GPU instances do not survive a reboot
        self.library.mig.sync_host()
        return boot_id

    @contextmanager
    def nvml(self) -> Iterator[EmulatedNvmlLibrary]:
        """Install the emulated library into ``pynvml`` for the duration of the block."""
        import pynvml

        with _install_lock:
            if isinstance(pynvml.nvmlLib, EmulatedNvmlLibrary):
                raise RuntimeError("another emulated NVML library is already installed")
            saved_lib = pynvml.nvmlLib
            saved_cache = dict(pynvml._nvmlGetFunctionPointer_cache)
            saved_refcount = pynvml._nvmlLib_refcount
            pynvml._nvmlGetFunctionPointer_cache.clear()
            pynvml.nvmlLib = self.library
        try:
            yield self.library
        finally:
            with _install_lock:
                pynvml.nvmlLib = saved_lib
                pynvml._nvmlGetFunctionPointer_cache.clear()
                pynvml._nvmlGetFunctionPointer_cache.update(saved_cache)
                pynvml._nvmlLib_refcount = saved_refcount
