"""The decision log and the audit log over the API."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from portal import access
from portal.api.base import ListApiView, paginate
from portal.api.schema import name_nested_serializers
from portal.models import Decision
from portal.selectors.audit import audit_list, decision_list


class DecisionListApi(ListApiView):
    class OutputSerializer(serializers.Serializer[Any]):
        id = serializers.IntegerField()
        tick = serializers.IntegerField()
        request = serializers.IntegerField(source="request_id", allow_null=True)
        team = serializers.CharField(source="team.name", allow_null=True, default=None)
        pool = serializers.CharField(source="pool.name", allow_null=True, default=None)
        node = serializers.CharField()
        kind = serializers.CharField()
        code = serializers.CharField()
        message = serializers.CharField()
        facts = serializers.JSONField()
        profile_name = serializers.CharField(
            help_text="the scheduling profile in force (blank: not a tick's decision)"
        )
        profile_version = serializers.IntegerField(allow_null=True)
        policy_version = serializers.IntegerField(
            allow_null=True, help_text="the policy version in force (GET /api/v1/policy/versions/)"
        )
        created_at = serializers.DateTimeField()

    @extend_schema(
        operation_id="decisions_list",
        parameters=[
            OpenApiParameter("team", str),
            OpenApiParameter("request", int),
            OpenApiParameter("node", str),
            OpenApiParameter("kind", str, enum=Decision.Kind.values),
        ],
        responses=OutputSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        params = request.query_params
        filters: dict[str, Any] = {
            "node": params.get("node", "")[:253],
            "kind": params.get("kind", ""),
        }
        if filters["kind"] and filters["kind"] not in Decision.Kind.values:
            raise ValidationError({"kind": [f"Choose one of {', '.join(Decision.Kind.values)}."]})
        if params.get("team"):
            filters["team"] = access.teams_for(request.user).filter(name=params["team"]).first()
            if filters["team"] is None:
                raise ValidationError({"team": ["No such team."]})
        if params.get("request"):
            try:
                filters["request_id"] = int(params["request"])
            except ValueError:
                raise ValidationError({"request": ["A request id is a whole number."]}) from None
            # Past a 64-bit key the database refuses the number itself (a 500 before).
            if not 0 < filters["request_id"] < 2**63:
                raise ValidationError({"request": ["No such request id."]})
        return paginate(
            self, request, decision_list(request.user, **filters), self.OutputSerializer
        )


class AuditListApi(ListApiView):
    class OutputSerializer(serializers.Serializer[Any]):
        id = serializers.IntegerField()
        actor = serializers.CharField(source="actor_name")
        action = serializers.CharField()
        object_type = serializers.CharField()
        object_id = serializers.CharField()
        team = serializers.CharField(source="team.name", allow_null=True, default=None)
        before = serializers.JSONField()
        after = serializers.JSONField()
        created_at = serializers.DateTimeField()

    @extend_schema(
        operation_id="audit_list",
        parameters=[OpenApiParameter("action", str)],
        responses=OutputSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        access.require_admin_read(request.user)
        qs: Any = audit_list(action=request.query_params.get("action", "")[:50])
        return paginate(self, request, qs, self.OutputSerializer)


name_nested_serializers(globals())
