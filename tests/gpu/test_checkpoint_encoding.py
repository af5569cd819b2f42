"""The checkpoint's incremental encoder writes exactly what one encode of everything would."""

from __future__ import annotations

import dataclasses
import json

import pytest

from dra_driver.gpu import checkpoint
from dra_driver.gpu.checkpoint import (
    Checkpoint,
    ClaimEntry,
    DeviceRecord,
    Encoder,
    SharedEntry,
    Unit,
    decode,
)


def entry(name: str, *, device: str = "gpu-0", units: tuple[Unit, ...] = ()) -> ClaimEntry:
    return ClaimEntry(
        state="Prepared",
        namespace="team-ä",
        name=name,
        devices=(
            DeviceRecord(
                request="gpu/big",
                pool="node-a",
                device=device,
                share_id="5b1c7f0e-0000-4000-8000-00000000000a",
                consumed_capacity={"memory": "10Gi"},
                cdi_device_ids=(f"k8s.gpu.nvidia.com/claim={name}-{device}",),
                extra={"fromNewerPlugin": [1, {"x": None}]},
            ),
        ),
        units=units,
        error='nvidia-smi said "no"\n',
        extra={"futureField": True},
        unit_extras=({"futureUnitField": 1.5},)[: len(units)],
    )


def rich() -> Checkpoint:
    mps = Unit("MPS", ("gpu-1",), ("GPU-1",), {"daemonId": "d1"}, ("gpu-1/mps",))
    return Checkpoint(
        boot_id="boot-1",
        claims={
            "uid-a": entry("a"),
            "uid-b": entry("b", device="gpu-1", units=(mps,)),
        },
        shared={"gpu-1/mps": SharedEntry("MPS", "Ready", {"pid": 7}, {"later": "x"})},
        extra={"futureTopLevel": {"nested": [1, 2]}},
    )


def whole(cp: Checkpoint) -> bytes:
    """The file as one encode of everything, the reference for the incremental one."""
    doc = {
        **cp.extra,
        "version": 2,
        "nodeBootID": cp.boot_id,
        "claims": {uid: checkpoint._claim_json(e) for uid, e in cp.claims.items()},
        "shared": {k: checkpoint._shared_json(s) for k, s in cp.shared.items()},
    }
    return (json.dumps(doc, separators=(",", ":")) + "\n").encode()


def test_the_bytes_are_those_of_a_whole_encode_and_decode_back_to_the_same_checkpoint() -> None:
    cp = rich()
    data = Encoder().dumps(cp)
    assert data == whole(cp)
    assert decode(json.loads(data)) == cp
    empty = Checkpoint(boot_id="b")
    assert Encoder().dumps(empty) == b'{"version":2,"nodeBootID":"b","claims":{},"shared":{}}\n'


def test_only_entries_not_written_before_are_encoded_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    encoded: list[str] = []
    real = checkpoint._claim_json

    def counting(e: ClaimEntry) -> dict[str, object]:
        encoded.append(e.name)
        return real(e)

    monkeypatch.setattr(checkpoint, "_claim_json", counting)
    encoder, cp = Encoder(), rich()
    encoder.dumps(cp)
    assert sorted(encoded) == ["a", "b"]

    encoded.clear()
    cp = dataclasses.replace(cp, claims=dict(cp.claims))  # the next transaction's copy
    cp.claims["uid-a"] = dataclasses.replace(cp.claims["uid-a"], state="Unpreparing")
    cp.claims["uid-c"] = entry("c", device="gpu-2")
    del cp.claims["uid-b"]
    data = encoder.dumps(cp)
    assert sorted(encoded) == ["a", "c"]
    assert data == whole(cp)
    assert json.loads(data)["claims"]["uid-a"]["state"] == "Unpreparing"

    encoded.clear()
    cp.claims["uid-b"] = rich().claims["uid-b"]  # an equal but new object: encoded
    data = encoder.dumps(cp)
    assert encoded == ["b"]
    assert data == whole(cp)
