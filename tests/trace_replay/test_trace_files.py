"""The trace's CSV files: the published ones read as their README describes, and bad
rows refused with the file, line and column named."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

from bench.trace_replay.__main__ import main
from dra_driver.workload.trace import (
    NODES_FILE,
    PODS_FILE,
    TRACE_DIR_ENV,
    TraceError,
    default_trace_dir,
    read_nodes,
    read_pods,
)

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"
POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
    "deletion_time,scheduled_time"
)


def trace_dir() -> Path:
    """``$DRA_TRACE_DIR``, else ``../shared/traces/alibaba-gpu-v2023`` beside the repo."""
    path = Path(os.environ.get(TRACE_DIR_ENV) or default_trace_dir())
    if not (path / NODES_FILE).is_file():
        pytest.fail(f"the Alibaba trace is not at {path} (set {TRACE_DIR_ENV})", pytrace=False)
    return path


def test_published_trace_reads_as_its_readme_describes() -> None:
    nodes = read_nodes(trace_dir() / NODES_FILE)
    pods = read_pods(trace_dir() / PODS_FILE)
    assert (len(nodes), sum(n.gpus for n in nodes)) == (1523, 6212)
    assert sum(1 for n in nodes if not n.gpus) == 310
    assert {n.model for n in nodes if n.gpus} == {"G2", "G3", "T4", "P100", "V100M16",
                                                   "V100M32", "A10"}  # fmt: skip
    assert len(pods) == 8152
    assert Counter(p.num_gpu for p in pods) == {0: 1088, 1: 6989, 2: 16, 4: 15, 8: 44}
    assert sum(1 for p in pods if p.is_share) == 3078


def _write(tmp_path: Path, header: str, *rows: str) -> Path:
    path = tmp_path / "list.csv"
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


GOOD_POD = "p0,6000,12288,1,460,,LS,Running,0,10,0"


@pytest.mark.parametrize(
    ("row", "line", "column", "problem"),
    [
        ("p1,6000,12288,1,1200,,LS,Running,0,10,0", 3, "gpu_milli", "outside 0..1000"),
        ("p1,6000,12288,1,0,,LS,Running,0,10,0", 3, "gpu_milli", "0 for a pod with num_gpu 1"),
        ("p1,6000,12288,0,300,,LS,Running,0,10,0", 3, "gpu_milli", "300 for a pod with num_gpu 0"),
        ("p1,six,12288,1,460,,LS,Running,0,10,0", 3, "cpu_milli", "'six' is not a whole number"),
        ("p1,6000,12288,-1,460,,LS,Running,0,10,0", 3, "num_gpu", "outside 0..64"),
        ("p0,6000,12288,1,460,,LS,Running,0,10,0", 3, "name", "'p0' appears twice"),
        ("p1,6000,12288,1,460", 3, "*", "11 fields expected"),
    ],
    ids=["share-over-one-gpu", "gpu-pod-asking-nothing", "cpu-pod-with-a-share",
         "cpu-not-a-number", "negative-gpus", "duplicate-name", "short-row"],
)  # fmt: skip
def test_bad_pod_rows_are_refused_naming_file_line_and_column(
    tmp_path: Path, row: str, line: int, column: str, problem: str
) -> None:
    path = _write(tmp_path, POD_HEADER, GOOD_POD, row)
    with pytest.raises(TraceError) as err:
        read_pods(path)
    assert (err.value.path, err.value.line, err.value.column) == (path, line, column)
    assert str(err.value).startswith(f"{path}:{line}: column {column}: ")
    assert problem in str(err.value)


@pytest.mark.parametrize(
    ("row", "column", "problem"),
    [
        ("n1,32000,262144,2,", "model", "empty for a node with 2 GPUs"),
        ("n1,32000,262144,0,T4", "model", "'T4' given for a node with 0 GPUs"),
        ("n1,0,262144,0,", "cpu_milli", "outside 1..10000000"),
        ("n1,32000,262144,2.5,T4", "gpu", "'2.5' is not a whole number"),
    ],
    ids=["gpus-without-model", "model-without-gpus", "no-cpu", "fractional-gpus"],
)
def test_bad_node_rows_are_refused_naming_the_column(
    tmp_path: Path, row: str, column: str, problem: str
) -> None:
    path = _write(tmp_path, NODE_HEADER, "n0,64000,262144,2,P100", row)
    with pytest.raises(TraceError, match=rf":3: column {column}: .*{problem}"):
        read_nodes(path)


def test_a_file_of_another_format_fails_on_its_header(tmp_path: Path) -> None:
    path = _write(tmp_path, "sn,cpu,memory,gpu,model", "n0,64,256,2,P100")
    with pytest.raises(TraceError, match=r":1: column cpu_milli,memory_mib: missing"):
        read_nodes(path)


def test_an_empty_list_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no pods"):
        read_pods(_write(tmp_path, POD_HEADER))


def test_gpu_spec_lists_models_and_multi_gpu_pods_count_whole_gpus(tmp_path: Path) -> None:
    path = _write(tmp_path, POD_HEADER, "p0,1000,1024,1,250,V100M16|V100M32,LS,Running,0,1,0",
                  "p1,1000,1024,8,0,,LS,Running,0,1,0")  # fmt: skip
    share, eight = read_pods(path)
    assert share.gpu_spec == ("V100M16", "V100M32")
    assert (share.kind, share.gpu_request_milli) == ("share", 250)
    assert (eight.kind, eight.gpu_milli, eight.gpu_request_milli) == ("8", 1000, 8000)


def test_command_refuses_bad_input_before_starting_a_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = _write(tmp_path, NODE_HEADER, "n0,64000,262144,2,P100", "n1,64000,262144,x,P100")
    assert main(["--mode", "halves"]) == 2
    assert "mode 'halves' is unknown; known: whole, consumable, slots" in capsys.readouterr().err
    assert main(["--mode", "whole", "--nodes", str(nodes)]) == 2
    assert f"{nodes}:3: column gpu: 'x' is not a whole number" in capsys.readouterr().err
