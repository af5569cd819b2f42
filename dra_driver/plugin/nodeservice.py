"""The DRA node service (``DRAPlugin``) for both v1 and v1beta1.

One implementation, :class:`~dra_driver.plugin.preparing.ClaimService`, sits
behind both versions; this module only converts messages. The two versions
differ only in v1's optional ``Device.share_id``.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from dra_driver.plugin._proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
)
from dra_driver.plugin.claims import ClaimRef
from dra_driver.plugin.preparing import ClaimOutcome, ClaimService


def _refs(request: Any) -> list[ClaimRef]:
    return [ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid) for c in request.claims]


def _prepare_response(pb: ModuleType, outcomes: dict[str, ClaimOutcome], share_ids: bool) -> Any:
    response = pb.NodePrepareResourcesResponse()
    for uid, outcome in outcomes.items():
        entry = response.claims[uid]
        if outcome.error:
            entry.error = outcome.error
            continue
        for d in outcome.devices:
            device = entry.devices.add(
                request_names=list(d.request_names),
                pool_name=d.pool_name,
                device_name=d.device_name,
                cdi_device_ids=list(d.cdi_device_ids),
            )
            if share_ids and d.share_id is not None:
                device.share_id = d.share_id
    return response


def _unprepare_response(pb: ModuleType, outcomes: dict[str, ClaimOutcome]) -> Any:
    response = pb.NodeUnprepareResourcesResponse()
    for uid, outcome in outcomes.items():
        response.claims[uid].error = outcome.error
    return response


class DRAPluginV1(dra_v1_pb2_grpc.DRAPluginServicer):  # type: ignore[misc]
    def __init__(self, service: ClaimService) -> None:
        self._service = service

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        return _prepare_response(dra_v1_pb2, self._service.prepare(_refs(request)), True)

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        return _unprepare_response(dra_v1_pb2, self._service.unprepare(_refs(request)))


class DRAPluginV1beta1(dra_v1beta1_pb2_grpc.DRAPluginServicer):  # type: ignore[misc]
    def __init__(self, service: ClaimService) -> None:
        self._service = service

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        return _prepare_response(dra_v1beta1_pb2, self._service.prepare(_refs(request)), False)

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        return _unprepare_response(dra_v1beta1_pb2, self._service.unprepare(_refs(request)))


def add_node_services(server: Any, service: ClaimService) -> None:
    dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(DRAPluginV1(service), server)
    dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(DRAPluginV1beta1(service), server)
