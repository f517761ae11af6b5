"""Capacity planning over the API: pending demand per pool and device profile."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_serializer
from rest_framework import serializers
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response

from portal import access
from portal.api.base import ApiView, ListApiView, paginate
from portal.selectors.audit import policy_versions
from portal.selectors.demand import pending_demand


class DemandApi(ApiView):
    """Pending demand per pool ("any": any pool) and device profile, of the requests you
    may see (all for admins): GPUs wanted, and how much of it fits no node that exists
    (only nodes an autoscaled pool may add could hold it)."""

    class OutputSerializer(serializers.Serializer[Any]):
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
        rows = pending_demand(request.user)
        return Response(self.OutputSerializer(rows, many=True).data)


class PolicyVersionListApi(ListApiView):
    """Admins and auditors: every applied change of scheduling policy (quota, class, pool,
    profile), newest first; decisions record the number in force (`policy_version`)."""

    class OutputSerializer(serializers.Serializer[Any]):
        number = serializers.IntegerField()
        action = serializers.CharField()
        object_type = serializers.CharField()
        object_id = serializers.CharField()
        actor = serializers.CharField(source="actor_name")
        before = serializers.JSONField()
        after = serializers.JSONField()
        created_at = serializers.DateTimeField()

    @extend_schema(operation_id="policy_versions_list", responses=OutputSerializer(many=True))
    def get(self, request: Request) -> Response:
        if not access.sees_all(request.user):
            raise PermissionDenied("Only platform admins and auditors read the policy history.")
        return paginate(self, request, policy_versions(), self.OutputSerializer)


# Named after their views in the schema, as portal/api/ names its own ("Output" twice
# made two components of one name).
for _view in (DemandApi, PolicyVersionListApi):
    extend_schema_serializer(component_name=_view.__name__ + "Output")(_view.OutputSerializer)
