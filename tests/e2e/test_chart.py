"""The Helm chart: lint, schema, rendered manifests, parity with deploy/rbac
and deploy/deviceclasses, and acceptance by the real API server (dry run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.devcluster import ApiError, Cluster
from dra_driver.gpu.hardware.consumable import ConsumableGpus
from tests.e2e.helm import (
    CHART,
    MANIFESTS,
    ROOT,
    build_helm,
    by_kind_name,
    plugin_container,
    render,
    run_helm,
    strip_labels,
)


@pytest.fixture(scope="module")
def helm() -> Path:
    return build_helm()


def load_dir(path: Path) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for file in sorted(path.glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(file.read_text()) if d)
    assert docs, f"no manifests in {path}"
    return docs


def test_lint_strict_passes(helm: Path) -> None:
    result = run_helm(helm, "lint", "--strict", str(CHART))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("setting", "field"),
    [
        ("emulate=dgx-a101", "emulate"),
        ("emulate=profiles/h100.yaml", "emulate"),  # a profile file by absolute path only
        ("migMode=auto", "migMode"),
        ("dynamicMigAttributes=lean", "dynamicMigAttributes"),
        ("healthPort=0", "healthPort"),
        ("kubeletRootDir=var/lib/kubelet", "kubeletRootDir"),
        ("driverName=GPU_NVIDIA", "driverName"),
        ("cdiHook.path=relative/hook", "cdiHook"),
        ("no.such=1", "no"),
    ],
)
def test_schema_rejects_bad_values(helm: Path, setting: str, field: str) -> None:
    result = run_helm(helm, "template", "x", str(CHART), "--set", setting)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert field in result.stderr


def test_committed_manifests_are_a_fresh_render(helm: Path) -> None:
    """deploy/manifests is generated from the chart; re-run scripts/render-manifests.sh."""
    committed = [d for d in yaml.safe_load_all(MANIFESTS.read_text()) if d]
    assert committed[0] == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "dra-driver"},
    }
    assert committed[1:] == render(helm)


def test_rbac_equals_deploy_rbac(helm: Path) -> None:
    """The chart is the source of truth; deploy/rbac must say exactly the same."""
    chart = by_kind_name([strip_labels(o) for o in render(helm)])
    for obj in load_dir(ROOT / "deploy" / "rbac"):
        key = (obj["kind"], obj["metadata"]["name"])
        assert key in chart, f"chart lacks {key}"
        assert chart[key] == obj, f"{key} differs between the chart and deploy/rbac"


def test_deviceclasses_equal_deploy_deviceclasses(helm: Path) -> None:
    chart = by_kind_name([strip_labels(o) for o in render(helm)])
    shipped = load_dir(ROOT / "deploy" / "deviceclasses")
    assert {o["metadata"]["name"] for o in shipped} == {
        name for kind, name in chart if kind == "DeviceClass"
    }
    for obj in shipped:
        rendered = chart[("DeviceClass", obj["metadata"]["name"])]
        assert rendered == obj, f"DeviceClass {obj['metadata']['name']} differs"


def daemonset(objs: list[dict[str, Any]]) -> dict[str, Any]:
    (ds,) = [o for o in objs if o["kind"] == "DaemonSet"]
    return ds


def test_host_paths_are_mounted_at_the_same_path_and_probes_hit_the_health_port(
    helm: Path,
) -> None:
    ds = daemonset(
        render(helm, "--set", "kubeletRootDir=/data/kubelet", "--set", "healthPort=9123")
    )
    pod = ds["spec"]["template"]["spec"]
    container = plugin_container(pod["containers"])
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    for name in ("plugins-registry", "plugins", "cdi", "dev"):
        assert mounts[name] == host[name], name
    assert host["plugins-registry"] == "/data/kubelet/plugins_registry"
    assert host["plugins"] == "/data/kubelet/plugins"
    assert "--kubelet-registry-dir=/data/kubelet/plugins_registry" in container["args"]
    assert "--kubelet-plugins-dir=/data/kubelet/plugins" in container["args"]
    env = {e["name"]: e for e in container["env"]}
    assert env["DRA_HEALTH_PORT"]["value"] == "9123"
    assert mounts["driver-root"] == "/driver-root"
    assert {m["name"]: m.get("readOnly", False) for m in container["volumeMounts"]}["driver-root"]
    assert container["ports"] == [{"name": "health", "containerPort": 9123, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert env["DRA_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert pod["serviceAccountName"] == "dra-driver-kubelet-plugin"


def test_consumable_gpus_reach_the_plugin_through_its_env(
    helm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def env(*args: str) -> dict[str, str]:
        container = plugin_container(
            daemonset(render(helm, *args))["spec"]["template"]["spec"]["containers"]
        )
        return {e["name"]: e.get("value", "") for e in container["env"]}

    from dra_driver.cli import build_parser

    assert env()["DRA_CONSUMABLE_GPUS"] == "none"
    value = env("--set-string", "consumableGpus=NVIDIA L4")["DRA_CONSUMABLE_GPUS"]
    parser = build_parser(environ={"DRA_CONSUMABLE_GPUS": value})
    args = parser.parse_args(["kubelet-plugin", "--node-name=n"])
    assert args.consumable_gpus == ConsumableGpus(names=frozenset({"NVIDIA L4"}))


def test_mps_slots_reach_the_plugin_through_its_env(helm: Path) -> None:
    from dra_driver.cli import build_parser
    from dra_driver.gpu.hardware.consumable import MpsSlots

    container = plugin_container(daemonset(render(helm))["spec"]["template"]["spec"]["containers"])
    assert {e["name"]: e.get("value") for e in container["env"]}["DRA_MPS_SLOTS"] == "none"
    rendered = render(helm, "--set-string", "mpsSlots=NVIDIA L4=4\\,GPU-1=2")
    container = plugin_container(daemonset(rendered)["spec"]["template"]["spec"]["containers"])
    value = {e["name"]: e.get("value", "") for e in container["env"]}["DRA_MPS_SLOTS"]
    args = build_parser(environ={"DRA_MPS_SLOTS": value}).parse_args(
        ["kubelet-plugin", "--node-name=n"]
    )
    assert args.mps_slots == MpsSlots(counts=(("NVIDIA L4", 4), ("GPU-1", 2)))


def test_cdi_hook_values_reach_the_plugin_s_settings(helm: Path) -> None:
    """Default: the image's hook copied under the kubelet's plugins dir (mounted at the
    same path). An administrator's own (the toolkit's /usr/bin/nvidia-cdi-hook): its dir
    mounted read-only at /cdi-hook, never over the image's /usr/bin, and only checked."""
    from dra_driver.cli import build_parser
    from dra_driver.settings import daemon_settings

    def settings(*args: str) -> tuple[Any, dict[str, Any], dict[str, Any]]:
        pod = daemonset(render(helm, *args))["spec"]["template"]["spec"]
        container = plugin_container(pod["containers"])
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        parser = build_parser(environ={**env, "DRA_NODE_NAME": "n", "DRA_NAMESPACE": "ns"})
        gpu = daemon_settings(parser.parse_args(container["args"])).gpu
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        return gpu, mounts, {v["name"]: v for v in pod["volumes"]}

    gpu, mounts, volumes = settings()
    hook = Path("/var/lib/kubelet/plugins/gpu.nvidia.com/nvidia-cdi-hook")
    assert (gpu.cdi_hook_path, gpu.cdi_hook_local_path) == (hook, hook)
    assert gpu.cdi_hook_source == Path("nvidia-cdi-hook")  # the image's, on PATH
    assert "cdi-hook" not in mounts and mounts["plugins"]["mountPath"] == str(hook.parents[1])

    gpu, mounts, volumes = settings(
        "--set", "cdiHook.path=/usr/bin/nvidia-cdi-hook", "--set", "cdiHook.install=false"
    )
    assert gpu.cdi_hook_path == Path("/usr/bin/nvidia-cdi-hook")
    assert gpu.cdi_hook_local_path == Path("/cdi-hook/nvidia-cdi-hook")
    assert gpu.cdi_hook_source is None
    assert mounts["cdi-hook"] == {"name": "cdi-hook", "mountPath": "/cdi-hook", "readOnly": True}
    assert volumes["cdi-hook"]["hostPath"] == {"path": "/usr/bin", "type": "Directory"}

    gpu, mounts, volumes = settings("--set", "cdiHook.path=/opt/nvidia/hook")
    assert gpu.cdi_hook_source == Path("nvidia-cdi-hook")
    assert mounts["cdi-hook"]["readOnly"] is False
    assert volumes["cdi-hook"]["hostPath"] == {"path": "/opt/nvidia", "type": "DirectoryOrCreate"}


def test_mps_daemon_values_reach_the_plugin_s_settings(helm: Path) -> None:
    """Default: daemon pods in the release namespace (downward API), from the plugin's own
    image with its priority class, the host's PID namespace (the plugin finds the daemons
    in /proc) even without usage metrics, a Role on pods and the admission policy that
    confines it. ``process``: none of it, and no rule on pods anywhere."""
    from dra_driver.cli import build_parser
    from dra_driver.settings import MpsDaemonsSettings, daemon_settings

    def rendered(*args: str) -> tuple[Any, dict[str, Any], set[tuple[str, str]], list[Any]]:
        objs = render(helm, "--set", "metrics.usageIntervalSeconds=0", *args)
        pod = daemonset(objs)["spec"]["template"]["spec"]
        container = plugin_container(pod["containers"])
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        refs = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
                for e in container["env"] if "valueFrom" in e}  # fmt: skip
        fields = {"spec.nodeName": "n", "metadata.uid": "u", "metadata.namespace": "gpu-ops"}
        parser = build_parser(environ={**env, **{k: fields[v] for k, v in refs.items()}})
        gpu = daemon_settings(parser.parse_args(container["args"])).gpu
        resources = [r for o in objs for rule in o.get("rules", []) for r in rule["resources"]]
        return gpu, pod, {(o["kind"], o["metadata"]["name"]) for o in objs}, resources

    pod_policy = {("ValidatingAdmissionPolicy", "dra-driver-mps-daemon-pods"),
                  ("ValidatingAdmissionPolicyBinding", "dra-driver-mps-daemon-pods")}  # fmt: skip
    gpu, pod, objs, resources = rendered(
        "--set", "image.repository=reg/dra", "--set", "image.tag=1.2"
    )
    assert gpu.mps_daemons == MpsDaemonsSettings(
        namespace="gpu-ops", image="reg/dra:1.2", priority_class="system-node-critical"
    )
    assert pod["hostPID"] is True
    assert ("Role", "dra-driver-mps-daemons") in objs
    assert ("RoleBinding", "dra-driver-mps-daemons") in objs
    assert pod_policy <= objs and "pods" in resources
    # No rights on pods at all, and no policy for them, when the daemons are children
    # (the ComputeDomain controller's and plugin's Roles, which read pods, left out).
    gpu, pod, objs, resources = rendered(
        "--set", "mpsDaemons=process", "--set", "computeDomains.enabled=false"
    )
    assert gpu.mps_daemons is None
    assert "hostPID" not in pod
    assert not {kind for kind, _ in objs} & {"Role", "RoleBinding"}
    assert not pod_policy & objs
    assert not [r for r in resources if r == "*" or r.startswith("pods")], resources


def test_rolling_update_switch(helm: Path) -> None:
    surge = daemonset(render(helm))
    assert surge["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    env = {e["name"] for e in surge["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "DRA_ROLLING_UPDATE_UID" in env
    plain = daemonset(render(helm, "--set", "rollingUpdate.enabled=false"))
    assert plain["spec"]["updateStrategy"]["rollingUpdate"] == {"maxUnavailable": 1}
    env = {e["name"] for e in plain["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "DRA_ROLLING_UPDATE_UID" not in env


def test_optional_parts_can_be_left_out(helm: Path) -> None:
    kinds = {
        o["kind"]
        for o in render(
            helm,
            "--set",
            "deviceClasses.enabled=false",
            "--set",
            "validatingAdmissionPolicy.enabled=false",
            "--set",
            "computeDomains.enabled=false",
        )
    }
    # The MPS daemon pod policy stays: it ships with the Role on pods it confines. The
    # CRDs stay too (crds/: Helm installs them once and never removes them).
    assert kinds == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet", "Role",
                     "RoleBinding", "ValidatingAdmissionPolicy",
                     "ValidatingAdmissionPolicyBinding", "CustomResourceDefinition"}  # fmt: skip


def test_api_server_accepts_every_rendered_object(cluster: Cluster, helm: Path) -> None:
    """Server-side dry run of the plain manifests: full validation, admission and
    CEL compilation in the real kube-apiserver, nothing persisted."""
    objs = [d for d in yaml.safe_load_all(MANIFESTS.read_text()) if d]
    cluster.create_namespace("dra-driver")
    for obj in objs[1:]:
        meta = obj["metadata"]
        path = cluster.rest.path_for(
            obj["apiVersion"], obj["kind"], namespace=meta.get("namespace")
        )
        try:
            stored = cluster.rest.request("POST", path, obj, query={"dryRun": "All"})
        except ApiError as err:
            if err.status != 409:  # already exists (another module applied deploy/rbac)
                raise
            stored = cluster.rest.request(
                "PUT",
                cluster.rest.object_path(obj),
                {
                    **obj,
                    "metadata": {
                        **meta,
                        "resourceVersion": cluster.rest.get(cluster.rest.object_path(obj))[
                            "metadata"
                        ]["resourceVersion"],
                    },
                },
                query={"dryRun": "All"},
            )
        assert stored["kind"] == obj["kind"]
        assert stored["metadata"]["name"] == meta["name"]


def test_api_server_rejects_a_broken_render(cluster: Cluster, helm: Path) -> None:
    """The dry run is a real check: a bad hostPath type is refused by validation."""
    ds = daemonset(render(helm))
    ds["spec"]["template"]["spec"]["volumes"][0]["hostPath"]["type"] = "Folder"
    cluster.create_namespace("dra-driver")
    with pytest.raises(ApiError) as err:
        cluster.rest.request(
            "POST",
            cluster.rest.path_for("apps/v1", "DaemonSet", namespace="dra-driver"),
            ds,
            query={"dryRun": "All"},
        )
    assert err.value.status == 422
    assert "hostPath.type" in str(err.value)


def test_daemonset_args_are_accepted_by_the_real_command(helm: Path) -> None:
    """Every flag the chart passes exists in ``dra-driver kubelet-plugin``, with the
    values the chart means (parsed by the CLI's own parser)."""
    from dra_driver.cli import build_parser

    ds = daemonset(
        render(
            helm, "--set", "emulate=dgx-a100", "--set", "kubeletRootDir=/k",
            "--set", "migMode=dynamic", "--set", "dynamicMigAttributes=compact",
        )
    )  # fmt: skip
    container = plugin_container(ds["spec"]["template"]["spec"]["containers"])
    parser = build_parser()
    args = parser.parse_args(["--log-format=json", *container["args"], "--node-name=n1"])
    assert args.command == "kubelet-plugin"
    assert str(args.kubelet_registry_dir) == "/k/plugins_registry"
    assert str(args.kubelet_plugins_dir) == "/k/plugins"
    assert str(args.cdi_dir) == "/var/run/cdi"
    assert str(args.driver_root) == "/driver-root"
    assert args.emulate == "dgx-a100"
    assert args.driver_name == "gpu.nvidia.com"
    assert args.mig_mode == "dynamic"
    assert args.dynamic_mig_attributes == "compact"


@pytest.mark.parametrize("version", ["1.34", "1.35", "1.36", "1.37"])
def test_manifests_match_the_strict_schemas_of_every_supported_version(version: str) -> None:
    """kubeVersion >= 1.34: every object must be valid there too, not only on the
    1.37 API server the dry run uses (strict: no unknown fields)."""
    import kubernetes_validate

    for obj in yaml.safe_load_all(MANIFESTS.read_text()):
        if obj:
            kubernetes_validate.validate(obj, version, strict=True)


def test_strict_schema_check_catches_a_misspelt_field() -> None:
    import kubernetes_validate

    ds = next(
        o for o in yaml.safe_load_all(MANIFESTS.read_text()) if o and o["kind"] == "DaemonSet"
    )
    ds["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {"path": "/"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, "1.34", strict=True)
