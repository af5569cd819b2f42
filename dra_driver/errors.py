"""The one base class of every error this package raises on purpose.

Commands catch :class:`DriverError` at their edge (``dra_driver.cli``) and turn
it into one clear line on stderr and an exit code; anything else that escapes
is a bug and keeps its traceback. Each layer defines its own subclasses next
to the code that raises them::

    DriverError
    ├── SettingsError             dra_driver.settings: a flag or env value is invalid (exit 2)
    ├── ClaimError                plugin.claims: a claim reference or object is unusable
    ├── PrepareError              plugin.backend: a backend cannot prepare/unprepare a claim
    ├── KubeError                 plugin.kubeclient: the API server cannot be reached or said no
    ├── SocketError               plugin.sockets: a socket path is unusable
    ├── CheckpointError           gpu.checkpoint: the state file cannot be locked, read, written
    │   └── CheckpointCorruptError                the file exists but cannot be trusted
    ├── CdiError                  gpu.cdi.spec: a CDI spec is invalid or cannot be written
    ├── HookError                 gpu.cdi.hooks: the node cannot run the CDI hook
    ├── ToolError                 gpu.sharing.tools: nvidia-smi / MPS control failed
    ├── ConfigError               gpu.config: an opaque device config is invalid
    ├── DiscoveryError            gpu.hardware.discovery: NVML is unusable on this node
    └── ProfileError              emulation: an emulation profile is invalid
"""

from __future__ import annotations


class DriverError(Exception):
    """An expected failure with a message meant for the operator or the kubelet."""

    exit_code = 1
    """What a command exits with when this error ends it."""
