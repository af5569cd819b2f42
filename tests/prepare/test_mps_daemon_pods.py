"""MPS daemons that outlive the plugin: the runner seam, daemon pods and adoption.

The pod runner (:mod:`dra_driver.mpspods`) is driven through the plugin's real API
client against :class:`~tests.mpspods_kubelet.PodKubelet`, which runs each pod's
container as a local process: the real ``dra-driver mps-daemon`` entry point and the
emulated ``nvidia-cuda-mps-control -f``. A "restarted plugin" is a new preparer with a
new runner over the same state dir (the old one's objects dropped, as a killed
container's are); its ``recover()`` is what the daemon runs at start.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.devcluster import wait_until
from dra_driver.gpu.preparing import ClaimPreparer
from dra_driver.gpu.sharing.mpsdaemons import MIB, MpsDaemons
from dra_driver.gpu.sharing.tools import GpuCommands, ToolError
from dra_driver.mpspods import PodRunner
from dra_driver.plugin.claims import PrepareError
from tests.mpspods_kubelet import PodKubelet
from tests.prepare.hosttree import Node, claim, gpu_config

LIMITS = {"defaultActiveThreadPercentage": 40, "defaultPinnedDeviceMemoryLimit": "2Gi"}
STRAY = "bbbbbbbbbbbb"


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[PodKubelet]:
    with PodKubelet(tmp_path) as k:
        yield k


def runner(kubelet: PodKubelet, node: Node, **kw: object) -> PodRunner:
    return PodRunner(
        client=kubelet.client(),
        namespace="dra-driver",
        node_name="node-a",
        driver_name="gpu.nvidia.com",
        image="dra-driver:test",
        mps_control=node.tools.mps_control,
        logger=logging.getLogger("test.mpspods"),
        **kw,  # type: ignore[arg-type]
    )


def daemons(node: Node, runner: PodRunner | None) -> MpsDaemons:
    commands = GpuCommands(tools=node.tools, logger=logging.getLogger("test"))
    return MpsDaemons(
        root=node.state_dir / "mps", commands=commands, tools=node.tools, runner=runner
    )


def daemon_commands(node: Node, pid: int) -> list[str]:
    return [
        str(c["command"]) for c in node.calls("mps-daemon") if c["pid"] == pid and "command" in c
    ]


def live(node: Node) -> list[int]:
    """The node's MPS daemons (not the pods' entry points, whose argv names the tool)."""
    return [
        pid
        for pid in node.live_daemons()
        if b"\0mps-daemon\0" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def mps_claim() -> object:
    return claim(configs=[gpu_config({"strategy": "MPS", "mpsConfig": LIMITS})])


def prepared_daemon(p: ClaimPreparer) -> str:
    (unit,) = p.recorded_units()
    return str(unit.record["daemonId"])


def test_a_daemon_pod_serves_the_claim_and_a_restarted_plugin_adopts_it(
    node: Node, kubelet: PodKubelet, caplog: pytest.LogCaptureFixture
) -> None:
    p = node.preparer(mps_runner=runner(kubelet, node))
    p.prepare(mps_claim())
    daemon_id = prepared_daemon(p)
    (pod,) = kubelet.pods.values()
    spec = pod["spec"]
    assert pod["metadata"]["labels"]["gpu.nvidia.com/mps-daemon"] == daemon_id
    assert (spec["nodeName"], spec["hostPID"], spec["restartPolicy"]) == ("node-a", True, "Always")
    assert spec["containers"][0]["securityContext"] == {"privileged": True}
    assert spec["containers"][0]["args"][0] == "mps-daemon"
    base = str(node.state_dir / "mps" / daemon_id)
    mounts = {
        (v["hostPath"]["path"], m["mountPath"])
        for v, m in zip(spec["volumes"], spec["containers"][0]["volumeMounts"], strict=True)
    }
    assert mounts == {(base, base), (f"{base}/shm", "/dev/shm")}
    (pid,) = live(node)
    assert parent_of(pid) != os.getpid()  # the pod's, not this process's child
    # The pod's daemon got the claim's limits as its defaults, before it was called ready.
    assert daemon_commands(node, pid) == [
        "set_default_active_thread_percentage 40",
        f"set_default_device_pinned_mem_limit {node.inventory.gpus[0].uuid} 2048M",
    ]
    # A daemon pod no record owns (left by a plugin that crashed before recording it).
    stray = daemons(node, runner(kubelet, node))
    stray.bring_up(
        STRAY, ["GPU-x"], active_thread_percentage=None, pinned_memory={}, done=lambda _s: None
    )
    assert len(kubelet.pods) == 2

    # The plugin is restarted: new objects, the same node. Its start adopts.
    p.close()
    again = node.preparer(mps_runner=runner(kubelet, node))
    with caplog.at_level(logging.INFO):
        again.recover()
    assert live(node) == [pid]  # the same process served throughout
    ((_, name),) = kubelet.pods
    assert kubelet.pod_named(name)["metadata"]["uid"] == pod["metadata"]["uid"]  # type: ignore[index]
    adopted = [r for r in caplog.records if r.getMessage() == "adopted MPS daemon"]
    assert [(r.daemon, r.owner) for r in adopted] == [(daemon_id, mps_claim().ref.uid)]  # type: ignore[attr-defined]
    assert "removing an MPS daemon no claim owns" in caplog.text
    assert not (node.state_dir / "mps" / STRAY).exists()

    again.unprepare(mps_claim().ref)  # type: ignore[attr-defined]
    assert kubelet.pods == {}
    assert live(node) == []
    assert list((node.state_dir / "mps").iterdir()) == []
    assert node.mounts() == []


def test_a_daemon_container_that_dies_is_restarted_with_its_limits(
    node: Node, kubelet: PodKubelet
) -> None:
    p = node.preparer(mps_runner=runner(kubelet, node))
    p.prepare(mps_claim())
    (pid,) = live(node)
    os.kill(pid, signal.SIGKILL)  # its control pipe stays behind

    def restarted() -> int | None:
        # One snapshot per look: a SIGKILLed process lingers a moment before it is gone,
        # so two snapshots can see it and then nothing.
        now = live(node)
        return now[0] if len(now) == 1 and now != [pid] else None

    new = wait_until(restarted, timeout=20, what="the kubelet restarted the daemon's container")
    wait_until(
        lambda: len(daemon_commands(node, new)) == 2,
        timeout=20,
        what="the restarted daemon got its limits again",
    )
    assert daemon_commands(node, new) == daemon_commands(node, pid)
    p.unprepare(mps_claim().ref)  # type: ignore[attr-defined]
    assert kubelet.pods == {} and live(node) == []


def test_a_daemon_pod_that_never_serves_fails_the_prepare_naming_the_pod(
    node: Node, kubelet: PodKubelet
) -> None:
    broken = runner(kubelet, node, start_timeout_s=3)
    broken._mps_control = node.root / "no-such-tool"  # the driver root lacks the MPS tool
    p = node.preparer(mps_runner=broken)
    with pytest.raises(
        PrepareError,
        match=r"MPS daemon pod dra-driver/mps-daemon-\w+-\w+ not "
        r"serving after 3 s: phase Running",
    ):
        p.prepare(mps_claim())
    assert kubelet.pods == {}  # rolled back: the pod deleted
    assert p.prepared_claims() == []


def test_process_runner_adoption_keeps_recorded_daemons_and_removes_the_others(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    """A plugin run on the host: its daemons outlive it as processes; the next one adopts
    the recorded ones, removes a stray one and reports a recorded one that died."""
    p = node.preparer()
    p.prepare(mps_claim())
    (pid,) = node.live_daemons()
    daemons(node, None).bring_up(
        STRAY,
        ["GPU-x"],
        active_thread_percentage=None,
        pinned_memory={"GPU-x": 64 * MIB},
        done=lambda _s: None,
    )
    assert len(node.live_daemons()) == 2
    p.close()
    again = node.preparer()
    with caplog.at_level(logging.INFO):
        again.recover()
    assert node.live_daemons() == [pid]
    assert not (node.state_dir / "mps" / STRAY).exists()
    assert "adopted MPS daemon" in caplog.text

    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: node.live_daemons() == [], timeout=10, what="daemon killed")
    caplog.clear()
    node.preparer().recover()
    (said,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert said.claim_uid == mps_claim().ref.uid  # type: ignore[attr-defined]
    assert "is not running: its clients have no MPS server" in said.getMessage()


def test_after_a_reboot_every_daemon_pod_is_deleted(node: Node, kubelet: PodKubelet) -> None:
    p = node.preparer(mps_runner=runner(kubelet, node))
    p.prepare(mps_claim())
    assert len(kubelet.pods) == 1
    p.close()
    node.host.proc("sys", "kernel", "random", "boot_id").write_text("boot-2\n")
    node.preparer(mps_runner=runner(kubelet, node)).recover()
    wait_until(lambda: kubelet.pods == {}, timeout=20, what="the daemon pods deleted")
    assert list((node.state_dir / "mps").iterdir()) == []


def test_which_recorded_daemons_are_owned_and_which_must_run() -> None:
    """Adoption's input: a prepared claim's daemon must run; a claim still preparing owns
    its daemon (not removed) without it having to run yet; a shared resource (a per-GPU
    daemon) owns one named under any key; a record without a daemon owns nothing."""
    from dra_driver.gpu.checkpoint import Checkpoint, ClaimEntry, SharedEntry, Unit
    from dra_driver.gpu.unpreparing import daemon_owners

    def entry(state: str, record: dict[str, object]) -> ClaimEntry:
        unit = Unit("MPS", ("gpu-0",), record=record)
        return ClaimEntry(state=state, namespace="ns", name="c", devices=(), units=(unit,))  # type: ignore[arg-type]

    cp = Checkpoint(
        boot_id="b",
        claims={
            "uid-prepared": entry("Prepared", {"daemonId": "aaaaaaaaaaaa", "uuids": ["GPU-1"]}),
            "uid-preparing": entry("Preparing", {"daemonId": "bbbbbbbbbbbb"}),
            "uid-exclusive": entry("Prepared", {"gpu": "GPU-2"}),
        },
        shared={
            "gpu-3/shares": SharedEntry("MpsSlots", "Ready", {"slotDaemon": "cccccccccccc"}),
            "gpu-4/shares": SharedEntry("MpsSlots", "Releasing", {"daemonId": "dddddddddddd"}),
        },
    )
    owners, must_run = daemon_owners(cp)
    assert owners == {
        "aaaaaaaaaaaa": "uid-prepared",
        "bbbbbbbbbbbb": "uid-preparing",
        "cccccccccccc": "gpu-3/shares",
        "dddddddddddd": "gpu-4/shares",
    }
    assert must_run == {"aaaaaaaaaaaa"}


def test_unpreparing_an_unknown_claim_needs_no_api_server(node: Node, tmp_path: Path) -> None:
    """The kubelet's unprepare of a claim the checkpoint does not know looks for daemons
    of that claim: with the API server down it still finishes (its directories say it
    has none), as every unprepare of a claim without daemons did before daemon pods."""
    with PodKubelet(tmp_path / "k") as gone:
        r = runner(gone, node)
    with pytest.raises(ToolError):
        r.present()  # the server is down
    node.preparer(mps_runner=r).unprepare(mps_claim().ref)  # type: ignore[attr-defined]


def test_a_plugin_that_cannot_see_the_daemon_says_it_needs_host_pids(
    node: Node, kubelet: PodKubelet, tmp_path: Path
) -> None:
    """The daemon pod serves (its ready file is written) but this process's /proc does
    not show it, as for a plugin pod without hostPID: the error says so."""
    empty_proc = tmp_path / "proc"
    empty_proc.mkdir()
    p = node.preparer(mps_runner=runner(kubelet, node, start_timeout_s=4, proc=empty_proc))
    said = r"ready file is there but no daemon process is in .*/proc: the plugin needs the host's"
    with pytest.raises(PrepareError, match=said + r" PID namespace \(hostPID\)"):
        p.prepare(mps_claim())
    assert kubelet.pods == {}
