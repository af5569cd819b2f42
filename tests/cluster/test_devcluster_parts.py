"""The control-plane building blocks on their own, without Kubernetes binaries:
certificates, process supervision, binary lookup, kubeconfigs, REST input checks."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from dra_driver.devcluster import (
    Binaries,
    BinariesError,
    ComponentError,
    ToolClient,
    api_client,
    find_binaries,
    wait_until,
)
from dra_driver.devcluster.certs import generate_certs, issue_serving_cert
from dra_driver.devcluster.kubeconfig import write_kubeconfig
from dra_driver.devcluster.kueue import webhook_configurations
from dra_driver.devcluster.processes import Component, free_loopback_ports


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_certificates_chain_to_the_run_ca_with_the_right_identities(tmp_path: Path) -> None:
    certs = generate_certs(tmp_path)
    ca = _cert(certs.ca_cert)
    serving = _cert(certs.serving_cert)
    admin = _cert(certs.admin_cert)
    serving.verify_directly_issued_by(ca)
    admin.verify_directly_issued_by(ca)

    san = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in san.get_values_for_type(x509.IPAddress)
    assert "localhost" in san.get_values_for_type(x509.DNSName)
    assert serving.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value == (
        x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH])
    )
    # The apiserver maps O= to groups: system:masters is cluster-admin.
    orgs = admin.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    assert [o.value for o in orgs] == ["system:masters"]
    assert admin.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value == (
        x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH])
    )
    for key in (certs.ca_key, certs.serving_key, certs.admin_key, certs.sa_private_key):
        assert key.stat().st_mode & 0o777 == 0o600, key
    # A second run gets a different CA: nothing is reused.
    other = generate_certs(tmp_path / "other")
    assert _cert(other.ca_cert).public_key() != ca.public_key()


def test_free_loopback_ports_are_distinct_and_bindable() -> None:
    ports = free_loopback_ports(5)
    assert len(set(ports)) == 5
    assert all(1024 < p < 65536 for p in ports)


def test_stop_escalates_to_sigkill_for_a_process_ignoring_sigterm(tmp_path: Path) -> None:
    stubborn = Component(
        "stubborn", ["bash", "-c", "trap '' TERM; echo started; exec sleep 60"], tmp_path
    )
    stubborn.start()
    pid = stubborn.pid
    assert pid is not None
    time.sleep(0.3)
    begin = time.monotonic()
    stubborn.stop(grace=0.5)
    assert time.monotonic() - begin < 5
    assert not stubborn.running()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert "started" in stubborn.log_tail()


def test_wait_healthy_fails_fast_with_the_log_when_the_process_exits(tmp_path: Path) -> None:
    broken = Component("broken", ["bash", "-c", "echo 'bad flag --nope' >&2; exit 3"], tmp_path)
    broken.start()
    with pytest.raises(ComponentError) as err:
        broken.wait_healthy(lambda: (False, "connection refused"), time.monotonic() + 30)
    message = str(err.value)
    assert "broken exited with code 3" in message
    assert "bad flag --nope" in message


def test_wait_healthy_times_out_with_the_last_check(tmp_path: Path) -> None:
    idle = Component("idle", ["sleep", "30"], tmp_path)
    idle.start()
    try:
        with pytest.raises(ComponentError, match=r"idle not healthy after .*last check: 503"):
            idle.wait_healthy(lambda: (False, "503"), time.monotonic() + 0.5)
    finally:
        idle.stop()


def test_missing_binaries_are_an_error_naming_them(tmp_path: Path) -> None:
    (tmp_path / "etcd").write_text("#!/bin/sh\n")
    (tmp_path / "etcd").chmod(0o755)
    (tmp_path / "kube-apiserver").write_text("not executable")
    with pytest.raises(BinariesError) as err:
        Binaries.from_dir(tmp_path)
    assert "kube-apiserver, kube-scheduler, kube-controller-manager" in str(err.value)
    with pytest.raises(BinariesError):
        find_binaries({"DRA_K8S_BIN_DIR": str(tmp_path)})


def test_bin_dir_from_environment(tmp_path: Path) -> None:
    for name in ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager"):
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    found = find_binaries({"DRA_K8S_BIN_DIR": str(tmp_path)})
    assert found.kube_scheduler == tmp_path / "kube-scheduler"


def test_kubeconfig_needs_exactly_one_credential(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    with pytest.raises(ValueError, match="either cert_file"):
        write_kubeconfig(tmp_path / "k", server="https://x", ca_file=ca, user="u")
    with pytest.raises(ValueError, match="either cert_file"):
        write_kubeconfig(
            tmp_path / "k", server="https://x", ca_file=ca, user="u", cert_file=ca, token="t"
        )
    path = write_kubeconfig(tmp_path / "k", server="https://x", ca_file=ca, user="u", token="t")
    assert path.stat().st_mode & 0o777 == 0o600
    config = yaml.safe_load(path.read_text())
    assert config["users"] == [{"name": "u", "user": {"token": "t"}}]
    assert config["clusters"][0]["cluster"] == {
        "server": "https://x",
        "certificate-authority": str(ca),
    }


def test_apply_rejects_objects_without_identity_before_any_request(tmp_path: Path) -> None:
    certs = generate_certs(tmp_path)
    # Port 9 on loopback: nothing listens, so any request would fail differently.
    client = ToolClient(api_client("https://127.0.0.1:9", certs.ca_cert))
    with pytest.raises(ValueError, match="lacks 'kind'"):
        client.apply({"apiVersion": "v1", "metadata": {"name": "x"}}, "m")
    with pytest.raises(ValueError, match=r"lacks metadata\.name"):
        client.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "x-"}}, "m")


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def test_components_die_with_a_hard_killed_parent(tmp_path: Path) -> None:
    """A SIGKILLed test run must not leak an apiserver onto the shared machine."""
    code = (
        "import pathlib, sys, time\n"
        "from dra_driver.devcluster.processes import Component\n"
        "c = Component('orphan', ['sleep', '60'], pathlib.Path(sys.argv[1]))\n"
        "c.start()\n"
        "print(c.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True
    ) as parent:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert _alive(child)
        parent.kill()
    wait_until(lambda: not _alive(child), timeout=10, what=f"orphaned child {child} to die")


def test_serving_certificate_for_a_loopback_component_is_signed_by_the_run_ca(
    tmp_path: Path,
) -> None:
    """What the API server verifies when it calls a webhook at https://127.0.0.1:<port>."""
    certs = generate_certs(tmp_path / "pki")
    cert_path, key_path = issue_serving_cert(certs, tmp_path / "hook", "kueue-webhook")
    cert, ca = _cert(cert_path), _cert(certs.ca_cert)
    cert.verify_directly_issued_by(ca)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in san.get_values_for_type(x509.IPAddress)
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "kueue-webhook"
    assert key_path.stat().st_mode & 0o777 == 0o600


def test_kueue_webhooks_keep_its_kinds_and_jobs_called_by_url() -> None:
    """Only Kueue's own kinds and batch Jobs (the integration enabled), at the loopback
    URL with the CA; the Job webhooks limited to the selected namespaces."""

    def hook(name: str, group: str, path: str) -> dict[str, object]:
        return {"name": name, "failurePolicy": "Fail", "sideEffects": "None",
                "clientConfig": {"service": {"name": "webhook-service", "namespace": "system",
                                             "path": path}},
                "rules": [{"apiGroups": [group], "resources": ["x"]}]}  # fmt: skip

    manifests = [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
         "metadata": {"name": "mutating-webhook-configuration"},
         "webhooks": [hook("mjob.kb.io", "batch", "/mutate-batch-v1-job"),
                      hook("mpod.kb.io", "", "/mutate--v1-pod"),
                      hook("mclusterqueue.kb.io", "kueue.x-k8s.io", "/mutate-cq")]},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
         "metadata": {"name": "validating-webhook-configuration"},
         "webhooks": [hook("vrayjob.kb.io", "ray.io", "/validate-ray")]},
    ]  # fmt: skip
    selector = {"matchLabels": {"team": "a"}}
    (out,) = webhook_configurations(manifests, url="https://127.0.0.1:9443", ca_bundle=b"CA",
                                    prefix="kueue-t", namespace_selector=selector)  # fmt: skip
    assert out["metadata"] == {"name": "kueue-t-mutating-webhook-configuration"}
    assert [h["name"] for h in out["webhooks"]] == ["mjob.kb.io", "mclusterqueue.kb.io"]
    job, queue = out["webhooks"]
    assert job["clientConfig"] == {"url": "https://127.0.0.1:9443/mutate-batch-v1-job",
                                   "caBundle": "Q0E="}  # fmt: skip
    assert job["namespaceSelector"] == selector and "namespaceSelector" not in queue


def test_client_rate_limits_reach_scheduler_and_controller_manager_only_when_set(
    tmp_path: Path,
) -> None:
    from dra_driver.devcluster import ClusterOptions
    from dra_driver.devcluster.controlplane import controller_manager_argv, scheduler_argv

    certs = generate_certs(tmp_path)
    binaries = Binaries(*(tmp_path / n for n in ("etcd", "apiserver", "sched", "kcm")))
    kubeconfig = tmp_path / "admin.kubeconfig"
    tuned = ClusterOptions(client_qps=1000, client_burst=2000)
    for argv in (scheduler_argv, controller_manager_argv):
        default = argv(binaries, ClusterOptions(), certs, kubeconfig, 1)
        assert not [a for a in default if a.startswith("--kube-api-")]
        flags = argv(binaries, tuned, certs, kubeconfig, 1)
        assert "--kube-api-qps=1000" in flags
        assert "--kube-api-burst=2000" in flags
