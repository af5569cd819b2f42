"""Emulated NVML while GPUs run: events, recovery action, ECC, lost GPUs, processes, NVLink,
fabric, and the control file that carries them to another process; all through pynvml."""

from __future__ import annotations

import ctypes
import threading
import time

import pynvml
import pytest

from dra_driver.emulation import EmulatedNode, EmulatedNvmlLibrary
from dra_driver.emulation.runtime import CONTROL_FILE, ControlError


@pytest.fixture
def session(make_node):
    node = make_node("dgx-a100-mig")
    with node.nvml():
        pynvml.nvmlInit()
        try:
            yield node
        finally:
            pynvml.nvmlShutdown()


def _event_set(handle, mask):
    es = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(handle, mask, es)
    return es


def test_xid_event_wakes_a_waiting_event_set_with_its_mig_instance(session: EmulatedNode) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    supported = pynvml.nvmlDeviceGetSupportedEventTypes(h)
    assert supported & pynvml.nvmlEventTypeXidCriticalError
    es = _event_set(h, pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError)
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(es, 20)
    threading.Timer(0.05, lambda: session.inject_xid(0, 94, gi=1, ci=0)).start()
    started = time.monotonic()
    event = pynvml.nvmlEventSetWait_v2(es, 5000)
    assert time.monotonic() - started < 1.0
    assert (event.eventType, event.eventData) == (pynvml.nvmlEventTypeXidCriticalError, 94)
    assert (event.gpuInstanceId, event.computeInstanceId) == (1, 0)
    assert pynvml.nvmlDeviceGetUUID(event.device) == session.profile.gpus[0].uuid
    session.inject_xid(0, 79)
    assert pynvml.nvmlEventSetWait_v2(es, 100).gpuInstanceId == 0xFFFFFFFF  # whole GPU
    session.inject_xid(1, 79)  # another GPU: not this set's
    session.set_recovery_action(0, "gpu-reset")  # a type this set did not register
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(es, 50)
    pynvml.nvmlEventSetFree(es)


def test_recovery_action_ecc_and_reset(session: EmulatedNode) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(2)

    def action() -> int:
        (field,) = pynvml.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
        assert field.nvmlReturn == 0
        return int(field.value.uiVal)

    def dbe() -> int:
        return pynvml.nvmlDeviceGetTotalEccErrors(
            h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
        )

    assert (action(), dbe()) == (0, 0)
    session.inject_double_bit_ecc(2)
    session.set_recovery_action(2, "gpu-reset")
    assert (action(), dbe()) == (pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET, 1)
    (other,) = pynvml.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT])
    assert other.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    session.reset_gpu(2)
    assert (action(), dbe()) == (0, 0)
    assert (
        pynvml.nvmlDeviceGetTotalEccErrors(
            h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC
        )
        == 1
    )  # the lifetime counter survives a reset


def test_a_lost_gpu_answers_gpu_is_lost_until_reset(session: EmulatedNode) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(3)
    es = _event_set(h, pynvml.nvmlEventTypeXidCriticalError)
    session.set_lost(3)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetMemoryInfo(h)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlEventSetWait_v2(es, 1000)
    assert pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(4)).total > 0
    session.reset_gpu(3)
    assert pynvml.nvmlDeviceGetMemoryInfo(h).total > 0
    pynvml.nvmlEventSetFree(es)


def test_processes_show_in_process_queries_utilization_and_memory(session: EmulatedNode) -> None:
    full = pynvml.nvmlDeviceGetHandleByIndex(2)  # not in MIG mode
    before = pynvml.nvmlDeviceGetMemoryInfo(full).used
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetProcessUtilization(full, 0)
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(full) == []
    session.set_processes(2, [{"pid": 101, "usedMiB": 1024, "smUtil": 30, "memUtil": 5},
                              {"pid": 102, "usedMiB": 512, "smUtil": 50}])  # fmt: skip
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(full)
    assert [(p.pid, p.usedGpuMemory) for p in procs] == [(101, 1024 * 2**20), (102, 512 * 2**20)]
    assert pynvml.nvmlDeviceGetMemoryInfo(full).used == before + 1536 * 2**20
    samples = pynvml.nvmlDeviceGetProcessUtilization(full, 0)
    assert sorted((s.pid, s.smUtil, s.memUtil) for s in samples) == [(101, 30, 5), (102, 50, 0)]
    assert pynvml.nvmlDeviceGetUtilizationRates(full).gpu == 80
    # MIG: the parent lists every process with its instance; a MIG handle only its own.
    parent = pynvml.nvmlDeviceGetHandleByIndex(0)
    gi = session.profile.gpus[0].mig_instances[0]
    session.set_processes(0, [{"pid": 7, "usedMiB": 100, "gi": gi.gi_id, "ci": gi.ci_id},
                              {"pid": 8, "usedMiB": 200, "gi": 99, "ci": 0}])  # fmt: skip
    assert [(p.pid, p.gpuInstanceId) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(parent)] \
        == [(7, gi.gi_id), (8, 99)]  # fmt: skip
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(mig)] == [7]
    assert pynvml.nvmlDeviceGetMemoryInfo(mig).used == 100 * 2**20
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetUtilizationRates(mig)


def test_nvlink_bridges_and_fabric(make_node) -> None:
    node = make_node("a100-pcie-nvlink")
    with node.nvml():
        pynvml.nvmlInit()
        try:
            h0 = pynvml.nvmlDeviceGetHandleByIndex(0)
            assert [pynvml.nvmlDeviceGetNvLinkState(h0, link) for link in range(12)] == [1] * 12
            with pytest.raises(pynvml.NVMLError_InvalidArgument):
                pynvml.nvmlDeviceGetNvLinkState(h0, 12)
            peer = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(h0, 3)
            assert peer.busId.lower() == "00000000:41:00.0"
            assert pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(h0, 3) == 0  # a GPU
            with pytest.raises(pynvml.NVMLError_NotSupported):
                pynvml.nvmlDeviceGetGpuFabricInfoV(
                    h0, ctypes.byref(pynvml.c_nvmlGpuFabricInfo_v2_t())
                )
        finally:
            pynvml.nvmlShutdown()
    node = make_node("hgx-h100-fabric")
    with node.nvml():
        pynvml.nvmlInit()
        try:
            h = pynvml.nvmlDeviceGetHandleByIndex(5)
            info = pynvml.c_nvmlGpuFabricInfo_v2_t()
            pynvml.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(info))
            assert (info.cliqueId, info.state, info.status) == (7, 3, 0)
            assert bytes(info.clusterUuid).hex() == "8f3a2c615d0e4b7a9c1e2f6d8b4a0c17"
            assert pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(h, 17) == 2  # an NVSwitch
        finally:
            pynvml.nvmlShutdown()
    l4 = make_node("l4-x4")
    with l4.nvml():
        pynvml.nvmlInit()
        try:
            with pytest.raises(pynvml.NVMLError_NotSupported):
                pynvml.nvmlDeviceGetNvLinkState(pynvml.nvmlDeviceGetHandleByIndex(0), 0)
        finally:
            pynvml.nvmlShutdown()


def test_control_file_reaches_another_library_on_the_same_root(make_node) -> None:
    """What a plugin subprocess sees: its own library reads the node's control file."""
    node = make_node("t4")
    other = EmulatedNvmlLibrary(node.profile, control_file=node.host.root / CONTROL_FILE)
    node.set_recovery_action(0, "node-reboot")
    node.set_lost(0)
    node.set_lost(0, False)
    assert other.runtime(0).recovery_action == 2 and not other.runtime(0).lost
    # State survives a restart (a new library replays the file); events do not.
    later = EmulatedNvmlLibrary(node.profile, control_file=node.host.root / CONTROL_FILE)
    assert later.runtime(0).recovery_action == 2


@pytest.mark.parametrize(
    ("op", "message"),
    [
        ({"op": "xid", "gpu": 0}, "xid must be an integer"),
        ({"op": "xid", "gpu": 5, "xid": 79}, "gpu must be an integer 0..0"),
        ({"op": "xid", "gpu": 0, "xid": 79, "gi": 1}, "both gi and ci"),
        ({"op": "boom", "gpu": 0}, "op one of"),
        ({"op": "lost", "gpu": 0, "lost": "yes"}, "true or false"),
        ({"op": "processes", "gpu": 0, "processes": [{"pid": 1}]}, "usedMiB"),
        ({"op": "recovery", "gpu": 0, "action": 1, "extra": 1}, r"unknown field\(s\) \['extra'\]"),
    ],
)
def test_bad_control_operations_name_the_field(make_node, op, message) -> None:
    node = make_node("t4")
    with pytest.raises(ControlError, match=message):
        node.control(op)
    assert not (node.host.root / CONTROL_FILE).exists()  # nothing half-written
