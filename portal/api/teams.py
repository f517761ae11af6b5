"""Teams, members and quotas over the API."""

from __future__ import annotations

from typing import Any

from django.http import Http404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.exceptions import PermissionDenied, ValidationError
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
from portal.api.schema import name_nested_serializers
from portal.models import Membership
from portal.selectors.teams import team_members, team_usage
from portal.services.teams import (
    membership_add,
    membership_remove,
    membership_set,
    quota_set,
    team_create,
    team_retire,
    team_update,
)


class QuotaOutputSerializer(serializers.Serializer[Any]):
    pool = serializers.CharField(source="pool.name")
    nominal_milli = serializers.IntegerField()
    borrowing_limit_milli = serializers.IntegerField(allow_null=True)
    lending_limit_milli = serializers.IntegerField(allow_null=True)
    granted_milli = serializers.IntegerField()


class TeamOutputSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    name = serializers.CharField()
    display_name = serializers.CharField()
    namespace = serializers.CharField()
    weight = serializers.IntegerField()
    #: retired teams stay listed for the logs; they take no new requests
    retired_at = serializers.DateTimeField(allow_null=True)


class TeamListApi(ListApiView):
    """Teams the caller may see; admins create teams (audited)."""

    OutputSerializer = TeamOutputSerializer

    class InputSerializer(StrictSerializer):
        name = serializers.CharField(max_length=63)
        display_name = serializers.CharField(max_length=200, required=False, allow_blank=True)
        namespace = serializers.CharField(max_length=63, required=False, allow_blank=True)
        weight = serializers.IntegerField(min_value=1, max_value=1000, required=False)

    @extend_schema(operation_id="teams_list", responses=TeamOutputSerializer(many=True))
    def get(self, request: Request) -> Response:
        return paginate(
            self, request, access.teams_for(request.user).order_by("name"), self.OutputSerializer
        )

    @extend_schema(
        operation_id="teams_create",
        request=InputSerializer,
        responses={201: TeamOutputSerializer},
    )
    def post(self, request: Request) -> Response:
        access.require_admin(request.user)
        data = validated(self.InputSerializer, request)
        team = team_create(actor=signed_in_user(request), **data)
        return created(self.OutputSerializer(team).data)


class MemberOutputSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField(source="membership.pk")
    username = serializers.CharField(source="membership.user.username")
    role = serializers.CharField(source="membership.role")
    gpu_cap_milli = serializers.IntegerField(source="membership.gpu_cap_milli", allow_null=True)
    # (a field named like a Field attribute: the serializer's metaclass takes fields out of
    # the class, so nothing is shadowed)
    source = serializers.CharField(source="membership.source")  # type: ignore[assignment]
    holding_milli = serializers.IntegerField()
    pending = serializers.IntegerField()


def _member_view(membership: Membership) -> dict[str, Any]:
    """One member as team_members() lists them (holding and pending included)."""
    for m in team_members(membership.team):
        if m["membership"].pk == membership.pk:
            return m
    raise Http404("No such member.")


class TeamMemberListApi(ListApiView):
    """A team's members; its leads (and admins) add members. Admins choose the role."""

    class InputSerializer(StrictSerializer):
        username = serializers.CharField(max_length=150)
        role = serializers.ChoiceField(choices=Membership.Role.values, required=False)
        gpu_cap_milli = serializers.IntegerField(
            min_value=0, max_value=10**9, required=False, allow_null=True
        )

    @extend_schema(operation_id="team_members_list", responses=MemberOutputSerializer(many=True))
    def get(self, request: Request, team_id: int) -> Response:
        team = access.get_team_for_user(request.user, team_id)
        return paginate(self, request, team_members(team), MemberOutputSerializer)

    @extend_schema(
        operation_id="team_members_add",
        request=InputSerializer,
        responses={201: MemberOutputSerializer},
    )
    def post(self, request: Request, team_id: int) -> Response:
        team = access.get_team_for_user(request.user, team_id, role=Membership.Role.LEAD)
        data = validated(self.InputSerializer, request)
        role = data.get("role", Membership.Role.MEMBER)
        if role != Membership.Role.MEMBER and not access.is_admin(request.user):
            raise ValidationError({"role": ["Only platform admins add leads."]})
        membership = membership_add(
            actor=signed_in_user(request), team=team, username=data["username"], role=role
        )
        if data.get("gpu_cap_milli") is not None:
            membership = membership_set(
                actor=signed_in_user(request),
                team=team,
                user=membership.user,
                role=membership.role,
                gpu_cap_milli=data["gpu_cap_milli"],
            )
        return created(MemberOutputSerializer(_member_view(membership)).data)


class TeamMemberDetailApi(ApiView):
    """One member: leads set the cap and remove members; admins also change roles and remove leads.

    Removing a member cancels their pending requests in the team (running work finishes).
    """

    class InputSerializer(StrictSerializer):
        role = serializers.ChoiceField(choices=Membership.Role.values, required=False)
        gpu_cap_milli = serializers.IntegerField(
            min_value=0, max_value=10**9, required=False, allow_null=True
        )

    class RemovedSerializer(serializers.Serializer[Any]):
        cancelled_requests = serializers.IntegerField()

    def _membership(self, request: Request, team_id: int, membership_id: int) -> Membership:
        team = access.get_team_for_user(request.user, team_id, role=Membership.Role.LEAD)
        return access.get_membership_for_lead(request.user, team, membership_id)

    @extend_schema(operation_id="team_members_get", responses=MemberOutputSerializer)
    def get(self, request: Request, team_id: int, membership_id: int) -> Response:
        team = access.get_team_for_user(request.user, team_id)
        membership = access.get_membership_for_lead(request.user, team, membership_id)
        return Response(MemberOutputSerializer(_member_view(membership)).data)

    @extend_schema(
        operation_id="team_members_update",
        request=InputSerializer,
        responses=MemberOutputSerializer,
    )
    def patch(self, request: Request, team_id: int, membership_id: int) -> Response:
        membership = self._membership(request, team_id, membership_id)
        data = validated(self.InputSerializer, request)
        role = data.get("role", membership.role)
        if role != membership.role and not access.is_admin(request.user):
            raise ValidationError({"role": ["Only platform admins change roles."]})
        cap = data.get("gpu_cap_milli", membership.gpu_cap_milli)
        membership = membership_set(
            actor=signed_in_user(request),
            team=membership.team,
            user=membership.user,
            role=role,
            gpu_cap_milli=cap,
        )
        return Response(MemberOutputSerializer(_member_view(membership)).data)

    @extend_schema(
        operation_id="team_members_remove", request=None, responses={200: RemovedSerializer}
    )
    def delete(self, request: Request, team_id: int, membership_id: int) -> Response:
        membership = self._membership(request, team_id, membership_id)
        if membership.role == Membership.Role.LEAD and not access.is_admin(request.user):
            raise PermissionDenied("Only platform admins remove a team's leads.")
        cancelled = membership_remove(actor=signed_in_user(request), membership=membership)
        return Response({"cancelled_requests": cancelled})


class TeamDetailApi(ApiView):
    """A team with its usage against guarantee per pool, and its members."""

    class UsageSerializer(serializers.Serializer[Any]):
        pool = serializers.CharField(source="pool.name")
        nominal_milli = serializers.IntegerField()
        used_milli = serializers.IntegerField()
        borrowed_milli = serializers.IntegerField()
        lent_milli = serializers.IntegerField()

    MemberSerializer = MemberOutputSerializer

    class OutputSerializer(serializers.Serializer[Any]):
        id = serializers.IntegerField()
        name = serializers.CharField()
        namespace = serializers.CharField()
        weight = serializers.IntegerField()
        max_pending = serializers.IntegerField()
        usage = serializers.ListField(child=serializers.DictField())
        quotas = serializers.ListField(child=serializers.DictField())
        members = serializers.ListField(child=serializers.DictField())

    @extend_schema(operation_id="teams_get", responses=OutputSerializer)
    def get(self, request: Request, team_id: int) -> Response:
        team = access.get_team_for_user(request.user, team_id)
        data = {
            "id": team.pk,
            "name": team.name,
            "namespace": team.namespace,
            "weight": team.weight,
            "max_pending": team.max_pending,
            "usage": self.UsageSerializer(team_usage(team), many=True).data,
            "quotas": QuotaOutputSerializer(team.quotas.select_related("pool"), many=True).data,
            "members": self.MemberSerializer(team_members(team), many=True).data,
        }
        return Response(data)

    class PatchSerializer(StrictSerializer):
        display_name = serializers.CharField(max_length=200, required=False)
        namespace = serializers.CharField(max_length=63, required=False)
        weight = serializers.IntegerField(min_value=1, max_value=1000, required=False)
        max_pending = serializers.IntegerField(min_value=0, required=False)

    @extend_schema(
        operation_id="teams_update", request=PatchSerializer, responses=TeamOutputSerializer
    )
    def patch(self, request: Request, team_id: int) -> Response:
        """Admins: a team's name for people, namespace, fair-share weight, pending limit."""
        team = access.get_team_for_user(request.user, team_id)
        access.require_admin(request.user)
        data = validated(self.PatchSerializer, request)
        team = team_update(actor=signed_in_user(request), team=team, **data)
        return Response(TeamOutputSerializer(team).data)

    class RetireSerializer(StrictSerializer):
        confirm = serializers.BooleanField(default=False)

    class RetiredSerializer(serializers.Serializer[Any]):
        running = serializers.IntegerField(help_text="running requests, left to run to the end")
        cancelled = serializers.IntegerField(help_text="waiting requests cancelled")

    @extend_schema(
        operation_id="teams_retire", request=RetireSerializer, responses={200: RetiredSerializer}
    )
    def delete(self, request: Request, team_id: int) -> Response:
        """Admins retire (never delete) a team: with work in it, a 400 says what happens to it
        until `confirm` is true; its waiting requests are cancelled, running work runs on."""
        team = access.get_team_for_user(request.user, team_id)
        access.require_admin(request.user)
        data = validated(self.RetireSerializer, request, query=True)
        impact, cancelled = team_retire(
            actor=signed_in_user(request),
            team=team,
            confirm=data["confirm"],
        )
        return Response({"running": impact.running, "cancelled": cancelled})


class QuotaSetApi(ApiView):
    """Leads set nominal and limits within what admins granted; admins also set `granted_milli`."""

    class InputSerializer(StrictSerializer):
        nominal_milli = serializers.IntegerField(min_value=0, max_value=10**9)
        borrowing_limit_milli = serializers.IntegerField(
            min_value=0, max_value=10**9, required=False, allow_null=True
        )
        lending_limit_milli = serializers.IntegerField(
            min_value=0, max_value=10**9, required=False, allow_null=True
        )
        granted_milli = serializers.IntegerField(
            min_value=0, max_value=10**9, required=False, allow_null=True
        )
        reason = serializers.CharField(
            required=False,
            allow_blank=True,
            max_length=500,
            help_text="why; goes into the audit log",
        )

    OutputSerializer = QuotaOutputSerializer

    @extend_schema(
        operation_id="quotas_set", request=InputSerializer, responses=QuotaOutputSerializer
    )
    def put(self, request: Request, team_id: int, pool_id: int) -> Response:
        team = access.get_team_for_user(request.user, team_id, role=Membership.Role.LEAD)
        pool = access.get_pool(request.user, pool_id)
        data = validated(self.InputSerializer, request)
        quota = quota_set(actor=signed_in_user(request), team=team, pool=pool, **data)
        return Response(self.OutputSerializer(quota).data)


name_nested_serializers(globals())
