"""Scheduling profiles over the API: list, create, change, activate."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_serializer
from rest_framework import serializers
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request
from rest_framework.response import Response

from portal import access
from portal.api.base import (
    ApiView,
    ListApiView,
    StrictSerializer,
    created,
    signed_in_user,
    validated,
)
from portal.api.schema import name_nested_serializers
from portal.models import PolicyProfile
from portal.services.profiles import (
    policy_profile_activate,
    policy_profile_create,
    policy_profile_update,
)
from scheduling import profile as scheduling_profile


def _knob_field(
    knob: scheduling_profile.Knob, *, required: bool
) -> serializers.Field[Any, Any, Any, Any]:
    """A serializer field with the core's own bounds for one knob (`scheduling.profile`)."""
    kw: dict[str, Any] = {"required": required, "help_text": knob.help}
    if knob.choices:
        return serializers.ChoiceField(choices=list(knob.choices), **kw)
    if knob.type is str:
        return serializers.CharField(**kw)
    bounds: dict[str, Any] = {"min_value": knob.minimum, "max_value": knob.maximum}
    if knob.type is int:
        return serializers.IntegerField(**bounds, **kw)
    return serializers.FloatField(**bounds, **kw)


def _knob_fields(*, required: bool) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
    return {
        name: _knob_field(knob, required=required)
        for name, knob in scheduling_profile.KNOBS.items()
    }


class _ProfileMeta(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    name = serializers.CharField()
    version = serializers.IntegerField(help_text="goes up by one with each change of a knob")
    active = serializers.BooleanField(help_text="the profile the scheduler runs; exactly one is")
    updated_by = serializers.CharField(allow_null=True)
    updated_at = serializers.DateTimeField()


# One field per knob, built from `Policy`, so that a new knob is in the API and its schema at
# once; profiles are flat, as their TOML files are.
ProfileOutputSerializer = type(
    "ProfileOutputSerializer", (_ProfileMeta,), _knob_fields(required=True)
)
ProfileCreateSerializer = type(
    "ProfileCreateSerializer",
    (StrictSerializer,),
    {"name": serializers.CharField(max_length=63), **_knob_fields(required=False)},
)
ProfileUpdateSerializer = type(
    "ProfileUpdateSerializer", (StrictSerializer,), _knob_fields(required=False)
)
extend_schema_serializer(component_name="Profile")(ProfileOutputSerializer)
extend_schema_serializer(component_name="ProfileCreate")(ProfileCreateSerializer)
extend_schema_serializer(component_name="ProfileUpdate")(ProfileUpdateSerializer)


def _profile_data(row: PolicyProfile) -> dict[str, Any]:
    data = {
        "id": row.pk,
        "name": row.name,
        "version": row.version,
        "active": row.active,
        "updated_by": row.updated_by.get_username() if row.updated_by else None,
        "updated_at": row.updated_at,
        **row.profile().knobs,
    }
    return dict(ProfileOutputSerializer(data).data)


class ProfileListCreateApi(ListApiView):
    """Admins and auditors: the scheduling profiles (GET); admins: a new one (POST): the shipped default's
    knobs with those given over them; inactive until activated."""

    @extend_schema(operation_id="profiles_list", responses=ProfileOutputSerializer(many=True))
    def get(self, request: Request) -> Response:
        access.require_admin_read(request.user)
        qs = PolicyProfile.objects.select_related("updated_by").order_by("name")
        paginator = PageNumberPagination()
        page = paginator.paginate_queryset(qs, request, view=self)
        return paginator.get_paginated_response([_profile_data(r) for r in page or []])

    @extend_schema(
        operation_id="profiles_create",
        request=ProfileCreateSerializer,
        responses={201: ProfileOutputSerializer},
    )
    def post(self, request: Request) -> Response:
        access.require_admin(request.user)
        data = validated(ProfileCreateSerializer, request)
        name = data.pop("name")
        row = policy_profile_create(actor=signed_in_user(request), name=name, knobs=data)
        return created(_profile_data(row))


class ProfileDetailApi(ApiView):
    """Admins: a profile (GET), or a change of some of its knobs (PATCH; the version goes up)."""

    @extend_schema(operation_id="profiles_get", responses=ProfileOutputSerializer)
    def get(self, request: Request, profile_id: int) -> Response:
        row = access.get_policy_profile_for_admin(request.user, profile_id, read_only=True)
        return Response(_profile_data(row))

    @extend_schema(
        operation_id="profiles_update",
        request=ProfileUpdateSerializer,
        responses=ProfileOutputSerializer,
    )
    def patch(self, request: Request, profile_id: int) -> Response:
        row = access.get_policy_profile_for_admin(request.user, profile_id)
        data = validated(ProfileUpdateSerializer, request)
        row = policy_profile_update(actor=signed_in_user(request), profile=row, knobs=data)
        return Response(_profile_data(row))


class ProfileActivateApi(ApiView):
    """Admins: make this the profile the scheduler runs from its next tick."""

    @extend_schema(
        operation_id="profiles_activate", request=None, responses=ProfileOutputSerializer
    )
    def post(self, request: Request, profile_id: int) -> Response:
        row = access.get_policy_profile_for_admin(request.user, profile_id)
        row = policy_profile_activate(actor=signed_in_user(request), profile=row)
        return Response(_profile_data(row))


name_nested_serializers(globals())
