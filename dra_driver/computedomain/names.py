"""Names shared by the ComputeDomain controller, kubelet plugin and daemon.

Each is what manifests written for NVIDIA's driver already use (API group, kind,
DeviceClass and driver names, opaque config kinds), or ours where NVIDIA's design made
every node write one object: here the controller is the only writer of cluster-wide
status, and each daemon owns only its own pod.
"""

import hashlib
from typing import Final, Literal

API_GROUP: Final = "resource.nvidia.com"
API_VERSION: Final = "v1beta1"
DOMAIN_KIND: Final = "ComputeDomain"
DOMAIN_PLURAL: Final = "computedomains"
CLIQUE_KIND: Final = "ComputeDomainClique"
"""Per (domain, clique) status, named ``<domain uid>.<clique id>`` in the driver's
namespace; written by the controller only (daemon indices and readiness)."""
CLIQUE_PLURAL: Final = "computedomaincliques"

DRIVER_NAME: Final = "compute-domain.nvidia.com"
CHANNEL_CLASS: Final = "compute-domain-default-channel.nvidia.com"
DAEMON_CLASS: Final = "compute-domain-daemon.nvidia.com"
CHANNEL_CONFIG_KIND: Final = "ComputeDomainChannelConfig"
"""Opaque parameters of a workload's channel request: ``domainID`` and ``allocationMode``."""
DAEMON_CONFIG_KIND: Final = "ComputeDomainDaemonConfig"
"""Opaque parameters of a daemon's request: ``domainID``."""

DOMAIN_LABEL: Final = "resource.nvidia.com/computeDomain"
"""Value: the domain's UID. On a node once a workload channel is prepared there (the
domain's DaemonSet selects on it), and on everything the controller creates."""
CLIQUE_LABEL: Final = "resource.nvidia.com/computeDomain.cliqueID"
"""On a daemon pod: the clique (``<clusterUUID>.<cliqueId>``) of its node."""
GPU_CLIQUE_LABEL: Final = "nvidia.com/gpu.clique"
"""On a node: its clique (``<clusterUUID>.<cliqueId>``), the key NVIDIA's GPU Feature
Discovery sets and NVIDIA's ComputeDomain examples select nodes by; the plugin sets it
too, so those manifests schedule on clusters without GFD."""
FINALIZER: Final = "resource.nvidia.com/computeDomain"

CHANNEL_DEVICE: Final = "channel-0"
DAEMON_DEVICE: Final = "daemon-0"
CLIQUE_ATTRIBUTE: Final = "cliqueID"
"""String attribute on both devices; empty on a node whose GPUs are in no clique."""
MAX_CHANNELS: Final = 2048
"""``allocationMode: All`` gives the container every channel the driver creates."""
CHANNEL_DIR: Final = "/dev/nvidia-caps-imex-channels"

AllocationMode = Literal["Single", "All"]


NO_CLIQUE_PREFIX: Final = "none-"
_LABEL_VALUE_MAX = 63


def no_clique_id(node_name: str) -> str:
    """The clique of a node whose GPUs are in no NVLink clique: a clique of its own,
    ``none-<node name>``. It is a label value on the daemon pod (at most 63 characters)
    and part of the clique object's name, so a longer one keeps the name's first
    characters, without a trailing ``-`` or ``.``, and ends in 10 hex digits of the
    whole name's SHA-256: the same node always gets the same id, two nodes never share
    one in practice."""
    plain = NO_CLIQUE_PREFIX + node_name
    if len(plain) <= _LABEL_VALUE_MAX:
        return plain
    digest = hashlib.sha256(node_name.encode()).hexdigest()[:10]
    keep = _LABEL_VALUE_MAX - len(NO_CLIQUE_PREFIX) - 1 - len(digest)
    return f"{NO_CLIQUE_PREFIX}{node_name[:keep].rstrip('-.')}-{digest}"
