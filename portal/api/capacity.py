"""Pools and capacity over the API: the pool list, the capacity map, node actions, quarantine."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request
from rest_framework.response import Response

from portal import access
from portal.api.base import ApiView, ListApiView, signed_in_user
from portal.api.requests import ReasonInputSerializer
from portal.api.schema import name_nested_serializers
from portal.models import Node
from portal.selectors.capacity import capacity_nodes, offered_profiles, pool_summaries
from portal.services.nodes import device_clear_quarantine, node_cordon, node_drain, node_return


class PoolListApi(ApiView):
    """Pools with their capacity summary and the device profiles they offer."""

    class OutputSerializer(serializers.Serializer[Any]):
        id = serializers.IntegerField(source="pool.pk")
        name = serializers.CharField(source="pool.name")
        gpu_model = serializers.CharField(source="pool.gpu_model")
        gpu_memory_mib = serializers.IntegerField(source="pool.gpu_memory_mib")
        partitioning = serializers.CharField(source="pool.partitioning")
        sharing_engine = serializers.CharField(source="pool.sharing_engine")
        lifecycle = serializers.CharField(source="pool.lifecycle")
        interconnect = serializers.CharField(source="pool.interconnect")
        mig_layout = serializers.ListField(source="pool.mig_layout", child=serializers.CharField())
        inference_floor_milli = serializers.IntegerField(source="pool.inference_floor_milli")
        nodes = serializers.IntegerField()
        cordoned = serializers.IntegerField()
        devices = serializers.IntegerField()
        unhealthy = serializers.IntegerField()
        #: whole GPUs held by pods Quartermaster did not create (docs/kubernetes.md)
        foreign = serializers.IntegerField()
        quarantined = serializers.IntegerField()
        stale = serializers.IntegerField()
        usable = serializers.IntegerField()
        total_milli = serializers.IntegerField()
        allocated_milli = serializers.IntegerField()
        free_milli = serializers.IntegerField()
        profiles = serializers.ListField(child=serializers.CharField())

    @extend_schema(operation_id="pools_list", responses=OutputSerializer(many=True))
    def get(self, request: Request) -> Response:
        rows = pool_summaries()
        for r in rows:
            r["profiles"] = list(offered_profiles(r["pool"]).values_list("name", flat=True))
        return Response(self.OutputSerializer(rows, many=True).data)


class CapacityApi(ListApiView):
    """Admins: node → device → slot, paginated by node."""

    class CellSerializer(serializers.Serializer[Any]):
        # (a field named like a Field attribute: the serializer's metaclass takes fields out of
        # the class, so nothing is shadowed)
        label = serializers.CharField()  # type: ignore[assignment]
        status = serializers.CharField()
        team = serializers.CharField()
        request_id = serializers.IntegerField(allow_null=True)
        width = serializers.IntegerField()

    class DeviceSerializer(serializers.Serializer[Any]):
        id = serializers.IntegerField(source="pk")
        index = serializers.IntegerField()
        model = serializers.CharField()
        partitioning = serializers.CharField()
        healthy = serializers.BooleanField()
        condition = serializers.CharField()
        quarantined = serializers.BooleanField()
        health_reason = serializers.CharField()
        utilization_pct = serializers.IntegerField()
        memory_used_mib = serializers.IntegerField()
        memory_mib = serializers.IntegerField()
        cells = serializers.SerializerMethodField()

        def get_cells(self, obj: Any) -> list[dict[str, Any]]:
            return CapacityApi.CellSerializer(obj.cells, many=True).data  # type: ignore[return-value]

    class OutputSerializer(serializers.Serializer[Any]):
        id = serializers.IntegerField(source="node.pk")
        name = serializers.CharField(source="node.name")
        pool = serializers.CharField(source="node.pool.name")
        ready = serializers.BooleanField(source="node.ready")
        cordoned = serializers.BooleanField(source="node.cordoned")
        draining = serializers.BooleanField(source="node.draining")
        devices = serializers.SerializerMethodField()

        def get_devices(self, obj: Any) -> list[dict[str, Any]]:
            return CapacityApi.DeviceSerializer(obj.devices, many=True).data  # type: ignore[return-value]

    @extend_schema(
        operation_id="capacity_list",
        parameters=[OpenApiParameter("pool", str)],
        responses=OutputSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        access.require_admin_read(request.user)
        nodes = Node.objects.select_related("pool").order_by("pool__name", "name")
        if request.query_params.get("pool"):
            nodes = nodes.filter(pool__name=request.query_params["pool"])
        paginator = PageNumberPagination()
        page = paginator.paginate_queryset(nodes, request, view=self)
        views = capacity_nodes(page or [])
        return paginator.get_paginated_response(self.OutputSerializer(views, many=True).data)


class NodeActionApi(ApiView):
    """Admins: cordon, drain or return a node."""

    class OutputSerializer(serializers.Serializer[Any]):
        id = serializers.IntegerField()
        name = serializers.CharField()
        cordoned = serializers.BooleanField()
        draining = serializers.BooleanField()

    @extend_schema(
        operation_id="nodes_action",
        request=ReasonInputSerializer,
        responses=OutputSerializer,
        parameters=[
            OpenApiParameter(
                "action", str, OpenApiParameter.PATH, enum=["cordon", "drain", "return"]
            )
        ],
    )
    def post(self, request: Request, node_id: int, action: str) -> Response:
        node = access.get_node_for_admin(request.user, node_id)
        serializer = ReasonInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        service = {
            "cordon": node_cordon,
            "drain": node_drain,
            "return": node_return,
        }[action]
        reason = serializer.validated_data.get("reason", "")
        return Response(
            self.OutputSerializer(
                service(actor=signed_in_user(request), node=node, reason=reason)
            ).data
        )


class DeviceClearQuarantineApi(ApiView):
    """Admins: return a quarantined device to service (audited). 400 if it is not quarantined."""

    class OutputSerializer(serializers.Serializer[Any]):
        id = serializers.IntegerField()
        node = serializers.CharField(source="node.name")
        index = serializers.IntegerField()
        quarantined = serializers.BooleanField()
        health_reason = serializers.CharField()

    @extend_schema(
        operation_id="devices_clear_quarantine", request=None, responses=OutputSerializer
    )
    def post(self, request: Request, device_id: int) -> Response:
        device = access.get_device_for_admin(request.user, device_id)
        device = device_clear_quarantine(actor=signed_in_user(request), device=device)
        return Response(self.OutputSerializer(device).data)


name_nested_serializers(globals())
