"""Our .proto files: stubs up to date, wire names and field numbers per the spec."""

from __future__ import annotations

import filecmp
import subprocess
import sys
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
