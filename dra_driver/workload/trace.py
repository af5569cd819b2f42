"""The trace's two CSV files as plain rows, checked field by field.

Columns are those of Alibaba's ``cluster-trace-gpu-v2023`` ("openb"):

* nodes: ``sn, cpu_milli, memory_mib, gpu, model``
* pods: ``name, cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec, qos, pod_phase,
  creation_time, deletion_time, scheduled_time``

Only the columns the replay needs are kept; the others must be present (a file of
another format fails on its header, not half way through) but are not interpreted.
Every error names the file, the line (1 is the header), the column and what is allowed,
because the files are meant to be swapped for other traces of the same format.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = (
    "name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos",
    "pod_phase", "creation_time", "deletion_time", "scheduled_time",
)  # fmt: skip
MAX_GPUS = 64
"""Upper bound for ``gpu``/``num_gpu``: the trace has at most 8; larger is a typo."""


class TraceError(ValueError):
    """A row or header of a trace file is not what the replay can use."""

    def __init__(self, path: Path, line: int, column: str, problem: str) -> None:
        super().__init__(f"{path}:{line}: column {column}: {problem}")
        self.path = path
        self.line = line
        self.column = column


@dataclass(frozen=True)
class TraceNode:
    """One machine of the cluster."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str
    """The trace's GPU model code (``T4``, ``G2``...); empty for a CPU-only node."""


@dataclass(frozen=True)
class TracePod:
    """One pod of the workload, as requested."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    """Share of ONE GPU, 1..1000, when ``num_gpu == 1``; the file's value is ignored
    (set to 1000) for more GPUs, as the trace's README says it is meaningless there."""
    gpu_spec: tuple[str, ...]
    """Model codes the pod may run on (``|``-separated in the file); empty: any."""

    @property
    def gpu_request_milli(self) -> int:
        """GPU capacity asked for, in thousandths of a GPU (what the protocol sums)."""
        return self.gpu_milli if self.num_gpu == 1 else 1000 * self.num_gpu

    @property
    def is_share(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < 1000

    @property
    def kind(self) -> str:
        """The class unschedulable pods are counted by: ``cpu``, ``share``, ``1``..``8``."""
        if self.num_gpu == 0:
            return "cpu"
        return "share" if self.is_share else str(self.num_gpu)


def _rows(path: Path, columns: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        missing = [c for c in columns if c not in header]
        if missing:
            raise TraceError(path, 1, ",".join(missing), f"missing from header {header}")
        for row in reader:
            if None in row or any(v is None for v in row.values()):
                raise TraceError(
                    path, reader.line_num, "*", f"{len(header)} fields expected per row"
                )
            yield reader.line_num, row


def _int(path: Path, line: int, row: dict[str, str], column: str, lo: int, hi: int) -> int:
    text = row[column].strip()
    try:
        value = int(text)
    except ValueError:
        raise TraceError(path, line, column, f"{text!r} is not a whole number") from None
    if not lo <= value <= hi:
        raise TraceError(path, line, column, f"{value} is outside {lo}..{hi}")
    return value


def _name(path: Path, line: int, row: dict[str, str], column: str, seen: set[str]) -> str:
    name = row[column].strip()
    if not name:
        raise TraceError(path, line, column, "empty")
    if name in seen:
        raise TraceError(path, line, column, f"{name!r} appears twice")
    seen.add(name)
    return name


def read_nodes(path: Path) -> list[TraceNode]:
    """The node list; raises TraceError on the first bad row (or an empty list)."""
    nodes: list[TraceNode] = []
    seen: set[str] = set()
    for line, row in _rows(path, NODE_COLUMNS):
        gpus = _int(path, line, row, "gpu", 0, MAX_GPUS)
        model = row["model"].strip()
        if gpus and not model:
            raise TraceError(path, line, "model", f"empty for a node with {gpus} GPUs")
        if model and not gpus:
            raise TraceError(path, line, "model", f"{model!r} given for a node with 0 GPUs")
        nodes.append(
            TraceNode(
                name=_name(path, line, row, "sn", seen),
                cpu_milli=_int(path, line, row, "cpu_milli", 1, 10**7),
                memory_mib=_int(path, line, row, "memory_mib", 1, 10**9),
                gpus=gpus,
                model=model,
            )
        )
    if not nodes:
        raise TraceError(path, 2, "*", "no nodes")
    return nodes


def read_pods(path: Path) -> list[TracePod]:
    """The pod list; raises TraceError on the first bad row (or an empty list)."""
    pods: list[TracePod] = []
    seen: set[str] = set()
    for line, row in _rows(path, POD_COLUMNS):
        num_gpu = _int(path, line, row, "num_gpu", 0, MAX_GPUS)
        milli = _int(path, line, row, "gpu_milli", 0, 1000)
        if num_gpu == 1 and milli == 0:
            raise TraceError(path, line, "gpu_milli", "0 for a pod with num_gpu 1; want 1..1000")
        if num_gpu == 0 and milli:
            raise TraceError(path, line, "gpu_milli", f"{milli} for a pod with num_gpu 0")
        spec = tuple(s.strip() for s in row["gpu_spec"].split("|") if s.strip())
        pods.append(
            TracePod(
                name=_name(path, line, row, "name", seen),
                cpu_milli=_int(path, line, row, "cpu_milli", 0, 10**7),
                memory_mib=_int(path, line, row, "memory_mib", 0, 10**9),
                num_gpu=num_gpu,
                gpu_milli=milli if num_gpu <= 1 else 1000,
                gpu_spec=spec,
            )
        )
    if not pods:
        raise TraceError(path, 2, "*", "no pods")
    return pods


TRACE_DIR_ENV = "DRA_TRACE_DIR"
NODES_FILE = "openb_node_list_all_node.csv"
PODS_FILE = "openb_pod_list_default.csv"


def default_trace_dir() -> Path:
    """Where the trace's README says it lives in a checkout: ``../shared/traces/``
    beside the repository root (the directory above the ``dra_driver`` package)."""
    return Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "alibaba-gpu-v2023"


def trace_files(
    trace_dir: Path | None, nodes: Path | None, pods: Path | None, env_dir: str | None
) -> tuple[Path, Path]:
    """The node and pod lists: given ones first, then those of ``trace_dir``, of the
    environment's ``$DRA_TRACE_DIR`` (``env_dir``), or of :func:`default_trace_dir`."""
    base = trace_dir or (Path(env_dir) if env_dir else default_trace_dir())
    return nodes or base / NODES_FILE, pods or base / PODS_FILE
