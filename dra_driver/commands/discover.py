"""``dra-driver discover``: show what this node's GPUs look like to the driver.

Runs the same discovery the kubelet plugin runs, with real NVML or on an
emulated node (``--emulate dgx-a100`` or a profile YAML), and prints a table,
JSON or YAML. :func:`gpu_host` is shared by the ``slices`` and
``kubelet-plugin`` commands: it yields the host paths with NVML ready.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dra_driver.settings import HostSettings, host_settings

if TYPE_CHECKING:
    from dra_driver.emulation import EmulatedNode
    from dra_driver.gpu.hardware.inventory import Inventory
    from dra_driver.gpu.host.hostpaths import HostPaths


logger = logging.getLogger(__name__)


def add_host_arguments(parser: argparse.ArgumentParser) -> None:
    """``--emulate``, ``--host-root``, ``--driver-root``."""
    parser.add_argument(
        "--emulate",
        metavar="PROFILE",
        default=None,
        help="emulate a GPU node: built-in profile (dgx-a100, dgx-a100-mig, dgx-a100-mig-on, "
        "dgx-h100, h100-l4-mixed, h200, l4-x4, t4, a100-pcie-nvlink, hgx-h100-fabric, "
        "hgx-h100-fabric-clique8, hgx-h100-no-clique) or a profile YAML file; no GPU or "
        "driver needed",
    )
    parser.add_argument(
        "--host-root",
        type=Path,
        default=Path("/"),
        help="where the host's /sys, /proc and /dev are (default /). With --emulate: the "
        "emulated node's files are written here (default: a temp dir)",
    )
    parser.add_argument(
        "--driver-root",
        type=Path,
        default=None,
        help="root of the NVIDIA driver installation, e.g. /run/nvidia/driver with the GPU "
        "operator (default: the first of /, /run/nvidia/driver, /usr/local/nvidia, "
        "/home/kubernetes/bin/nvidia that holds libnvidia-ml.so.<version> as a file; the "
        "emulated one with --emulate)",
    )


@contextmanager
def gpu_host(settings: HostSettings) -> Iterator[tuple[HostPaths, EmulatedNode | None]]:
    """Host paths with NVML usable: real, or an emulated node installed into pynvml."""
    from dra_driver.gpu.host.hostpaths import HostPaths, find_driver_root

    with ExitStack() as stack:
        if settings.emulate is None:
            root = settings.host_root
            driver_root = settings.driver_root or find_driver_root(HostPaths(root=root))
            yield HostPaths(root=root, driver_root=driver_root or root), None
            return
        from dra_driver.emulation import EmulatedNode

        root = settings.host_root
        if root == Path("/"):  # never write an emulated tree over the real host
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dra-emulated-")))
        node = EmulatedNode.create(settings.emulate, root)
        stack.enter_context(node.nvml())
        host = node.host
        if settings.driver_root is not None:
            host = HostPaths(root=host.root, driver_root=settings.driver_root)
        yield host, node


def install_emulated_tools(node: EmulatedNode) -> None:
    """Emulated nvidia-smi / MPS control in the emulated driver root, unless already there
    (the daemon's call: this module is the one place outside tests that reaches the
    emulator)."""
    from dra_driver.emulation import gputools

    bin_dir = node.bin_dir
    record = node.host.root / "emulation" / "tools.jsonl"
    smi = bin_dir / gputools.NVIDIA_SMI
    if smi.exists() and "gputools" in smi.read_text(errors="replace"):
        return
    record.parent.mkdir(parents=True, exist_ok=True)
    gputools.install(bin_dir, record)


def install_emulated_imex_tools(node: EmulatedNode) -> None:
    """Emulated nvidia-imex / nvidia-imex-ctl in the emulated driver root, for the
    ComputeDomain daemons (``compute-domain-plugin``'s call); their record is
    ``<root>/emulation/imex.jsonl``."""
    from dra_driver.emulation import imextools

    record = node.host.root / "emulation" / "imex.jsonl"
    record.parent.mkdir(parents=True, exist_ok=True)
    imextools.install(node.bin_dir, record)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_host_arguments(parser)
    parser.add_argument(
        "-o",
        "--output",
        choices=("table", "json", "yaml"),
        default="table",
        help="output format (default: a readable table)",
    )


def _plain(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def inventory_data(inventory: Inventory) -> dict[str, Any]:
    data: dict[str, Any] = _plain(dataclasses.asdict(inventory))
    for gpu, raw in zip(inventory.gpus, data["gpus"], strict=True):
        raw["degraded"] = gpu.degraded
    return data


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f}Gi" if n else "-"


def render_table(inventory: Inventory) -> str:
    major, minor = inventory.cuda_driver_version
    count = len(inventory.gpus)
    lines = [f"NVIDIA driver {inventory.driver_version}, CUDA {major}.{minor}, {count} GPU(s)"]
    header = ("IDX", "MINOR", "PRODUCT", "MEMORY", "SMS", "CC", "NUMA", "PCI", "PCIE ROOT", "LINK",
              "MIG", "STATUS")  # fmt: skip
    rows: list[tuple[str, ...]] = [header]
    for g in inventory.gpus:
        link = (
            f"gen{g.pci.pcie_generation}x{g.pci.pcie_link_width}" if g.pci.pcie_generation else "-"
        )
        mig = (
            "-"
            if not g.mig_capable
            else (f"on({len(g.mig_instances)})" if g.mig_enabled else "off")
        )
        status = (
            "DEGRADED: " + (g.error or "") if g.degraded else ("ok" if not g.warnings else "ok*")
        )
        rows.append((
            str(g.index), str(g.minor), g.product_name or "?", _gib(g.memory_bytes),
            str(g.multiprocessors or "-"), "{}.{}".format(*g.cuda_compute_capability),
            "-" if g.pci.numa_node is None else str(g.pci.numa_node), g.pci.bus_id or "?",
            g.pci.pcie_root or "-", link, mig, status,
        ))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]

    def line(row: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[-1]

    lines.append(line(header))
    for gpu, row in zip(inventory.gpus, rows[1:], strict=True):
        lines.append(line(row))
        for m in gpu.mig_instances:
            last = m.placement.start + m.placement.size - 1
            lines.append(
                f"    MIG {m.profile.name:<11} gi={m.gi_id:<2} ci={m.ci_id} "
                f"slices={m.placement.start}-{last} {_gib(m.profile.memory_bytes)} "
                f"{m.profile.multiprocessors} SMs  {m.uuid}"
            )
        lines += [f"    * {warning}" for warning in gpu.warnings]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    from dra_driver.gpu.hardware.discovery import discover

    try:
        with gpu_host(host_settings(args)) as (host, _node):
            inventory = discover(host, logger)
    except FileExistsError as exc:
        print(f"dra-driver discover: {exc}", file=sys.stderr)
        return 1
    if args.output == "json":
        sys.stdout.write(json.dumps(inventory_data(inventory), indent=2) + "\n")
    elif args.output == "yaml":
        import yaml

        sys.stdout.write(yaml.safe_dump(inventory_data(inventory), sort_keys=False))
    else:
        sys.stdout.write(render_table(inventory))
    return 0
