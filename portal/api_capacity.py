"""Capacity planning over the API: pending demand per pool and device profile."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from portal import selectors
from portal.api import ApiView


class DemandApi(ApiView):
    """Pending demand per pool ("any": any pool) and device profile, of the requests you
    may see (all for admins): GPUs wanted, and how much of it fits no node that exists
    (only nodes an autoscaled pool may add could hold it)."""

    class OutputSerializer(serializers.Serializer):
        pool = serializers.CharField()
        profile = serializers.CharField()
        requests = serializers.IntegerField()
        units = serializers.IntegerField(help_text="devices, MIG instances or slices wanted")
        gpus_milli = serializers.IntegerField()
        unfit_requests = serializers.IntegerField()
        unfit_gpus_milli = serializers.IntegerField()
        provisioning_nodes = serializers.IntegerField(
            help_text="nodes the pool asked for and still waits for"
        )

    @extend_schema(operation_id="capacity_demand", responses=OutputSerializer(many=True))
    def get(self, request: Request) -> Response:
        rows = selectors.pending_demand(request.user)
        return Response(self.OutputSerializer(rows, many=True).data)
