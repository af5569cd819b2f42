"""Registration service and socket handling over real unix sockets."""

from __future__ import annotations

import os
import socket
import stat
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from dra_driver.plugin._proto import pluginregistration_pb2 as reg_pb
from dra_driver.plugin._proto import pluginregistration_pb2_grpc as reg_grpc
from dra_driver.plugin.sockets import SocketError, remove_stale_socket, socket_paths
from tests.plugin.conftest import StartPlugin
from tests.plugin.fakes import DRIVER


def _get_info(path: Path) -> Any:
    with grpc.insecure_channel(f"unix:{path}") as ch:
        return reg_grpc.RegistrationStub(ch).GetInfo(reg_pb.InfoRequest(), timeout=1)


def test_get_info_answers_with_driver_endpoint_and_versions_in_order(
    start_plugin: StartPlugin,
) -> None:
    run = start_plugin()
    reg = run.settings.registry_dir / f"{DRIVER}-reg.sock"
    assert run.plugin.paths.registration == reg
    begin = time.monotonic()
    info = _get_info(reg)
    assert time.monotonic() - begin < 1.0  # the kubelet's GetInfo deadline
    assert info.type == "DRAPlugin"
    assert info.name == DRIVER
    assert info.endpoint == str(run.settings.plugins_dir / DRIVER / "dra.sock")
    assert list(info.supported_versions) == [
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1.DRAResourceHealth",
        "v1alpha1.DRAResourceHealth",
    ]


def test_health_versions_not_advertised_when_health_is_off(start_plugin: StartPlugin) -> None:
    run = start_plugin(serve_health=False)
    info = _get_info(run.plugin.paths.registration)
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]


def test_registration_status_is_recorded_and_failure_surfaces_in_readiness(
    start_plugin: StartPlugin,
) -> None:
    run = start_plugin()
    assert not run.plugin.readiness().registered
    with grpc.insecure_channel(f"unix:{run.plugin.paths.registration}") as ch:
        stub = reg_grpc.RegistrationStub(ch)
        stub.NotifyRegistrationStatus(
            reg_pb.RegistrationStatus(plugin_registered=False, error="version mismatch"), timeout=5
        )
        r = run.plugin.readiness()
        assert not r.registered and not r.ready
        assert "version mismatch" in " ".join(r.problems)
        stub.NotifyRegistrationStatus(reg_pb.RegistrationStatus(plugin_registered=True), timeout=5)
    assert run.plugin.readiness().registered


def test_sockets_are_private_and_removed_on_stop(start_plugin: StartPlugin) -> None:
    run = start_plugin()
    for path in (run.plugin.paths.registration, run.plugin.paths.dra):
        mode = path.lstat().st_mode
        assert stat.S_ISSOCK(mode)
        assert stat.S_IMODE(mode) == 0o600
    # No staging leftovers the kubelet's watcher could trip over.
    assert [p.name for p in run.settings.registry_dir.iterdir()] == [f"{DRIVER}-reg.sock"]
    run.plugin.stop(grace_s=0)
    assert not run.plugin.paths.registration.exists()
    assert not run.plugin.paths.dra.exists()


def test_socket_group_gives_0660(start_plugin: StartPlugin) -> None:
    gid = os.getgid()
    run = start_plugin(socket_group=gid)
    st = run.plugin.paths.dra.lstat()
    assert stat.S_IMODE(st.st_mode) == 0o660
    assert st.st_gid == gid


def test_stale_socket_of_ours_is_replaced(start_plugin: StartPlugin, short_dir: Path) -> None:
    reg_dir = short_dir / "registry"
    reg_dir.mkdir()
    stale = reg_dir / f"{DRIVER}-reg.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(stale))
    s.close()  # leaves a dead socket file behind, like a crashed plugin
    run = start_plugin()
    assert _get_info(stale).name == DRIVER
    assert run.plugin.paths.registration == stale


def test_non_socket_file_in_the_way_is_never_removed(tmp_path: Path) -> None:
    victim = tmp_path / "important"
    victim.write_text("data")
    with pytest.raises(SocketError, match="not a socket"):
        remove_stale_socket(victim)
    assert victim.read_text() == "data"


def test_rolling_update_names_sockets_by_pod_uid(start_plugin: StartPlugin) -> None:
    uid = "0b5a3d1e-1111-2222-3333-444455556666"
    run = start_plugin(rolling_update_uid=uid)
    assert run.plugin.paths.registration.name == f"{DRIVER}-{uid}-reg.sock"
    assert run.plugin.paths.dra.name == f"dra-{uid}.sock"
    info = _get_info(run.plugin.paths.registration)
    assert info.endpoint == str(run.plugin.paths.dra)


def test_overlong_socket_path_is_rejected_with_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SocketError, match="at most 107"):
        socket_paths(
            driver=DRIVER,
            registry_dir=Path("/r"),
            plugins_dir=tmp_path / ("x" * 100),
            rolling_update_uid=None,
        )


def test_rolling_update_registration_name_is_hashed_when_too_long() -> None:
    paths = socket_paths(
        driver=DRIVER,
        registry_dir=Path("/var/lib/kubelet/plugins_registry"),
        plugins_dir=Path("/p"),
        rolling_update_uid="u" * 60,
    )
    assert len(os.fsencode(paths.registration)) <= 107
    assert paths.registration.name.endswith("-reg.sock")


def test_rolling_update_dra_socket_name_is_hashed_when_too_long() -> None:
    """A long driver name (compute-domain.nvidia.com) under a deep kubelet root: the
    UID-suffixed name would pass 107 bytes, so a digest of driver and UID stands in."""
    uid = "ca887c96-06e7-41cc-9da4-42c3cf2ecb61"
    paths = socket_paths(
        driver="compute-domain.nvidia.com",
        registry_dir=Path("/r"),
        plugins_dir=Path("/tmp/demo-k_1_9fgd/n0/kubelet/plugins"),
        rolling_update_uid=uid,
    )
    assert len(os.fsencode(paths.dra)) <= 107
    assert paths.dra.name.startswith("dra-") and uid not in paths.dra.name
    same = socket_paths(
        driver="compute-domain.nvidia.com",
        registry_dir=Path("/r"),
        plugins_dir=Path("/tmp/demo-k_1_9fgd/n0/kubelet/plugins"),
        rolling_update_uid=uid,
    )
    assert same.dra == paths.dra  # stable: a restarted instance finds its own socket


def test_relative_directories_still_give_an_absolute_endpoint() -> None:
    paths = socket_paths(
        driver=DRIVER,
        registry_dir=Path("reg"),
        plugins_dir=Path("plugins"),
        rolling_update_uid=None,
    )
    assert paths.dra.is_absolute() and paths.registration.is_absolute()


def test_invalid_driver_name_is_rejected_before_anything_is_created(short_dir: Path) -> None:
    import logging

    from dra_driver.plugin.app import KubeletPlugin, PluginSettings
    from dra_driver.plugin.slices import SliceValidationError
    from tests.plugin.fakes import FakeBackend

    settings = PluginSettings(
        driver_name="GPU_Driver",
        node_name="node-a",
        registry_dir=short_dir / "r",
        plugins_dir=short_dir / "p",
    )
    with pytest.raises(SliceValidationError, match="driver: 'GPU_Driver' must be a DNS subdomain"):
        KubeletPlugin(settings=settings, backend=FakeBackend(), logger=logging.getLogger("t"))
    assert list(short_dir.iterdir()) == []
