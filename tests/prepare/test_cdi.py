"""CDI rules: schema, minimum version, names, atomic write, unwritable and full directories."""

from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path

import jsonschema
import pytest

from dra_driver.gpu.cdi import spec as cdi
from dra_driver.gpu.cdi.spec import CdiDevice, CdiError, ContainerEdits, DeviceNode, Mount, Spec
from dra_driver.plugin.claims import PrepareError
from tests.prepare.hosttree import Node, claim

SCHEMA = json.loads((Path(__file__).parents[2] / "cdi" / "schema.json").read_text())
ENV = ContainerEdits(env=("A=1",))


def spec_of(*names: str, kind: str = "vendor.com/gpu", edits: ContainerEdits = ENV, **kw) -> Spec:
    return Spec(kind=kind, devices=tuple(CdiDevice(n, edits) for n in names), **kw)


@pytest.mark.parametrize(
    ("spec", "version"),
    [
        (spec_of("gpu0"), "0.3.0"),
        (spec_of("gpu0", edits=ContainerEdits(mounts=(Mount("/a", "/b", type="bind"),))), "0.4.0"),
        (spec_of("0abc"), "0.5.0"),
        (
            spec_of(
                "gpu0", edits=ContainerEdits(device_nodes=(DeviceNode("/dev/x", host_path="/h"),))
            ),
            "0.5.0",
        ),
        (spec_of("gpu0", kind="vendor.com/gpu.v2"), "0.6.0"),
        (spec_of("gpu0", annotations={"a.b/c": "d"}), "0.6.0"),
        (spec_of("0abc", edits=ContainerEdits(additional_gids=(44,))), "0.7.0"),
    ],
    ids=[
        "baseline",
        "mount-type",
        "leading-digit",
        "hostPath",
        "dot-in-class",
        "annotations",
        "gids",
    ],
)
def test_minimum_version_is_the_lowest_that_expresses_the_content(spec: Spec, version: str) -> None:
    assert cdi.minimum_version(spec) == version
    data = json.loads(cdi.encode(spec))
    assert data["cdiVersion"] == version
    jsonschema.validate(data, SCHEMA)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (spec_of("gpu0", kind="vendor.com"), "exactly one '/'"),
        (spec_of("gpu0", kind="vendor.com/a/b"), "exactly one '/'"),
        (spec_of("gpu0", kind="1vendor.com/gpu"), "vendor must start with a letter"),
        (spec_of("gpu0", kind="vendor.com/gpu-"), "class must start with a letter"),
        (spec_of("-gpu"), "must start and end with a letter or digit"),
        (spec_of("gpu/0"), "must start and end with a letter or digit"),
        (spec_of("a", "a"), "duplicate device name"),
        (Spec(kind="vendor.com/gpu", devices=()), "at least one device"),
        (spec_of("gpu0", edits=ContainerEdits()), "must not be empty"),
        (spec_of("gpu0", edits=ContainerEdits(env=("=x",))), "must be NAME=value"),
        (
            spec_of(
                "gpu0", edits=ContainerEdits(device_nodes=(DeviceNode("/d", permissions="rwx"),))
            ),
            "r, w, m or none",
        ),
    ],
)
def test_invalid_specs_are_refused_before_writing(spec: Spec, message: str, tmp_path: Path) -> None:
    with pytest.raises(CdiError, match=message):
        cdi.write_spec(tmp_path, "uid", spec)
    assert list(tmp_path.iterdir()) == []


def test_spec_bytes_with_remembered_edits_are_the_plain_encoding() -> None:
    """The spec-level edits' JSON and checks are made once per (frozen) edits object:
    the bytes stay those of encoding the whole spec, each object answers for itself,
    and a bad one is refused with its place named however often it is used."""
    common = ContainerEdits(
        env=("NVIDIA_VISIBLE_DEVICES=void",),
        mounts=(Mount("/h/libcuda.so", "/usr/lib/libcuda.so", ("ro",)),),
    )
    other = ContainerEdits(mounts=(Mount("/h/x", "/x", type="bind"),))
    node = ContainerEdits(device_nodes=(DeviceNode("/dev/nvidia0"),))
    for edits in (common, common, other, ContainerEdits()):
        spec = Spec(kind="k8s.gpu.nvidia.com/claim", devices=(CdiDevice("u-gpu-0", node),),
                    edits=edits)  # fmt: skip
        plain = (json.dumps(spec.to_json(), separators=(",", ":")) + "\n").encode()
        assert cdi.encode(spec) == plain
    assert json.loads(cdi.encode(Spec(kind="v.com/gpu", devices=(CdiDevice("a", node),),
                                      edits=other)))["cdiVersion"] == "0.4.0"  # fmt: skip
    bad = ContainerEdits(env=("=x",))
    for _ in range(2):
        with pytest.raises(CdiError, match=r"^containerEdits\.env: '=x' must be NAME=value"):
            cdi.encode(Spec(kind="v.com/gpu", devices=(CdiDevice("a", node),), edits=bad))


def test_schema_rejects_what_the_loader_rejects() -> None:
    good = json.loads(cdi.encode(spec_of("gpu0")))
    for bad in (
        {**good, "unknown": 1},
        {**good, "devices": []},
        {**good, "devices": [{"name": "x", "containerEdits": {}}]},
        {**good, "devices": [{"name": "x-", "containerEdits": {"env": ["A=1"]}}]},
        {**good, "kind": "nokind"},
        {**good, "cdiVersion": "0.2.0"},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, SCHEMA)


def test_generated_claim_spec_matches_schema_and_name_rules(node: Node) -> None:
    uid = "0a1b2c3d-0000-4000-8000-000000000009"
    node.preparer().prepare(
        claim(uid=uid, devices=[("g", "gpu-0"), ("m", "gpu-7-mig-1g10gb-19-2")])
    )
    [path] = node.cdi_dir.glob("*.json")
    assert path.name == f"k8s.gpu.nvidia.com-claim_{uid}.json"
    data = json.loads(path.read_text())
    jsonschema.validate(data, SCHEMA)
    names = [d["name"] for d in data["devices"]]
    assert names == [f"{uid}-gpu-0", f"{uid}-gpu-7-mig-1g10gb-19-2"]
    for name in names:
        cdi.validate_device_name(name)


def test_atomic_write_leaves_no_temp_file_and_replaces(tmp_path: Path) -> None:
    target = cdi.write_spec(tmp_path, "u1", spec_of("gpu0"))
    cdi.write_spec(tmp_path, "u1", spec_of("gpu1"))
    assert [p.name for p in tmp_path.iterdir()] == [target.name]
    assert json.loads(target.read_text())["devices"][0]["name"] == "gpu1"
    assert oct(target.stat().st_mode & 0o777) == oct(0o644)
    cdi.remove_spec(tmp_path, "vendor.com/gpu", "u1")
    cdi.remove_spec(tmp_path, "vendor.com/gpu", "u1")
    assert list(tmp_path.iterdir()) == []


def test_interrupted_write_temp_is_removed_with_the_spec(tmp_path: Path) -> None:
    target = cdi.transient_spec_path(tmp_path, "vendor.com/gpu", "u1")
    leftover = tmp_path / f"{target.name}.abc123.tmp"
    leftover.write_text("{")  # what a SIGKILL between write and rename leaves
    others = [f"{target.name}.tmp", f"{target.name}.abc.tmp.json", "vendor.com-gpu_u10.json.1.tmp"]
    for name in others:  # not temp files of this spec
        (tmp_path / name).write_text("{")
    cdi.remove_spec(tmp_path, "vendor.com/gpu", "u1")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(others)


@pytest.fixture
def tiny_mount(tmp_path: Path):
    """A real tmpfs (root only, which these tests require): a full or read-only CDI dir."""
    mounted: list[Path] = []

    def make(options: str) -> Path:
        path = tmp_path / f"mnt{len(mounted)}"
        path.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=True)
        mounted.append(path)
        return path

    yield make
    for path in mounted:
        subprocess.run(["umount", str(path)], check=True)


def test_full_cdi_dir_fails_cleanly_and_rolls_back(node: Node, tiny_mount) -> None:
    full = tiny_mount("size=64k")
    filler = full / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:  # fill the filesystem: no room left for the spec
        while True:
            os.write(fd, b"x" * 1024)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    node.cdi_dir = full
    p = node.preparer()
    with pytest.raises(PrepareError, match="no space left on device") as err:
        p.prepare(claim())
    assert not err.value.permanent  # retried by the kubelet once space is back
    assert sorted(x.name for x in full.iterdir()) == ["filler"]  # no temp file left
    assert json.loads((node.state_dir / "checkpoint.json").read_text())["claims"] == {}
    filler.unlink()
    assert p.prepare(claim())[0].device_name == "gpu-0"


def test_read_only_cdi_dir_fails_cleanly(node: Node, tiny_mount) -> None:
    node.cdi_dir = tiny_mount("ro,size=64k")
    with pytest.raises(PrepareError, match="not writable"):
        node.preparer().prepare(claim())
    assert json.loads((node.state_dir / "checkpoint.json").read_text())["claims"] == {}


def test_unprepare_failure_keeps_the_claim_for_the_retry(node: Node, tiny_mount) -> None:
    node.cdi_dir = tiny_mount("size=64k")
    p = node.preparer()
    c = claim()
    p.prepare(c)
    subprocess.run(["mount", "-o", "remount,ro", str(node.cdi_dir)], check=True)
    try:
        with pytest.raises(PrepareError, match=r"unprepare claim .*not writable"):
            p.unprepare(c.ref)
        assert [r.uid for r in p.prepared_claims()] == [c.uid]  # kept: the kubelet retries
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(node.cdi_dir)], check=True)
    p.unprepare(c.ref)
    assert p.prepared_claims() == []
    assert list(node.cdi_dir.iterdir()) == []
