"""The kubelet plugin-registration service (``pluginregistration.Registration``).

``GetInfo`` must answer within the kubelet's 1 s deadline, so it only returns
values computed once at start. ``NotifyRegistrationStatus`` is the only way we
learn whether the kubelet accepted us; it is recorded for readiness.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from dra_driver.plugin._proto import pluginregistration_pb2 as pb
from dra_driver.plugin._proto import pluginregistration_pb2_grpc as pb_grpc

DRA_PLUGIN_TYPE = "DRAPlugin"
NODE_SERVICE_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
HEALTH_SERVICE_VERSIONS = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")


def supported_versions(*, health: bool) -> tuple[str, ...]:
    """In preference order: kubelets >= 1.34 take the first entry they know."""
    return NODE_SERVICE_VERSIONS + (HEALTH_SERVICE_VERSIONS if health else ())


@dataclass(frozen=True)
class RegistrationStatus:
    """Last status the kubelet reported; ``at`` is a monotonic timestamp."""

    registered: bool
    error: str
    at: float


class RegistrationState:
    """Thread-safe record of the kubelet's verdict, read by readiness."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._status: RegistrationStatus | None = None

    def record(self, registered: bool, error: str) -> None:
        with self._lock:
            self._status = RegistrationStatus(registered, error, time.monotonic())

    @property
    def status(self) -> RegistrationStatus | None:
        with self._lock:
            return self._status


class RegistrationServicer(pb_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(
        self,
        *,
        driver_name: str,
        endpoint: str,
        versions: tuple[str, ...],
        state: RegistrationState,
        logger: logging.Logger,
    ) -> None:
        self._info = pb.PluginInfo(
            type=DRA_PLUGIN_TYPE,
            name=driver_name,
            endpoint=endpoint,
            supported_versions=list(versions),
        )
        self._state = state
        self._log = logger

    def GetInfo(self, request: Any, context: Any) -> Any:
        return self._info

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self._state.record(bool(request.plugin_registered), str(request.error))
        if request.plugin_registered:
            self._log.info("kubelet registered the plugin")
        else:
            self._log.error("kubelet rejected the plugin registration: %s", request.error)
        return pb.RegistrationStatusResponse()
