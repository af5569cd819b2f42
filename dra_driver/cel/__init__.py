"""DRA CEL selectors evaluated as the kube-scheduler evaluates them.

Tooling only (``simulate``, ``explain``): the kubelet plugin never evaluates
CEL, and an import contract keeps this package out of the daemon.
"""

from dra_driver.cel.device import CelDevice, DeviceDataError, cel_device
from dra_driver.cel.engine import (
    CelCompileError,
    CelEngine,
    CelError,
    CelRuntimeError,
    EngineUnavailable,
    available_engines,
    load_engine,
)
from dra_driver.cel.selectors import SelectorEvaluator

__all__ = [
    "CelCompileError",
    "CelDevice",
    "CelEngine",
    "CelError",
    "CelRuntimeError",
    "DeviceDataError",
    "EngineUnavailable",
    "SelectorEvaluator",
    "available_engines",
    "cel_device",
    "load_engine",
]
