"""Configuration files of one real node: containerd, the kubelet and CNI.

Every path a component would otherwise put on the host (``/var/lib/kubelet``,
``/var/lib/containerd``, ``/run/containerd``, ``/var/log/pods``,
``/opt/containerd``, ``/usr/libexec/kubernetes``, runc's state, the NRI socket)
is moved below the run directory, so two runs never share state. Each setting
that departs from upstream defaults says why in a comment of the written file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dra_driver.devcluster.nodenet import BRIDGE, POD_SUBNET


@dataclass(frozen=True)
class NodePaths:
    """Where one node's state lives (all below ``workdir``; short: unix sockets)."""

    workdir: Path

    @property
    def kubelet_root(self) -> Path:
        return self.workdir / "kubelet"

    @property
    def containerd_root(self) -> Path:
        return self.workdir / "ctd"

    @property
    def containerd_state(self) -> Path:
        return self.workdir / "ctd-run"

    @property
    def containerd_socket(self) -> Path:
        return self.containerd_state / "containerd.sock"

    @property
    def runc_root(self) -> Path:
        return self.workdir / "runc"

    @property
    def cdi_dir(self) -> Path:
        return self.workdir / "cdi"

    @property
    def pod_logs(self) -> Path:
        return self.workdir / "pod-logs"

    @property
    def etc(self) -> Path:
        return self.workdir / "etc"

    @property
    def pki(self) -> Path:
        return self.workdir / "pki"

    @property
    def logs(self) -> Path:
        return self.workdir / "logs"

    @property
    def fake_sysctl(self) -> Path:
        return self.workdir / "sysctl"


def _toml(value: Any) -> str:
    """A TOML scalar or array (JSON strings and numbers are valid TOML)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value)


def containerd_config(
    paths: NodePaths, *, cni_bin: Path, runc: Path, sandbox_image: str, cdi_dirs: list[Path]
) -> str:
    """containerd 2.x config (format version 3) for CRI with CDI on this machine."""
    v = {
        "root": str(paths.containerd_root),
        "state": str(paths.containerd_state),
        "address": str(paths.containerd_socket),
        "sandbox": sandbox_image,
        "cdi": [str(d) for d in cdi_dirs],
        "runc": str(runc),
        "runc_root": str(paths.runc_root),
        "cni_bin": [str(cni_bin)],
        "cni_conf": str(paths.etc / "cni"),
        "opt": str(paths.workdir / "opt"),
    }
    t = {k: _toml(val) for k, val in v.items()}
    return f"""# Written by dra_driver.devcluster for one real node; see nodeconfig.py.
version = 3
root = {t["root"]}
state = {t["state"]}
imports = []  # no host-wide /etc/containerd/conf.d

[grpc]
  address = {t["address"]}

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      # No registry: imported with `ctr images import` before the kubelet starts.
      sandbox = {t["sandbox"]}

  [plugins.'io.containerd.cri.v1.runtime']
    # CDI is always on in containerd 2.x; the DRA driver's --cdi-dir must be listed.
    cdi_spec_dirs = {t["cdi"]}
    disable_apparmor = true
    # This machine drops CAP_SYS_RESOURCE: nothing may lower oom_score_adj (runc
    # failed on the pause container's -998), so clamp to containerd's own.
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = {t["runc"]}
          Root = {t["runc_root"]}
          SystemdCgroup = false  # cgroup v1 here; the kubelet uses cgroupfs
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = {t["cni_bin"]}
      conf_dir = {t["cni_conf"]}
      use_internal_loopback = true

  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'

  [plugins.'io.containerd.internal.v1.opt']
    path = {t["opt"]}

  [plugins.'io.containerd.nri.v1.nri']
    disable = true  # its socket would be /var/run/nri/nri.sock on the host
"""


def cni_config(paths: NodePaths, network: str, subnet: str = POD_SUBNET) -> dict[str, Any]:
    """Bridge + host-local on ``subnet``: the only link kinds this kernel offers are veth
    and bridge."""
    return {
        "cniVersion": "1.0.0",
        "name": network,
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": subnet}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(paths.workdir / "cni-ipam"),
                },
            }
        ],
    }


def kubelet_config(
    paths: NodePaths,
    *,
    ca_file: Path,
    cgroup_root: str,
    feature_gates: Mapping[str, bool],
) -> dict[str, Any]:
    """KubeletConfiguration for a cgroup-v1 machine shared with other work."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,  # 1.35+ refuses cgroup v1 unless told so
        "cgroupDriver": "cgroupfs",  # no systemd as PID 1
        "cgroupRoot": cgroup_root,  # per run: /<cgroup_root>/kubepods/...
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{paths.containerd_socket}",
        # The node's own network namespace: these ports collide with nobody.
        "address": "127.0.0.1",
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca_file)},
        },
        "authorization": {"mode": "Webhook"},
        "resolvConf": "",  # no DNS add-on
        "clusterDomain": "cluster.local",
        # Never evict test pods over other jobs' use of this shared machine.
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "volumePluginDir": str(paths.workdir / "volume-plugins"),
        "podLogsDir": str(paths.pod_logs),
        "syncFrequency": "10s",
        "nodeStatusUpdateFrequency": "5s",
        "fileCheckFrequency": "5s",
        # The kubelet writes vm.* and kernel.* sysctls unless this is true, and with
        # true refuses to start when they differ: it runs with those files faked
        # (nodelaunch), so the machine's values are never changed.
        "protectKernelDefaults": False,
        "featureGates": dict(feature_gates),
    }


def write_yaml(path: Path, doc: Mapping[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(dict(doc), sort_keys=False))
    return path
