"""Pure parts of the compute-domain plugin: opaque config decoding, the checkpoint file,
the host facts it reads and the CDI specs it writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dra_driver.computedomain.node import cdispecs
from dra_driver.computedomain.node.checkpoint import (
    CheckpointCorruptError,
    CheckpointStore,
    Entry,
)
from dra_driver.computedomain.node.config import ChannelConfig, DaemonConfig, claim_config
from dra_driver.computedomain.node.hostinfo import ImexHost, char_majors, imex_mgmt_minor
from dra_driver.emulation import EmulatedNode
from dra_driver.gpu.cdi import spec as cdi
from dra_driver.plugin.claims import AllocatedDevice, Claim, ClaimRef, OpaqueConfig, PrepareError
from tests.computedomain import kit

UID = "0f0f0f0f-0000-4000-8000-000000000001"
DOMAIN = "5c4e1d2a-7b8f-4e3a-9d61-0f2b3c4d5e6f"
TYPES = {"channel-0": "channel", "daemon-0": "daemon"}


def _claim(device: str, *params: dict[str, Any]) -> Claim:
    return Claim(ClaimRef("ns", "c", UID), (AllocatedDevice("r", "node", device),),
                 tuple(OpaqueConfig("FromClaim", (), p) for p in params))  # fmt: skip


def test_configs_decode_last_wins() -> None:
    assert claim_config(kit.channel_claim(UID, DOMAIN, "n"), TYPES) == ChannelConfig(DOMAIN)
    every = kit.channel_claim(UID, DOMAIN, "n", "All")
    assert claim_config(every, TYPES) == ChannelConfig(DOMAIN, "All")
    assert claim_config(kit.daemon_claim(UID, DOMAIN, "n"), TYPES) == DaemonConfig(DOMAIN)
    first = {"apiVersion": kit.API, "kind": "ComputeDomainChannelConfig", "domainID": "a"}
    last = {**first, "domainID": DOMAIN}
    assert claim_config(_claim("channel-0", first, last), TYPES).domain_id == DOMAIN


@pytest.mark.parametrize(
    ("params", "says"),
    [
        ({"apiVersion": "v1", "kind": "ComputeDomainChannelConfig", "domainID": DOMAIN},
         "apiVersion: 'v1'"),
        ({"apiVersion": kit.API, "kind": "GpuConfig", "domainID": DOMAIN}, "kind: 'GpuConfig'"),
        ({"apiVersion": kit.API, "kind": "ComputeDomainChannelConfig", "domainID": "../x"},
         "domainID: '../x' is not a ComputeDomain UID"),
        ({"apiVersion": kit.API, "kind": "ComputeDomainChannelConfig", "domainID": DOMAIN,
          "allocationMode": "Some"}, "allocationMode: 'Some'; allowed: Single, All"),
        ({"apiVersion": kit.API, "kind": "ComputeDomainChannelConfig", "domainID": DOMAIN,
          "numNodes": 2}, "unknown field(s) ['numNodes']"),
        ({"apiVersion": kit.API, "kind": "ComputeDomainDaemonConfig", "domainID": DOMAIN},
         "a Daemon config for device 'channel-0', which is a channel"),
    ],
    ids=["api-version", "kind", "domain-path", "mode", "unknown-field", "wrong-kind"],
)  # fmt: skip
def test_bad_configs_fail_for_good_naming_the_field(params: dict[str, Any], says: str) -> None:
    with pytest.raises(PrepareError) as err:
        claim_config(_claim("channel-0", params), TYPES)
    assert err.value.permanent and says in str(err.value) and UID in str(err.value)


def test_a_claim_without_config_is_refused() -> None:
    with pytest.raises(PrepareError, match="has no ComputeDomain config"):
        claim_config(_claim("channel-0"), TYPES)


def _store(tmp_path: Path, boot: str = "boot-1") -> CheckpointStore:
    (tmp_path / "boot_id").write_text(boot + "\n")
    return CheckpointStore(state_dir=tmp_path / "state", boot_id_file=tmp_path / "boot_id")


def test_checkpoint_round_trip_reboot_and_corruption(tmp_path: Path) -> None:
    store = _store(tmp_path)
    with store.transaction() as cp:
        cp.claims[UID] = Entry("ns", "c", "channel", DOMAIN, "All")
        store.write(cp)
    assert (store.path.stat().st_mode & 0o777) == 0o600
    saved = json.loads(store.path.read_text())
    assert saved["version"] == 1 and saved["claims"][UID]["allocationMode"] == "All"
    cp, dropped = store.read()
    assert cp.claims[UID].domain_id == DOMAIN and dropped == []
    cp, dropped = _store(tmp_path, "boot-2").read()  # after a reboot
    assert cp.claims == {} and dropped == [UID]
    store.path.write_text('{"version": 2, "claims": {}}')
    with pytest.raises(CheckpointCorruptError, match="version 2; this plugin reads version 1"):
        store.read()
    store.path.write_text("{torn")
    with pytest.raises(CheckpointCorruptError, match="move it aside"):
        store.read()


def test_host_facts_from_the_emulated_tree(tmp_path: Path) -> None:
    node = EmulatedNode.create("t4", tmp_path)
    majors = char_majors(node.host)
    assert majors["nvidia-caps-imex-channels"] == 509 and majors["nvidia"] == 195
    assert "loop" not in majors  # block devices are not character devices
    assert imex_mgmt_minor(node.host) == 4400


def test_channel_specs_are_valid_cdi() -> None:
    kind = cdi.claim_kind("compute-domain.nvidia.com")
    single = cdispecs.channel_spec(kind, f"{UID}-0", ChannelConfig(DOMAIN), 509)
    every = cdispecs.channel_spec(kind, f"{UID}-0", ChannelConfig(DOMAIN, "All"), 509)
    for spec in (single, every):
        cdi.validate(spec)
        assert json.loads(cdi.encode(spec))["cdiVersion"] == "0.5.0"  # a UID starts with a digit
    assert len(every.devices[0].edits.device_nodes) == 2048
    host = ImexHost(clique_id="", channels_major=509)
    daemon = cdispecs.daemon_spec(kind, f"{UID}-0", domain_id=DOMAIN, domain_dir=Path("/d"),
                                  host=host, node_name="n1",
                                  runtime_driver_root=Path("/"))  # fmt: skip
    cdi.validate(daemon)
    assert daemon.devices[0].edits.env == (f"DOMAIN_UID={DOMAIN}", "CLIQUE_ID=none-n1")


@pytest.mark.parametrize(
    ("profile", "clique"),
    [("hgx-h100-fabric", "8f3a2c61-5d0e-4b7a-9c1e-2f6d8b4a0c17.7"),
     ("hgx-h100-no-clique", ""),
     ("dgx-a100", "")],  # NVML answers NOT_SUPPORTED for fabric info before Hopper
)  # fmt: skip
def test_clique_from_nvml(tmp_path: Path, profile: str, clique: str) -> None:
    from dra_driver.computedomain.node.hostinfo import clique_id
    from dra_driver.gpu.hardware.nvml import Nvml

    node = EmulatedNode.create(profile, tmp_path)
    with node.nvml():
        nvml = Nvml()
        nvml.init()
        try:
            assert clique_id(nvml) == clique
        finally:
            nvml.shutdown()


def test_daemon_refuses_identity_that_would_reach_a_path_or_label(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from dra_driver.cli import main

    env = {"NODE_NAME": "n1", "POD_NAME": "../x", "POD_NAMESPACE": "ns", "POD_IP": "10.0.0.1",
           "DOMAIN_UID": DOMAIN, "CLIQUE_ID": "c.1"}  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        assert main(["compute-domain-daemon", "run"]) == 2  # a settings error, nothing started
    assert (
        "--pod-name / $POD_NAME is '../x': not a valid Kubernetes name" in capsys.readouterr().err
    )


@pytest.mark.parametrize("node", ["Node_1", "-n1", "n" * 254])
def test_the_plugin_refuses_a_node_name_kubernetes_would_refuse(node: str) -> None:
    """The same check and message as the GPU plugin's, before anything touches the host."""
    from dra_driver.cli import build_parser
    from dra_driver.commands.compute_domain_plugin import run
    from dra_driver.settings import SettingsError

    args = build_parser(environ={}).parse_args(
        ["compute-domain-plugin", f"--node-name={node}", "--namespace=dra-driver"]
    )
    with pytest.raises(SettingsError, match=r"--node-name \(DRA_NODE_NAME\) is .*expected a "
                       r"Kubernetes node name \(lower-case DNS subdomain"):  # fmt: skip
        run(args)


@pytest.mark.parametrize(
    ("flag", "says"),
    [
        ("--rolling-update-uid=../x", r"--rolling-update-uid \(DRA_ROLLING_UPDATE_UID\) is "
         r"'\.\./x': expected a pod UID"),
        ("--rolling-update-uid=" + "a" * 64, r"--rolling-update-uid .* expected a pod UID"),
        ("--namespace=Dra_Driver", r"--namespace \(DRA_NAMESPACE\) is 'Dra_Driver'"),
        ("--health-port=70000", None),
    ],
    ids=["uid-path", "uid-long", "namespace", "port"],
)  # fmt: skip
def test_the_plugin_refuses_what_the_gpu_plugin_refuses(
    flag: str, says: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    """The rolling-update UID names socket files: checked as the GPU plugin checks it,
    before anything touches the host; the shared flags parse alike (a bad port)."""
    from dra_driver.cli import build_parser
    from dra_driver.commands.compute_domain_plugin import run
    from dra_driver.settings import SettingsError

    argv = ["compute-domain-plugin", "--node-name=n1", "--namespace=dra-driver", flag]
    if says is None:
        with pytest.raises(SystemExit):
            build_parser(environ={}).parse_args(argv)
        assert "is not a port" in capsys.readouterr().err
        return
    args = build_parser(environ={}).parse_args(argv)
    with pytest.raises(SettingsError, match=says):
        run(args)
