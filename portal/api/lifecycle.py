"""API of the pool lifecycle (docs/lifecycle.md): rollouts (admins start them; admins and
auditors read them) and the results a node's burn-in reports."""

from __future__ import annotations

import hmac
from typing import Any

from django.conf import settings
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response

from portal import access
from portal.api.base import ApiView, ListApiView, StrictSerializer, paginate, signed_in_user
from portal.lib import lifecycle
from portal.lib.readiness import attempt_token, ready_token_key
from portal.models import Pool, ValidationRun
from portal.selectors import lifecycle as lifecycle_selectors
from portal.services.rollouts import rollout_halt, rollout_start
from portal.services.validations import validation_report


class RolloutNodeSerializer(serializers.Serializer[Any]):
    node = serializers.CharField(source="node.name")
    wave = serializers.IntegerField()
    step = serializers.CharField()
    reason = serializers.CharField()
    stopped_attempts = serializers.ListField(child=serializers.IntegerField())
    validation = serializers.IntegerField(source="validation_id", allow_null=True)


class RolloutSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    pool = serializers.CharField(source="pool.name")
    kind = serializers.CharField()
    target = serializers.CharField()
    state = serializers.CharField()
    canary_nodes = serializers.IntegerField()
    wave_percent = serializers.IntegerField()
    max_failed_nodes = serializers.IntegerField()
    drain_timeout_s = serializers.IntegerField()
    apply_timeout_s = serializers.IntegerField()
    thresholds = serializers.DictField(child=serializers.FloatField())
    waves = serializers.ListField(child=serializers.ListField(child=serializers.CharField()))
    current_wave = serializers.IntegerField()
    halt_reason = serializers.CharField()
    rollback_criteria = serializers.CharField()
    impact = serializers.DictField()
    created_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)


class RolloutDetailSerializer(RolloutSerializer):
    nodes = RolloutNodeSerializer(source="members", many=True)


class RolloutListCreateApi(ListApiView):
    """Admins start a rollout (audited); admins and auditors list them."""

    class InputSerializer(StrictSerializer):
        pool = serializers.SlugField()
        kind = serializers.ChoiceField(choices=list(lifecycle.KINDS))
        target = serializers.CharField(max_length=63)
        canary_nodes = serializers.IntegerField(min_value=0, max_value=1000, required=False)
        wave_percent = serializers.IntegerField(min_value=1, max_value=100, required=False)
        max_failed_nodes = serializers.IntegerField(min_value=0, max_value=1000, required=False)
        drain_timeout_s = serializers.IntegerField(min_value=0, max_value=7 * 86400, required=False)
        apply_timeout_s = serializers.IntegerField(min_value=1, max_value=86400, required=False)
        thresholds = serializers.DictField(child=serializers.FloatField(), required=False)

    @extend_schema(operation_id="rollouts_list", responses=RolloutSerializer(many=True))
    def get(self, request: Request) -> Response:
        access.require_admin_read(request.user)
        return paginate(self, request, lifecycle_selectors.rollout_list(), RolloutSerializer)

    @extend_schema(
        operation_id="rollouts_create",
        request=InputSerializer,
        responses={201: RolloutDetailSerializer},
    )
    def post(self, request: Request) -> Response:
        access.require_admin(request.user)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data: dict[str, Any] = dict(serializer.validated_data)
        try:
            pool = Pool.objects.get(name=data.pop("pool"))
        except Pool.DoesNotExist:
            raise serializers.ValidationError({"pool": ["No such pool."]}) from None
        rollout = rollout_start(actor=signed_in_user(request), pool=pool, **data)
        return Response(RolloutDetailSerializer(rollout).data, status=status.HTTP_201_CREATED)


class RolloutDetailApi(ApiView):
    """A rollout with every node's wave, step and reason."""

    @extend_schema(operation_id="rollouts_retrieve", responses=RolloutDetailSerializer)
    def get(self, request: Request, rollout_id: int) -> Response:
        rollout = access.get_rollout(request.user, rollout_id, read_only=True)
        return Response(RolloutDetailSerializer(rollout).data)


class RolloutHaltSerializer(StrictSerializer):
    reason = serializers.CharField(max_length=200, required=False, allow_blank=True)


class RolloutHaltApi(ApiView):
    """Admins: stop a running rollout now (audited); 400 `state` when it is not running."""

    InputSerializer = RolloutHaltSerializer

    @extend_schema(
        operation_id="rollouts_halt",
        request=RolloutHaltSerializer,
        responses=RolloutDetailSerializer,
    )
    def post(self, request: Request, rollout_id: int) -> Response:
        rollout = access.get_rollout(request.user, rollout_id)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        rollout = rollout_halt(
            actor=signed_in_user(request),
            rollout=rollout,
            reason=serializer.validated_data.get("reason", ""),
        )
        return Response(RolloutDetailSerializer(rollout).data)


def validation_token(run: ValidationRun) -> str:
    """The run's own bearer token (an HMAC, nothing stored), as attempts have theirs."""
    return attempt_token(ready_token_key(), settings.VALIDATION_NAMESPACE, run.name, run.pk)


class ValidationFiguresSerializer(serializers.Serializer[Any]):
    """What a burn-in reports (docs/lifecycle.md); the portal judges the figures."""

    devices_visible = serializers.IntegerField(required=False)
    nccl_busbw_gbps = serializers.FloatField(required=False)
    dcgm_diag = serializers.CharField(required=False)
    warmup_s = serializers.FloatField(required=False)


class ValidationStateSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    state = serializers.CharField()


class ValidationResultApi(ApiView):
    """A node's burn-in pod reports its figures (docs/lifecycle.md); 403 for a wrong token
    or an unknown run alike, 400 naming `results` when it has finished."""

    authentication_classes: list[type] = []
    permission_classes = [AllowAny]

    @extend_schema(
        operation_id="validations_result",
        request=ValidationFiguresSerializer,
        responses=ValidationStateSerializer,
        parameters=[OpenApiParameter("Authorization", str, OpenApiParameter.HEADER, required=True)],
        auth=[],
    )
    def post(self, request: Request, validation_id: int) -> Response:
        auth = request.headers.get("Authorization", "")
        token = auth[7:].strip() if auth.startswith("Bearer ") else ""
        run = ValidationRun.objects.filter(pk=validation_id).first()
        if run is None or not token or not hmac.compare_digest(token, validation_token(run)):
            raise PermissionDenied("Wrong token.")
        data = request.data if isinstance(request.data, dict) else None
        run = validation_report(run=run, results=data)
        return Response(ValidationStateSerializer(run).data)
