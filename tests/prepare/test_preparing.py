"""ClaimPreparer end to end on a hand-built host: results, files, idempotency, safety, sharing."""

from __future__ import annotations

import dataclasses
import json
import logging
import stat
import threading
import time
from pathlib import Path

import pytest

from dra_driver.gpu.sharing.mpsdaemons import MpsDaemons, mps_id
from dra_driver.gpu.sharing.tools import GpuCommands, GpuTools
from dra_driver.gpu.statefile import FILE_NAME
from dra_driver.plugin.claims import ClaimRef, PrepareError
from tests.prepare.hosttree import MIG_CAPS, Node, claim, gpu_config, make_node

UID = "0a1b2c3d-0000-4000-8000-000000000001"
UID2 = "0a1b2c3d-0000-4000-8000-000000000002"
KIND = "k8s.gpu.nvidia.com/claim"


def spec_file(node: Node, uid: str = UID):
    return node.cdi_dir / f"k8s.gpu.nvidia.com-claim_{uid}.json"


def checkpoint(node: Node) -> dict:
    return json.loads((node.state_dir / FILE_NAME).read_text())


def test_one_gpu_result_spec_and_checkpoint(node: Node) -> None:
    p = node.preparer()
    result = p.prepare(claim(devices=[("gpu/large", "gpu-3")]))

    assert len(result) == 1
    dev = result[0]
    assert dev.request_names == ("gpu/large",)  # as allocated; the plugin layer sends "gpu"
    assert (dev.pool_name, dev.device_name) == ("node-a", "gpu-3")
    assert dev.cdi_device_ids == (f"{KIND}={UID}-gpu-3",)

    path = spec_file(node)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    spec = json.loads(path.read_text())
    assert spec["cdiVersion"] == "0.5.0"  # device name starts with a digit + hostPath
    assert spec["kind"] == KIND
    [device] = spec["devices"]
    assert device["name"] == f"{UID}-gpu-3"
    [gpu_node] = device["containerEdits"]["deviceNodes"]
    assert gpu_node == {
        "path": "/dev/nvidia3",
        "hostPath": str(node.host.dev("nvidia3")),
        "type": "c",
        "major": 195,
        "minor": 3,
        "fileMode": 0o666,
        "permissions": "rwm",
    }
    common = spec["containerEdits"]
    lib = "/usr/lib/x86_64-linux-gnu"
    assert common["env"] == ["NVIDIA_VISIBLE_DEVICES=void", f"NVIDIA_CTK_LIBCUDA_DIR={lib}"]
    ctl = {n["path"]: (n["major"], n["minor"]) for n in common["deviceNodes"]}
    assert ctl == {
        "/dev/nvidiactl": (195, 255),
        "/dev/nvidia-uvm": (511, 0),
        "/dev/nvidia-uvm-tools": (511, 1),
    }
    mounts = {m["containerPath"]: m for m in common["mounts"]}
    assert f"{lib}/libcuda.so.580.95.05" in mounts
    assert f"{lib}/libcuda.so.1" not in mounts  # a link the create-symlinks hook makes
    assert f"{lib}/libunrelated.so.2" not in mounts
    assert "/usr/bin/nvidia-smi" in mounts
    assert "/lib/firmware/nvidia/580.95.05/gsp_ga10x.bin" in mounts
    assert all(m["options"][0] == "ro" for m in mounts.values())
    assert mounts[f"{lib}/libcuda.so.580.95.05"]["hostPath"] == str(
        node.host.driver(lib[1:], "libcuda.so.580.95.05")
    )
    hooks = {h["args"][1]: h["args"][2:] for h in common["hooks"]}
    assert list(hooks) == [
        "create-symlinks", "enable-cuda-compat", "update-ldcache",
        "disable-device-node-modification",
    ]  # fmt: skip
    assert f"libcuda.so.580.95.05::{lib}/libcuda.so.1" in hooks["create-symlinks"]
    assert f"libcuda.so.1::{lib}/libcuda.so" in hooks["create-symlinks"]
    assert hooks["update-ldcache"] == ["--folder", lib]

    cp = checkpoint(node)
    entry = cp["claims"][UID]
    assert entry["state"] == "Prepared"
    assert entry["devices"][0]["cdiDeviceIDs"] == [f"{KIND}={UID}-gpu-3"]
    assert entry["devices"][0]["request"] == "gpu/large"  # as allocated
    assert cp["nodeBootID"] == "boot-1"
    assert node.calls() == []  # no config: no GPU tool touched
    assert p.prepared_claims() == [ClaimRef("ns", "c1", UID)]


def test_repeated_prepare_returns_same_result_without_work(node: Node) -> None:
    p = node.preparer()
    c = claim(configs=[gpu_config({"strategy": "TimeSlicing"})])
    first = p.prepare(c)
    calls = len(node.calls())
    mtime = spec_file(node).stat().st_mtime_ns
    time.sleep(0.01)
    assert node.preparer().prepare(c) == first  # a fresh process too
    assert len(node.calls()) == calls
    assert spec_file(node).stat().st_mtime_ns == mtime


def test_unprepare_removes_everything_and_tolerates_unknown(node: Node) -> None:
    p = node.preparer()
    p.prepare(claim())
    p.unprepare(ClaimRef("ns", "c1", UID))
    assert not spec_file(node).exists()
    assert checkpoint(node)["claims"] == {}
    p.unprepare(ClaimRef("ns", "c1", UID))  # again: fine
    p.unprepare(ClaimRef("ns", "never", UID2))  # never prepared: fine
    assert list(node.cdi_dir.iterdir()) == []
    assert p.prepared_claims() == []


def test_mig_device_gets_parent_and_both_capability_nodes(node: Node) -> None:
    p = node.preparer()
    [dev] = p.prepare(claim(devices=[("mig", "gpu-7-mig-1g10gb-19-6")]))
    spec = json.loads(spec_file(node).read_text())
    nodes = spec["devices"][0]["containerEdits"]["deviceNodes"]
    gi_minor, ci_minor = MIG_CAPS[13]
    assert [n["path"] for n in nodes] == [
        "/dev/nvidia7",
        f"/dev/nvidia-caps/nvidia-cap{gi_minor}",
        f"/dev/nvidia-caps/nvidia-cap{ci_minor}",
    ]
    for cap in nodes[1:]:
        assert (cap["type"], cap["major"], cap["fileMode"]) == ("c", 508, 0o444)
    assert dev.cdi_device_ids == (f"{KIND}={UID}-gpu-7-mig-1g10gb-19-6",)


def test_unknown_device_fails_and_writes_nothing(node: Node) -> None:
    p = node.preparer()
    with pytest.raises(PrepareError, match=r"'gpu-42'.*not on this node.*gpu-0") as err:
        p.prepare(claim(devices=[("gpu", "gpu-0"), ("gpu", "gpu-42")]))
    assert err.value.permanent
    assert not node.cdi_dir.exists() or list(node.cdi_dir.iterdir()) == []
    assert checkpoint_claims(node) == {}


def checkpoint_claims(node: Node) -> dict:
    path = node.state_dir / FILE_NAME
    return json.loads(path.read_text())["claims"] if path.exists() else {}


def test_invalid_config_fails_with_field_path_and_writes_nothing(node: Node) -> None:
    p = node.preparer()
    bad = gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Forever"}})
    with pytest.raises(PrepareError) as err:
        p.prepare(claim(configs=[bad]))
    msg = str(err.value)
    assert "sharing.timeSlicingConfig.interval" in msg
    assert "Default, Short, Medium, Long" in msg
    assert err.value.permanent
    assert checkpoint_claims(node) == {}
    assert node.calls() == []
    assert not spec_file(node).exists()


def test_device_of_another_claim_is_refused_unless_admin(node: Node) -> None:
    p = node.preparer()
    p.prepare(claim(devices=[("gpu", "gpu-1")]))
    with pytest.raises(PrepareError, match=r"'gpu-1' is already prepared for claim ns/c1"):
        p.prepare(claim(uid=UID2, name="c2", devices=[("gpu", "gpu-1")]))
    assert not spec_file(node, UID2).exists()
    monitor = p.prepare(claim(uid=UID2, name="mon", devices=[("gpu", "gpu-1")], admin=True))
    assert monitor[0].device_name == "gpu-1"


def test_time_slicing_runs_nvidia_smi_and_is_reset_on_unprepare(node: Node) -> None:
    p = node.preparer()
    uuid = node.inventory.gpus[2].uuid
    cfg = gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}})
    p.prepare(claim(devices=[("gpu", "gpu-2")], configs=[cfg]))
    argv = [c["argv"] for c in node.calls("nvidia-smi")]
    assert argv == [
        ["-i", uuid, "-c", "DEFAULT"],
        ["compute-policy", "-i", uuid, "--set-timeslice", "3"],
    ]
    p.unprepare(ClaimRef("ns", "c1", UID))
    argv = [c["argv"] for c in node.calls("nvidia-smi")][2:]
    assert argv == [["compute-policy", "-i", uuid, "--set-timeslice", "0"]]  # mode stays DEFAULT


def test_claim_config_overrides_class_config(node: Node) -> None:
    p = node.preparer()
    cls = gpu_config(
        {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}}, source="FromClass"
    )
    own = gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Medium"}})
    p.prepare(claim(configs=[cls, own]))
    assert node.calls("nvidia-smi")[-1]["argv"][-1] == "2"


def test_mps_daemon_is_real_limited_and_stopped(node: Node) -> None:
    p = node.preparer()
    gpus = node.inventory.gpus
    cfg = gpu_config(
        {
            "strategy": "MPS",
            "mpsConfig": {
                "defaultActiveThreadPercentage": 40,
                "defaultPinnedDeviceMemoryLimit": "10Gi",
                "defaultPerDevicePinnedMemoryLimit": {"1": "4096Mi"},
            },
        }
    )
    result = p.prepare(claim(devices=[("a", "gpu-4"), ("b", "gpu-5")], configs=[cfg]))
    assert len(node.live_daemons()) == 1
    started = [c for c in node.calls("nvidia-cuda-mps-control") if c["argv"] == ["-d"]]
    env = started[0]["env"]
    assert env["CUDA_VISIBLE_DEVICES"] == f"{gpus[4].uuid},{gpus[5].uuid}"
    pipe = env["CUDA_MPS_PIPE_DIRECTORY"]
    assert pipe == str(node.state_dir / "mps" / mps_id(UID, [gpus[4].uuid, gpus[5].uuid]) / "pipe")
    assert env["CUDA_MPS_LOG_DIRECTORY"].endswith("/log")
    smi = [c["argv"] for c in node.calls("nvidia-smi")]
    assert ["-i", gpus[4].uuid, "-c", "EXCLUSIVE_PROCESS"] in smi
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        commands = [c["command"] for c in node.calls("mps-daemon") if "command" in c]
        if len(commands) == 3:
            break
        time.sleep(0.02)
    assert commands == [
        "set_default_active_thread_percentage 40",
        f"set_default_device_pinned_mem_limit {gpus[4].uuid} 10240M",
        f"set_default_device_pinned_mem_limit {gpus[5].uuid} 4096M",
    ]
    spec = json.loads(spec_file(node).read_text())
    shm = pipe.removesuffix("/pipe") + "/shm"
    for dev in spec["devices"]:
        edits = dev["containerEdits"]
        assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in edits["env"]
        mounts = {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
        assert mounts == {"/tmp/nvidia-mps": pipe, "/dev/shm": shm}
    assert len(result) == 2
    assert node.mounts() == [shm]  # a tmpfs, shared by the daemon and the containers
    [daemon_pid] = node.live_daemons()
    assert (Path(shm) / f"nvidia-mps-emulated.{daemon_pid}").read_text() == pipe + "\n"

    p.unprepare(ClaimRef("ns", "c1", UID))
    assert node.live_daemons() == []
    assert node.mounts() == []
    assert not (node.state_dir / "mps").exists() or list((node.state_dir / "mps").iterdir()) == []
    assert ["-i", gpus[4].uuid, "-c", "DEFAULT"] in [c["argv"] for c in node.calls("nvidia-smi")]
    assert any(c.get("stdin") == "quit\n" for c in node.calls("nvidia-cuda-mps-control"))


def test_mps_bad_per_device_key_is_a_config_error(node: Node) -> None:
    cfg = gpu_config(
        {"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"GPU-nope": "1Gi"}}}
    )
    with pytest.raises(
        PrepareError, match=r"defaultPerDevicePinnedMemoryLimit\[GPU-nope\].*allowed keys"
    ):
        node.preparer().prepare(claim(configs=[cfg]))
    assert node.calls() == []


def test_failing_tool_rolls_back_everything(node: Node) -> None:
    node.record.with_name(node.record.name + ".fail").write_text("--set-timeslice 1\n")
    cfg = gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}})
    p = node.preparer()
    with pytest.raises(PrepareError, match="injected failure"):
        p.prepare(claim(configs=[cfg]))
    assert checkpoint_claims(node) == {}
    assert not spec_file(node).exists()
    last = [c["argv"] for c in node.calls("nvidia-smi")][-1]
    assert last[-2:] == ["--set-timeslice", "0"]  # time-slice put back by the rollback


def test_concurrent_claims_in_threads_and_two_preparers(node: Node) -> None:
    a, b = node.preparer(), node.preparer()  # like two plugin processes sharing the state dir
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            uid = f"0a1b2c3d-0000-4000-8000-00000000010{i}"
            (a if i % 2 else b).prepare(claim(uid=uid, name=f"c{i}", devices=[("gpu", f"gpu-{i}")]))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(checkpoint_claims(node)) == 7
    assert len(list(node.cdi_dir.glob("*.json"))) == 7


def test_devices_of_an_interrupted_prepare_stay_reserved(node: Node) -> None:
    p = node.preparer()
    p.prepare(claim(devices=[("gpu", "gpu-6")]))
    data = json.loads((node.state_dir / FILE_NAME).read_text())
    data["claims"][UID]["state"] = "Preparing"  # as if killed before completing
    (node.state_dir / FILE_NAME).write_text(json.dumps(data))
    with pytest.raises(PrepareError, match="'gpu-6' is already prepared"):
        p.prepare(claim(uid=UID2, name="c2", devices=[("gpu", "gpu-6")]))
    p.prepare(claim(devices=[("gpu", "gpu-6")]))  # its own retry rolls back and completes
    assert checkpoint(node)["claims"][UID]["state"] == "Prepared"


def test_runtime_host_paths_are_rewritten_for_the_container_runtime(node: Node) -> None:
    from dra_driver.gpu.host.hostpaths import HostPaths

    view = HostPaths(root=Path("/"), driver_root=Path("/run/nvidia/driver"))
    node.preparer(runtime_host=view).prepare(claim())
    spec = json.loads(spec_file(node).read_text())
    assert spec["devices"][0]["containerEdits"]["deviceNodes"][0]["hostPath"] == "/dev/nvidia0"
    mounts = {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}
    assert mounts["/usr/bin/nvidia-smi"] == "/run/nvidia/driver/usr/bin/nvidia-smi"


def test_vanished_spec_is_recreated_by_the_next_prepare(node: Node) -> None:
    p = node.preparer()
    first = p.prepare(claim())
    spec_file(node).unlink()  # e.g. /var/run/cdi emptied by hand
    assert p.prepare(claim()) == first
    assert json.loads(spec_file(node).read_text())["devices"][0]["name"] == f"{UID}-gpu-0"


def test_mig_sharing_mps_uses_mig_uuid_and_time_slicing_is_a_no_op(node: Node) -> None:
    p = node.preparer()
    mig_b = node.inventory.gpus[7].mig_instances[1]
    ts = gpu_config({"strategy": "TimeSlicing"}, kind="MigDeviceConfig", requests=("a",))
    mps = gpu_config({"strategy": "MPS"}, kind="MigDeviceConfig", requests=("b",))
    p.prepare(
        claim(
            devices=[("a", "gpu-7-mig-1g10gb-19-2"), ("b", "gpu-7-mig-1g10gb-19-6")],
            configs=[ts, mps],
        )
    )
    assert node.calls("nvidia-smi") == []  # no compute mode or timeslice on MIG devices
    [start] = [c for c in node.calls("nvidia-cuda-mps-control") if c["argv"] == ["-d"]]
    assert start["env"]["CUDA_VISIBLE_DEVICES"] == mig_b.uuid
    spec = json.loads(spec_file(node).read_text())
    envs = [d["containerEdits"].get("env", []) for d in spec["devices"]]
    assert envs == [[], ["CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"]]
    p.unprepare(ClaimRef("ns", "c1", UID))
    assert node.live_daemons() == []


def test_mps_daemon_start_failure_rolls_back_dirs_and_shm(node: Node) -> None:
    node.record.with_name(node.record.name + ".fail").write_text("nvidia-cuda-mps-control -d\n")
    p = node.preparer()
    with pytest.raises(PrepareError, match="injected failure"):
        p.prepare(claim(configs=[gpu_config({"strategy": "MPS"})]))
    assert node.mounts() == []
    assert list((node.state_dir / "mps").iterdir()) == []
    assert checkpoint_claims(node) == {}
    uuid = node.inventory.gpus[0].uuid
    assert [c["argv"] for c in node.calls("nvidia-smi")][-1] == ["-i", uuid, "-c", "DEFAULT"]


def test_late_loaded_uvm_module_reaches_the_next_claims_spec(node: Node) -> None:
    devices = node.host.proc("devices")
    full = devices.read_text()
    devices.write_text(full.replace("511 nvidia-uvm\n", ""))  # module not loaded yet
    p = node.preparer()
    p.prepare(claim())
    paths = [
        n["path"] for n in json.loads(spec_file(node).read_text())["containerEdits"]["deviceNodes"]
    ]
    assert paths == ["/dev/nvidiactl"]
    devices.write_text(full)  # first CUDA use loaded nvidia-uvm
    p.prepare(claim(uid=UID2, devices=[("gpu", "gpu-1")]))
    spec = json.loads(spec_file(node, UID2).read_text())
    paths = [n["path"] for n in spec["containerEdits"]["deviceNodes"]]
    assert paths == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]


def test_mps_sockets_fit_under_the_default_kubelet_dir() -> None:
    # Seen on a real H100: with `<claim UID>-<hash>` ids the daemon's socket path was
    # 110 bytes here and nvidia-cuda-mps-control -d exited 1.
    daemons = MpsDaemons(
        root=Path("/var/lib/kubelet/plugins/gpu.nvidia.com/mps"),
        commands=GpuCommands(tools=GpuTools(), logger=logging.getLogger("t")),
        tools=GpuTools(),
    )
    daemon_id = mps_id(UID, ["GPU-" + "f" * 36] * 8)
    assert len(str(daemons.pipe_dir(daemon_id) / "control_privileged")) <= 107


def test_a_state_dir_too_deep_for_mps_sockets_fails_clearly_and_leaves_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node = dataclasses.replace(make_node(tmp_path / "n"), state_dir=tmp_path / ("d" * 90))
    with caplog.at_level(logging.WARNING):
        p = node.preparer()
    assert "MPS claims will fail on this node" in caplog.text  # said at start already
    cfg = gpu_config({"strategy": "MPS"})
    with pytest.raises(PrepareError, match=r"too deep.*over the 107 a unix socket allows"):
        p.prepare(claim(configs=[cfg]))
    assert node.live_daemons() == []
    assert not any(node.cdi_dir.glob("*.json"))
    assert not any((node.state_dir / "mps").glob("*"))
    assert p.prepared_claims() == []
    assert node.calls() == []  # refused while planning: no GPU was touched


def test_looking_up_a_claim_not_prepared_takes_no_checkpoint_lock(node: Node) -> None:
    """The kubelet asks for every new claim whether it is prepared already (answered from
    the checkpoint while the API server is down): for a claim without its spec the answer
    is no without a checkpoint transaction, so a burst of new claims does not queue on the
    checkpoint lock twice per prepare."""
    import fcntl

    p = node.preparer()
    p.prepare(claim(devices=[("gpu", "gpu-1")]))
    lock = node.state_dir / "checkpoint.lock"
    with lock.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another instance is inside a transaction
        started = time.monotonic()
        assert p.prepared_devices(ClaimRef("default", "other", UID2)) is None
        assert time.monotonic() - started < 0.5
    [dev] = p.prepared_devices(ClaimRef("ns", "c1", UID)) or []
    assert dev.device_name == "gpu-1"


def test_a_prepared_uid_asked_for_under_another_name_is_refused(node: Node) -> None:
    """A UID names one claim: a prepare of a prepared UID under another namespace/name is
    a mix-up (a bug or a forged request), never answered with the other claim's devices."""
    p = node.preparer()
    p.prepare(claim(devices=[("gpu", "gpu-1")]))
    for other in (ClaimRef("ns", "c2", UID), ClaimRef("team-b", "c1", UID)):
        with pytest.raises(PrepareError, match=rf"{UID} is prepared on this node as ns/c1"):
            p.prepared_devices(other)
    [dev] = p.prepared_devices(ClaimRef("ns", "c1", UID)) or []
    assert dev.device_name == "gpu-1"
