"""Endpoints for machines, not people: node agent reports and the readiness check of starting Jobs.

Both authenticate with bearer tokens that are not user sessions: the shared
NODE_AGENT_TOKEN for agents, and a per-attempt HMAC for the readiness init
container (portal.lib.readiness.attempt_token). See docs/node-agent.md and docs/kubernetes.md.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import APIException
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response

from portal.api.base import ApiView
from portal.api.schema import ProblemSerializer, name_nested_serializers
from portal.lib.readiness import attempt_token, devices_free, ready_token_key
from portal.lib.validation import validate_agent_report
from portal.models import Attempt, Node
from portal.services.attempts import launch_spec
from portal.services.checkpoints import AttemptNotRunning, attempt_checkpoint_report
from portal.services.nodes import node_agent_report

MAX_REPORT_BYTES = 1_000_000


def _bearer(request: HttpRequest) -> str:
    auth = request.headers.get("Authorization", "")
    return auth[7:].strip() if auth.startswith("Bearer ") else ""


@csrf_exempt  # machine-to-machine, bearer token, no cookies
@require_POST
def agent_report(request: HttpRequest) -> JsonResponse:
    token = settings.NODE_AGENT_TOKEN
    if not token:
        return JsonResponse(
            {"error": "node agents are not enabled here: set NODE_AGENT_TOKEN"}, status=403
        )
    if not hmac.compare_digest(_bearer(request).encode(), token.encode()):
        return JsonResponse({"error": "bad or missing bearer token"}, status=401)
    if len(request.body) > MAX_REPORT_BYTES:
        return JsonResponse({"error": "report too large"}, status=413)
    try:
        report = json.loads(request.body)
    except ValueError:
        return JsonResponse({"error": "the body must be JSON"}, status=400)
    except RecursionError:
        return JsonResponse({"error": "the body is JSON nested too deeply"}, status=400)
    try:
        # Every field's shape, before anything is stored or read back by the tick or readiness.
        validate_agent_report(report)
        node = node_agent_report(report=report)
    except ValidationError as exc:
        return JsonResponse({"errors": exc.message_dict}, status=400)
    return JsonResponse({"accepted": True, "node": node.name}, status=202)


@require_GET
def attempt_ready(request: HttpRequest, attempt_id: int) -> JsonResponse:
    attempt = (
        Attempt.objects.select_related("request__team", "request__workload_class", "pool")
        .filter(pk=attempt_id)
        .first()
    )
    # The same answer, in the same time, whether or not the attempt exists: without its
    # token nobody learns which attempt ids there are.
    if attempt is None:
        expected = attempt_token(ready_token_key(), "", "", attempt_id)
    else:
        expected = attempt_token(
            ready_token_key(), attempt.namespace, attempt.workload_name, attempt.pk
        )
    if not hmac.compare_digest(_bearer(request).encode(), expected.encode()) or attempt is None:
        return JsonResponse({"error": "bad or missing bearer token"}, status=403)
    if attempt.state not in (Attempt.State.ADMITTED, Attempt.State.RUNNING):
        return JsonResponse({"error": f"attempt is {attempt.state}"}, status=410)
    # A gang's pods each ask about their own node: ?rank=N from the Job builder, or
    # ?node=<name> from a JobSet's pods (one template: the pod knows only where it landed).
    members = launch_spec(attempt).members()
    node_name = request.GET.get("node")
    try:
        if node_name is not None:
            member = next(m for m in members if m.node == node_name)
        else:
            member = members[int(request.GET.get("rank", "0"))]
    except (ValueError, IndexError, StopIteration):
        return JsonResponse({"error": "no such pod in this attempt"}, status=404)
    node = Node.objects.filter(name=member.node).first()
    uuids = [
        u
        for u in request.GET.get("devices", "").split(",")
        if u and u not in ("all", "void", "none")
    ]
    ready, reason = devices_free(
        node.agent_report if node else None,
        member.grants,
        uuids=uuids,
        stale_after_s=settings.HEARTBEAT_STALE_SECONDS,
    )
    return JsonResponse({"ready": ready, "reason": reason})


class AttemptConflict(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "The attempt is not running."
    default_code = "conflict"


class AttemptCheckpointApi(ApiView):
    """A workload reports a finished checkpoint (docs/checkpoints.md).

    Authenticated by the attempt's own bearer token (`QM_ATTEMPT_TOKEN`), not by a user:
    a wrong token and an unknown attempt both answer 403; an attempt that has ended, 409.
    The time recorded is the portal's, and `last_checkpoint_at` never moves back.
    """

    authentication_classes: list[type] = []
    permission_classes = [AllowAny]

    class OutputSerializer(serializers.Serializer[Any]):
        attempt = serializers.IntegerField(source="pk")
        last_checkpoint_at = serializers.DateTimeField(allow_null=True)
        checkpoints = serializers.IntegerField()

    @extend_schema(
        operation_id="attempts_checkpoint",
        request=None,
        responses={
            200: OutputSerializer,
            (409, "application/problem+json"): OpenApiResponse(
                ProblemSerializer, description="The attempt has ended."
            ),
        },
        parameters=[
            OpenApiParameter(
                "Authorization",
                str,
                OpenApiParameter.HEADER,
                required=True,
                description="`Bearer <QM_ATTEMPT_TOKEN>`: the attempt's own token.",
            )
        ],
        auth=[],
    )
    def post(self, request: Request, attempt_id: int) -> Response:
        auth = request.headers.get("Authorization", "")
        token = auth[7:].strip() if auth.startswith("Bearer ") else ""
        try:
            attempt = attempt_checkpoint_report(attempt_id=attempt_id, token=token)
        except AttemptNotRunning as exc:
            raise AttemptConflict(f"The attempt is {exc.state}: nothing to checkpoint.") from None
        return Response(self.OutputSerializer(attempt).data)


name_nested_serializers({"AttemptCheckpointApi": AttemptCheckpointApi})
