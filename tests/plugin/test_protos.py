"""Our .proto files: stubs up to date, wire names and field numbers per the spec."""

from __future__ import annotations

import filecmp
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from dra_driver.plugin._proto import (
    dra_v1_pb2,
    dra_v1beta1_pb2,
    health_v1_pb2,
    health_v1alpha1_pb2,
    pluginregistration_pb2,
)

ROOT = Path(__file__).resolve().parents[2]
PROTO_OUT = ROOT / "dra_driver" / "plugin" / "_proto"


def test_committed_stubs_match_a_fresh_generation(tmp_path: Path) -> None:
    subprocess.run(
        [str(ROOT / "scripts" / "gen-proto.sh"), str(tmp_path)],
        check=True,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
    )
    generated = sorted(p.name for p in tmp_path.glob("*_pb2*"))
    committed = sorted(p.name for p in PROTO_OUT.glob("*_pb2*"))
    assert generated == committed
    _match, mismatch, errors = filecmp.cmpfiles(tmp_path, PROTO_OUT, generated, shallow=False)
    assert not mismatch and not errors, f"stale stubs, run scripts/gen-proto.sh: {mismatch}"


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def test_dependency_floors_cover_what_the_stubs_need() -> None:
    """The stubs refuse to import on an older grpcio or protobuf (a GPU node image with
    grpcio 1.84 failed at startup), so the declared floors must be what they were
    generated for, and the generator pinned to the version that wrote them."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    floors = {}
    for dep in [*project["dependencies"], *project["optional-dependencies"]["test"]]:
        m = re.fullmatch(r"([\w-]+)(>=|==)([\d.]+)", dep)
        if m:
            floors[m[1]] = (m[2], _version(m[3]))
    grpc_needed = {
        _version(re.search(r"GRPC_GENERATED_VERSION = '([\d.]+)'", f.read_text())[1])  # type: ignore[index]
        for f in PROTO_OUT.glob("*_pb2_grpc.py")
    }
    proto_needed = {
        tuple(int(x) for x in m)
        for f in PROTO_OUT.glob("*_pb2.py")
        for m in re.findall(r"Domain\.PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+),", f.read_text())
    }
    assert len(grpc_needed) == 1 and len(proto_needed) == 1, (grpc_needed, proto_needed)
    assert floors["grpcio"] == (">=", *grpc_needed)
    assert floors["grpcio-tools"] == ("==", *grpc_needed)
    assert floors["protobuf"] == (">=", *proto_needed)


def _fields(message: object) -> dict[str, int]:
    return {f.name: f.number for f in message.DESCRIPTOR.fields}  # type: ignore[attr-defined]


def test_service_full_names_are_what_the_kubelet_dials() -> None:
    names = {
        m.DESCRIPTOR.services_by_name[s].full_name
        for m, s in [
            (pluginregistration_pb2, "Registration"),
            (dra_v1_pb2, "DRAPlugin"),
            (dra_v1beta1_pb2, "DRAPlugin"),
            (health_v1_pb2, "DRAResourceHealth"),
            (health_v1alpha1_pb2, "DRAResourceHealth"),
        ]
    }
    assert names == {
        "pluginregistration.Registration",
        "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
        "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin",
        "v1.DRAResourceHealth",
        "v1alpha1.DRAResourceHealth",
    }
    watch = health_v1_pb2.DESCRIPTOR.services_by_name["DRAResourceHealth"].methods_by_name[
        "NodeWatchResources"
    ]
    assert watch.server_streaming and not watch.client_streaming


def test_field_numbers_match_the_spec() -> None:
    assert _fields(pluginregistration_pb2.PluginInfo) == {
        "type": 1,
        "name": 2,
        "endpoint": 3,
        "supported_versions": 4,
    }
    assert _fields(pluginregistration_pb2.RegistrationStatus) == {
        "plugin_registered": 1,
        "error": 2,
    }
    for pb in (dra_v1_pb2, dra_v1beta1_pb2):
        assert _fields(pb.Claim) == {"namespace": 1, "uid": 2, "name": 3}
        assert _fields(pb.NodePrepareResourceResponse) == {"devices": 1, "error": 2}
        assert _fields(pb.NodeUnprepareResourceResponse) == {"error": 1}
    base = {"request_names": 1, "pool_name": 2, "device_name": 3, "cdi_device_ids": 4}
    assert _fields(dra_v1beta1_pb2.Device) == base
    assert _fields(dra_v1_pb2.Device) == {**base, "share_id": 5}
    for pb in (health_v1_pb2, health_v1alpha1_pb2):
        assert _fields(pb.DeviceHealth) == {
            "device": 1,
            "health": 2,
            "last_updated_time": 3,
            "health_check_timeout_seconds": 4,
            "message": 5,
        }
        assert dict(pb.HealthStatus.items()) == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}


def test_share_id_is_proto3_optional_so_absence_is_distinguishable() -> None:
    d = dra_v1_pb2.Device(pool_name="p", device_name="d")
    assert not d.HasField("share_id")
    d.share_id = ""
    assert d.HasField("share_id")
    wire = dra_v1_pb2.Device.FromString(d.SerializeToString())
    assert wire.HasField("share_id")
