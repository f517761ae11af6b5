"""API of serving workloads: scale and change revision; the request path's metrics."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from portal import access
from portal.api.base import ApiView, StrictSerializer
from portal.api.requests import GpuRequestOutputSerializer
from portal.services import serving, serving_samples


class ServingUpdateApi(ApiView):
    """PATCH a serving workload: `replicas` (placed again by the scheduler) and/or
    `model_revision` (the replicas roll over to it). Audited."""

    class InputSerializer(StrictSerializer):
        replicas = serializers.JSONField(required=False)
        model_revision = serializers.JSONField(required=False)

    @extend_schema(
        operation_id="serving_update", request=InputSerializer, responses=GpuRequestOutputSerializer
    )
    def patch(self, request: Request, request_id: int) -> Response:
        req = access.get_gpu_request_for_user(request.user, request_id, write=True)
        s = self.InputSerializer(data=request.data)
        s.is_valid(raise_exception=True)
        d: dict[str, Any] = s.validated_data
        if not d:
            raise ValidationError({"replicas": ["Give replicas or model_revision."]})
        if "model_revision" in d:
            req = serving.serving_set_revision(
                user=request.user, gpu_request=req, revision=d["model_revision"]
            )
        if "replicas" in d:
            req = serving.serving_scale(user=request.user, gpu_request=req, replicas=d["replicas"])
        return Response(GpuRequestOutputSerializer(req).data)


class RequestMetricsApi(ApiView):
    """The request path of a serving workload over a window: `ttft_p95_seconds`,
    `batch_size`, `queue_depth`, `gpu_utilization`, `model_revision` … (docs/metrics.md).
    A batch request has none of them: its series are empty."""

    class RequestMetricsSerializer(serializers.Serializer[Any]):
        request = serializers.IntegerField()
        # (a field named like a Field attribute: the serializer's metaclass takes fields out of
        # the class, so nothing is shadowed)
        source = serializers.ChoiceField(choices=["prometheus", "samples"])  # type: ignore[assignment]
        window_s = serializers.IntegerField()
        step_s = serializers.IntegerField()
        series = serializers.DictField(
            child=serializers.ListField(child=serializers.ListField()),
            help_text="name -> [[epoch seconds, value or null], …]; model_revision's values "
            "are strings",
        )
        revision_changes = serializers.ListField(child=serializers.DictField())
        slo = serializers.DictField(help_text="objective_seconds, compliance, met")
        health = serializers.DictField(help_text='status ("ok", "saturated", "unknown"), message')

    @extend_schema(
        operation_id="requests_metrics",
        parameters=[OpenApiParameter("window", str, enum=list(serving_samples.WINDOWS))],
        responses=RequestMetricsSerializer,
    )
    def get(self, request: Request, request_id: int) -> Response:
        req = access.get_gpu_request_for_user(request.user, request_id)
        window = request.query_params.get("window", "1h")
        if window not in serving_samples.WINDOWS:
            raise ValidationError(
                {"window": [f"Choose one of {', '.join(serving_samples.WINDOWS)}."]}
            )
        return Response(
            serving_samples.request_metrics(req, window_s=serving_samples.WINDOWS[window])
        )
