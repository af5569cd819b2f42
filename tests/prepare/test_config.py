"""Opaque configs: NVIDIA-compatible shapes, strict errors naming field and allowed values."""

from __future__ import annotations

import pytest

from dra_driver.gpu import config
from dra_driver.gpu.config import ConfigError, Sharing, parse_quantity
from dra_driver.gpu.planning import resolve as resolve_configs
from dra_driver.gpu.sharing.strategies.builtin import DECODERS
from dra_driver.gpu.sharing.strategies.mps import Mps
from dra_driver.gpu.sharing.strategies.timeslicing import TimeSlicing
from tests.prepare.hosttree import claim, gpu_config

API = "resource.nvidia.com/v1beta1"


def decode(raw: object, origin: str) -> config.DeviceConfig:
    return config.decode(raw, origin, DECODERS)


def resolve(claim: object, types: dict) -> dict:
    return resolve_configs(claim, types, DECODERS)  # type: ignore[arg-type]


def params(kind: str = "GpuConfig", **fields: object) -> dict[str, object]:
    return {"apiVersion": API, "kind": kind, **fields}


def test_time_slicing_and_mps_decode() -> None:
    ts = decode(
        params(sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}}), "c"
    )
    assert ts.sharing == Sharing("TimeSlicing", TimeSlicing("Short"))
    default = decode(params(sharing={"strategy": "TimeSlicing"}), "c").sharing
    assert default == Sharing("TimeSlicing", TimeSlicing("Default"))
    mps = decode(
        params(
            sharing={
                "strategy": "MPS",
                "mpsConfig": {
                    "defaultActiveThreadPercentage": 25,
                    "defaultPinnedDeviceMemoryLimit": "1.5Gi",
                    "defaultPerDevicePinnedMemoryLimit": {"GPU-x": "512Mi", "0": 2147483648},
                },
            }
        ),
        "c",
    )
    assert mps.sharing == Sharing("MPS", Mps(25, 1536 << 20, {"GPU-x": 512 << 20, "0": 2 << 30}))
    mig = decode(params("MigDeviceConfig", sharing={"strategy": "MPS"}), "c")
    assert (mig.kind, mig.sharing) == ("MigDeviceConfig", Sharing("MPS", Mps()))
    assert decode(params(), "c").sharing is None


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (
            {"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig"},
            "apiVersion: unsupported value 'resource.nvidia.com/v1'; "
            "allowed: resource.nvidia.com/v1beta1",
        ),
        (
            params("VfioDeviceConfig"),
            "kind: unsupported value 'VfioDeviceConfig'; allowed: GpuConfig, MigDeviceConfig",
        ),
        (params(shareing={}), "shareing: unknown field; allowed: apiVersion, kind, sharing"),
        (
            params(sharing={"strategy": "Spatial"}),
            "sharing.strategy: unsupported value 'Spatial'; allowed: TimeSlicing, MPS",
        ),
        (
            params(
                sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Forever"}}
            ),
            "sharing.timeSlicingConfig.interval: unsupported value 'Forever'; "
            "allowed: Default, Short, Medium, Long",
        ),
        (
            params(sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {"intervall": "Long"}}),
            "sharing.timeSlicingConfig.intervall: unknown field; allowed: interval",
        ),
        (
            params(sharing={"strategy": "TimeSlicing", "mpsConfig": {}}),
            "sharing.mpsConfig: only allowed with strategy MPS",
        ),
        (
            params(sharing={"strategy": "MPS", "timeSlicingConfig": {}}),
            "sharing.timeSlicingConfig: only allowed with strategy TimeSlicing",
        ),
        (
            params(
                sharing={"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 101}}
            ),
            "defaultActiveThreadPercentage: 101; allowed: integer 0..100",
        ),
        (
            params(
                sharing={
                    "strategy": "MPS",
                    "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "10 GB"},
                }
            ),
            "defaultPinnedDeviceMemoryLimit: '10 GB' is not a quantity",
        ),
        (
            params(
                sharing={
                    "strategy": "MPS",
                    "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "100Ki"},
                }
            ),
            "below the minimum of 1Mi",
        ),
        (
            params("MigDeviceConfig", sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {}}),
            "sharing.timeSlicingConfig: unknown field; allowed: strategy, mpsConfig",
        ),
        ("not an object", "parameters: must be an object"),
    ],
    ids=lambda v: v if isinstance(v, str) and len(v) < 30 else None,
)
def test_strict_decoding_names_field_and_allowed_values(raw: object, expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        decode(raw, "config[0] (FromClaim)")
    assert str(err.value).startswith("config[0] (FromClaim): ")
    assert expected in str(err.value)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1Gi", 1 << 30),
        ("1G", 10**9),
        ("1.5Mi", 1572864),
        ("1e3", 1000),
        (4096, 4096),
        ("100m", 1),
        ("1Ei", 1 << 60),  # was "not a quantity": E was taken for an exponent
        ("2E", 2 * 10**18),
        ("8Ei", 8 << 60),
    ],
)
def test_quantities(text: object, value: int) -> None:
    assert parse_quantity(text, "x") == value


def test_precedence_claim_over_class_and_type_matching() -> None:
    cls = gpu_config(
        {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}}, source="FromClass"
    )
    own = gpu_config(
        {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}, requests=("a",)
    )
    mig = gpu_config({"strategy": "MPS"}, kind="MigDeviceConfig")
    c = claim(
        devices=[("a", "gpu-0"), ("b", "gpu-1"), ("m", "gpu-7-mig-1g10gb-19-2")],
        configs=[cls, own, mig],
    )
    out = resolve(c, {"gpu-0": "gpu", "gpu-1": "gpu", "gpu-7-mig-1g10gb-19-2": "mig"})
    assert out[("a", "gpu-0")].sharing == Sharing("TimeSlicing", TimeSlicing("Long"))
    assert out[("b", "gpu-1")].sharing == Sharing("TimeSlicing", TimeSlicing("Short"))
    assert out[("m", "gpu-7-mig-1g10gb-19-2")].sharing == Sharing("MPS", Mps())


def test_config_naming_a_request_of_the_other_type_is_an_error() -> None:
    c = claim(
        devices=[("m", "gpu-7-mig-1g10gb-19-2")],
        configs=[gpu_config({"strategy": "MPS"}, requests=("m",))],
    )
    with pytest.raises(
        ConfigError, match=r"kind GpuConfig names request 'm'.*needs kind MigDeviceConfig"
    ):
        resolve(c, {"gpu-7-mig-1g10gb-19-2": "mig"})
