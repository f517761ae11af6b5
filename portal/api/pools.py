"""Pools and workload classes over the API: everyone reads them, admins create, change, retire."""

from __future__ import annotations

from typing import Any

from django.http import Http404
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from portal import access
from portal.api.base import (
    ApiView,
    ListApiView,
    StrictSerializer,
    created,
    paginate,
    signed_in_user,
    validated,
)
from portal.api.capacity import PoolListApi
from portal.models import DeviceProfile, Pool, Team, WorkloadClass
from portal.services.pools import (
    pool_create,
    pool_retire,
    pool_update,
    workload_class_create,
    workload_class_retire,
    workload_class_update,
)


class PoolOutputSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    name = serializers.CharField()
    gpu_model = serializers.CharField()
    gpu_memory_mib = serializers.IntegerField()
    partitioning = serializers.CharField()
    time_slicing_replicas = serializers.IntegerField()
    sharing_engine = serializers.CharField()
    mig_layout = serializers.ListField(child=serializers.CharField())
    node_selector = serializers.DictField(child=serializers.CharField())
    taints = serializers.ListField(child=serializers.DictField())
    lifecycle = serializers.CharField()
    inference_floor_milli = serializers.IntegerField()
    burn_in_new_nodes = serializers.BooleanField()
    retired_at = serializers.DateTimeField(allow_null=True)
    config_managed = serializers.BooleanField()


class _PoolFields(StrictSerializer):
    """What an admin may set on a pool; the service checks selectors, taints and MIG geometry."""

    architecture = serializers.CharField(max_length=50, required=False, allow_blank=True)
    interconnect = serializers.CharField(max_length=20, required=False)
    time_slicing_replicas = serializers.IntegerField(min_value=1, required=False)
    sharing_engine = serializers.ChoiceField(choices=Pool.SharingEngine.choices, required=False)
    mig_layout = serializers.JSONField(required=False)
    node_selector = serializers.JSONField(required=False)
    taints = serializers.JSONField(required=False)
    lifecycle = serializers.ChoiceField(choices=Pool.Lifecycle.choices, required=False)
    inference_floor_milli = serializers.IntegerField(min_value=0, required=False)
    #: nodes joining the pool serve only after passing a burn-in (docs/lifecycle.md)
    burn_in_new_nodes = serializers.BooleanField(required=False)


class PoolCreateSerializer(_PoolFields):
    name = serializers.CharField(max_length=63)
    gpu_model = serializers.CharField(max_length=100)
    gpu_memory_mib = serializers.IntegerField(min_value=1)
    partitioning = serializers.ChoiceField(choices=Pool.Partitioning.choices, required=False)


class RetireSerializer(StrictSerializer):
    confirm = serializers.BooleanField(default=False)
    #: where waiting requests go (a pool or class name); none: they are cancelled
    move_to = serializers.CharField(required=False, allow_blank=True)


class PoolListCreateApi(PoolListApi):
    """Every pool with its capacity (shared inventory); admins create one (audited)."""

    @extend_schema(
        operation_id="pools_create",
        request=PoolCreateSerializer,
        responses={201: PoolOutputSerializer},
    )
    def post(self, request: Request) -> Response:
        access.require_admin(request.user)
        data = validated(PoolCreateSerializer, request)
        pool = pool_create(actor=signed_in_user(request), **data)
        return created(PoolOutputSerializer(pool).data)


class PoolDetailApi(ApiView):
    """One pool's settings, for admins and auditors (everyone reads the list)."""

    @extend_schema(operation_id="pools_read", responses=PoolOutputSerializer)
    def get(self, request: Request, pool_id: int) -> Response:
        access.require_admin_read(request.user)
        return Response(PoolOutputSerializer(access.get_pool(request.user, pool_id)).data)

    @extend_schema(operation_id="pools_update", request=_PoolFields, responses=PoolOutputSerializer)
    def patch(self, request: Request, pool_id: int) -> Response:
        pool = access.get_pool_for_admin(request.user, pool_id)
        data = validated(_PoolFields, request)
        pool = pool_update(actor=signed_in_user(request), pool=pool, **data)
        return Response(PoolOutputSerializer(pool).data)

    @extend_schema(operation_id="pools_retire", request=RetireSerializer, responses={204: None})
    def delete(self, request: Request, pool_id: int) -> Response:
        """Retire (never delete): with work in the pool, a 400 says what happens to it until
        `confirm` is true; waiting requests move to `move_to` or are cancelled."""
        pool = access.get_pool_for_admin(request.user, pool_id)
        pool_retire(actor=signed_in_user(request), pool=pool, **_retire_options(request, Pool))
        return Response(status=status.HTTP_204_NO_CONTENT)


def _retire_options(request: Request, model: type[Pool] | type[WorkloadClass]) -> dict[str, Any]:
    """A retire's `confirm`, and the pool or class named by `move_to` (none: cancelled)."""
    data = validated(RetireSerializer, request, query=True)
    name = data.get("move_to")
    move_to = model.objects.filter(name=name).first() if name else None
    if name and move_to is None:
        raise serializers.ValidationError({"move_to": f"No {model._meta.verbose_name} {name!r}."})
    return {"confirm": data["confirm"], "move_to": move_to}


class ClassOutputSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    name = serializers.CharField()
    description = serializers.CharField()
    band = serializers.IntegerField()
    preemption = serializers.CharField()
    min_runtime_s = serializers.IntegerField()
    max_queue_s = serializers.IntegerField()
    latency_objective_ms = serializers.IntegerField(allow_null=True)
    default_profile = serializers.CharField(source="default_profile.name", allow_null=True)
    inference = serializers.BooleanField()
    priority_class_name = serializers.CharField()
    restricted = serializers.BooleanField()
    teams = serializers.SerializerMethodField()
    retired_at = serializers.DateTimeField(allow_null=True)
    config_managed = serializers.BooleanField()

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_teams(self, wc: WorkloadClass) -> list[str]:
        return sorted(t.name for t in wc.teams.all())


class _ClassFields(StrictSerializer):
    description = serializers.CharField(max_length=300, required=False, allow_blank=True)
    band = serializers.IntegerField(min_value=0, max_value=WorkloadClass.MAX_BAND, required=False)
    preemption = serializers.ChoiceField(choices=WorkloadClass.Preemption.choices, required=False)
    min_runtime_s = serializers.IntegerField(min_value=0, required=False)
    max_queue_s = serializers.IntegerField(min_value=0, required=False)
    latency_objective_ms = serializers.IntegerField(min_value=0, required=False, allow_null=True)
    default_profile = serializers.SlugRelatedField(
        slug_field="name", queryset=DeviceProfile.objects.all(), required=False, allow_null=True
    )
    inference = serializers.BooleanField(required=False)
    priority_class_name = serializers.CharField(max_length=63, required=False, allow_blank=True)
    restricted = serializers.BooleanField(required=False)
    teams = serializers.SlugRelatedField(
        slug_field="name", queryset=Team.objects.filter(retired_at=None), many=True, required=False
    )


class ClassCreateSerializer(_ClassFields):
    name = serializers.CharField(max_length=63)


class ClassListApi(ListApiView):
    """Every workload class; admins create one (audited)."""

    OutputSerializer = ClassOutputSerializer

    @extend_schema(operation_id="classes_list", responses=ClassOutputSerializer(many=True))
    def get(self, request: Request) -> Response:
        signed_in_user(request)
        qs = WorkloadClass.objects.select_related("default_profile").prefetch_related("teams")
        return paginate(self, request, qs.order_by("name"), self.OutputSerializer)

    @extend_schema(
        operation_id="classes_create",
        request=ClassCreateSerializer,
        responses={201: ClassOutputSerializer},
    )
    def post(self, request: Request) -> Response:
        access.require_admin(request.user)
        data = validated(ClassCreateSerializer, request)
        wc = workload_class_create(actor=signed_in_user(request), **data)
        return created(self.OutputSerializer(wc).data)


class ClassDetailApi(ApiView):
    """One class's settings, for admins and auditors (everyone reads the list)."""

    @extend_schema(operation_id="classes_read", responses=ClassOutputSerializer)
    def get(self, request: Request, class_id: int) -> Response:
        access.require_admin_read(request.user)
        wc = WorkloadClass.objects.filter(pk=class_id).first()
        if wc is None:
            raise Http404("No such workload class.")
        return Response(ClassOutputSerializer(wc).data)

    @extend_schema(
        operation_id="classes_update", request=_ClassFields, responses=ClassOutputSerializer
    )
    def patch(self, request: Request, class_id: int) -> Response:
        wc = access.get_workload_class_for_admin(request.user, class_id)
        data = validated(_ClassFields, request)
        wc = workload_class_update(actor=signed_in_user(request), workload_class=wc, **data)
        return Response(ClassOutputSerializer(wc).data)

    @extend_schema(operation_id="classes_retire", request=RetireSerializer, responses={204: None})
    def delete(self, request: Request, class_id: int) -> Response:
        wc = access.get_workload_class_for_admin(request.user, class_id)
        workload_class_retire(
            actor=signed_in_user(request),
            workload_class=wc,
            **_retire_options(request, WorkloadClass),
        )
        return Response(status=status.HTTP_204_NO_CONTENT)
