"""GPU requests over the API: list, submit, preview, detail, cancel, logs and events; the queue."""

from __future__ import annotations

from typing import Any

from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
)
from rest_framework import serializers, status
from rest_framework.exceptions import APIException, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from portal import access
from portal.api.base import ApiView, ListApiView, StrictSerializer, paginate, signed_in_user
from portal.api.schema import ErrorSerializer, ProblemSerializer, name_nested_serializers
from portal.lib import shapes
from portal.models import DeviceProfile, GpuRequest, Pool, Team, WorkloadClass
from portal.selectors.queue import queue_list, request_wait_split
from portal.selectors.requests import (
    LOG_DOWNLOAD_LINES,
    LOG_FOLLOW_MAX_S,
    LOG_PAGE_LINES,
    NoSuchPod,
    request_list,
    request_log_follow,
    request_logs,
)
from portal.services.idempotency import HEADER as IDEMPOTENCY_HEADER
from portal.services.idempotency import IdempotencyKeyReused, idempotent_call
from portal.services.requests import MAX_GPUS_PER_NODE, gpu_request_cancel, gpu_request_submit
from portal.tick.preview import gpu_request_preview

# Keys a client may not send: the platform derives them (a client cannot forge them).
FORBIDDEN_KEYS = {
    "namespace",
    "node",
    "nodeName",
    "node_name",
    "tolerations",
    "runtimeClassName",
    "priorityClassName",
    "state",
    "submitted_by",
    "queue_position",
    "position_note",
    "queue_position_note",
    "status_code",
    "status_message",
    "allocated_devices",
}


class IdempotencyConflict(APIException):
    status_code = 422
    default_detail = (
        "This Idempotency-Key was used in the last 24 hours with another body: "
        "use a new key for a new request."
    )
    default_code = "idempotency_key_reused"


class GpuRequestOutputSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    name = serializers.CharField()
    team = serializers.CharField(source="team.name")
    submitted_by = serializers.CharField(source="submitted_by.username")
    workload_class = serializers.CharField(source="workload_class.name")
    pool = serializers.CharField(source="pool.name", allow_null=True, default=None)
    profile_kind = serializers.CharField()
    mig_profile = serializers.CharField()
    milli = serializers.IntegerField()
    gpu_memory_mib = serializers.IntegerField()
    profile = serializers.CharField(source="profile_label")
    count = serializers.IntegerField()
    pods = serializers.IntegerField()
    #: CPU and memory asked for each pod
    cpu_milli = serializers.IntegerField()
    memory_mib = serializers.IntegerField()
    image = serializers.CharField()
    command = serializers.ListField(child=serializers.CharField())
    env = serializers.DictField(child=serializers.CharField())
    checkpoint_interval_s = serializers.IntegerField()
    max_runtime_s = serializers.IntegerField()
    estimated_runtime_s = serializers.IntegerField()
    state = serializers.CharField()
    queue_position = serializers.IntegerField(allow_null=True)
    #: why the queue position last changed, in words ("" until it does)
    queue_position_note = serializers.CharField(source="position_note")
    reason_code = serializers.CharField(source="status_code")
    reason = serializers.CharField(source="status_message")
    escalated = serializers.BooleanField()
    estimated_start = serializers.DateTimeField(allow_null=True)
    attempts = serializers.SerializerMethodField()
    requeue_count = serializers.IntegerField()
    end_reason = serializers.CharField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    kind = serializers.CharField(help_text='"batch", or "serving" (runs until stopped)')
    model_name = serializers.CharField()
    model_revision = serializers.CharField()
    runtime = serializers.CharField()

    def get_attempts(self, obj: GpuRequest) -> int:
        n = getattr(obj, "attempt_count", None)
        return int(n) if n is not None else obj.attempts.count()


class SubmitFields(StrictSerializer):
    """The fields of a request a client chooses; everything else comes from the platform."""

    team = serializers.SlugField(
        required=False, help_text="team name; optional if you are in one team"
    )
    workload_class = serializers.SlugField()
    pool = serializers.CharField(
        required=False, allow_null=True, allow_blank=True, help_text='pool name, or "any"'
    )
    profile = serializers.CharField(
        required=False, help_text="device profile name, e.g. mig-3g.40gb"
    )
    profile_kind = serializers.ChoiceField(choices=DeviceProfile.Kind.values, required=False)
    mig_profile = serializers.CharField(required=False, allow_blank=True, max_length=30)
    milli = serializers.IntegerField(required=False, min_value=1, max_value=1000)
    gpu_memory_mib = serializers.IntegerField(required=False, min_value=0, max_value=10**7)
    count = serializers.IntegerField(default=1, min_value=1, max_value=MAX_GPUS_PER_NODE)
    pods = serializers.IntegerField(default=1, min_value=1, max_value=64)
    cpu_milli = serializers.IntegerField(
        default=1000, min_value=0, max_value=10**9, help_text="CPU per pod, in millicores"
    )
    memory_mib = serializers.IntegerField(
        default=4096, min_value=0, max_value=10**9, help_text="memory per pod, in MiB"
    )
    kind = serializers.ChoiceField(choices=GpuRequest.Kind.values, default="batch")

    def resolve(self, user: Any) -> dict[str, Any]:
        """Turn names into rows; the team must be one of the user's (membership, never request data)."""
        d = dict(self.validated_data)
        mine = Team.objects.filter(memberships__user=user)
        if d.get("team"):
            team = mine.filter(name=d.pop("team")).first()
            if team is None:
                raise ValidationError({"team": ["You are not a member of this team."]})
        else:
            teams = list(mine.filter(retired_at=None)[:2])
            if len(teams) != 1:
                raise ValidationError({"team": ["Name the team to submit for."]})
            team = teams[0]
        d["team"] = team
        wc = WorkloadClass.objects.filter(name=d.pop("workload_class")).first()
        if wc is None:
            raise ValidationError({"workload_class": ["No such workload class."]})
        d["workload_class"] = wc
        pool_name = d.pop("pool", None)
        d["pool"] = None
        if pool_name and pool_name != "any":
            d["pool"] = Pool.objects.filter(name=pool_name).first()
            if d["pool"] is None:
                raise ValidationError({"pool": ["No such pool."]})
        profile_name = d.pop("profile", None)
        if profile_name:
            # The named profile, if some pool the request may land in offers it (as selectors.offered_profiles).
            profile = DeviceProfile.objects.filter(name=profile_name).first()
            if profile is not None and not any(
                p.offers(profile.kind, profile.mig_profile) for p in Pool.offering(d["pool"])
            ):
                profile = None
            if profile is None:
                raise ValidationError(
                    {"profile": ["No pool you chose offers this device profile."]}
                )
            d.update(shapes.profile_fields(profile))
        elif "profile_kind" not in d and wc.default_profile is not None:
            d.update(shapes.profile_fields(wc.default_profile))
        d.setdefault("profile_kind", DeviceProfile.Kind.WHOLE)
        return d


class GpuRequestListSubmitApi(ListApiView):
    """GET: list the requests you may see. POST: submit a request."""

    class SubmitInputSerializer(SubmitFields):
        name = serializers.CharField(required=False, allow_blank=True, max_length=100)
        image = serializers.CharField(max_length=500)
        command = serializers.JSONField(
            required=False,
            # (any JSON value may be a default; the stubs allow only mappings)
            default=list,  # type: ignore[arg-type]
            help_text="list of strings (or one string)",
        )
        env = serializers.JSONField(required=False, default=dict, help_text="mapping NAME -> value")
        checkpoint_interval_s = serializers.IntegerField(default=0, min_value=0, max_value=10**9)
        max_runtime_s = serializers.IntegerField(default=0, min_value=0, max_value=10**9)
        estimated_runtime_s = serializers.IntegerField(default=3600, min_value=1, max_value=10**9)
        priority = serializers.IntegerField(default=0, min_value=-100, max_value=100)
        model_name = serializers.CharField(required=False, default="", max_length=200)
        model_revision = serializers.CharField(required=False, default="", max_length=100)
        runtime = serializers.CharField(required=False, default="", max_length=10)

    OutputSerializer = GpuRequestOutputSerializer

    @extend_schema(
        operation_id="requests_list",
        parameters=[
            OpenApiParameter("state", str, enum=GpuRequest.State.values),
            OpenApiParameter("mine", bool, description="only requests you submitted"),
        ],
        responses=GpuRequestOutputSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        state = request.query_params.get("state", "")
        if state and state not in GpuRequest.State.values:
            raise ValidationError(
                {"state": [f"Choose one of {', '.join(GpuRequest.State.values)}."]}
            )
        qs = request_list(
            request.user, mine=request.query_params.get("mine") in ("1", "true"), state=state
        )
        return paginate(self, request, qs, self.OutputSerializer)

    @extend_schema(
        operation_id="requests_submit",
        request=SubmitInputSerializer,
        parameters=[
            OpenApiParameter(
                IDEMPOTENCY_HEADER,
                str,
                OpenApiParameter.HEADER,
                description="Any string up to 255 characters: a submit repeated with the same "
                "key and body within 24 hours creates no second request and answers the "
                "first one again (with `Idempotent-Replayed: true`); the same key with "
                "another body is a 422.",
            )
        ],
        responses={
            201: GpuRequestOutputSerializer,
            (422, "application/problem+json"): OpenApiResponse(
                ProblemSerializer,
                description="The Idempotency-Key was used with another body (code "
                "`idempotency_key_reused`).",
            ),
        },
    )
    def post(self, request: Request) -> Response:
        key = request.headers.get(IDEMPOTENCY_HEADER)
        if key is None:
            return Response(self._submit(request), status=status.HTTP_201_CREATED)
        try:
            code, body, replayed = idempotent_call(
                user=signed_in_user(request),
                key=key,
                body=request.data,
                write=lambda: (status.HTTP_201_CREATED, self._submit(request)),
            )
        except IdempotencyKeyReused:
            raise IdempotencyConflict() from None
        headers = {"Idempotent-Replayed": "true"} if replayed else {}
        return Response(body, status=code, headers=headers)

    def _submit(self, request: Request) -> Any:
        serializer = self.SubmitInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        req = gpu_request_submit(user=signed_in_user(request), **serializer.resolve(request.user))
        req.attempt_count = 0  # type: ignore[attr-defined]  # new: no query needed
        return self.OutputSerializer(req).data


class GpuRequestPreviewApi(ApiView):
    """What the scheduler would do with this request now; nothing is written."""

    class InputSerializer(SubmitFields):
        pass

    class OutputSerializer(serializers.Serializer[Any]):
        outcome = serializers.ChoiceField(choices=["fits", "waits", "rejected"])
        message = serializers.CharField()
        pool = serializers.CharField()
        code = serializers.CharField()
        position = serializers.IntegerField()
        estimated_start = serializers.DateTimeField(allow_null=True)
        borrowing = serializers.BooleanField()
        field = serializers.CharField(help_text="the input field a rejection is about, or empty")

    @extend_schema(
        operation_id="requests_preview", request=InputSerializer, responses=OutputSerializer
    )
    def post(self, request: Request) -> Response:
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        d = serializer.resolve(request.user)
        preview = gpu_request_preview(**d)
        return Response(self.OutputSerializer(preview).data)


class AttemptSerializer(serializers.Serializer[Any]):
    number = serializers.IntegerField()
    state = serializers.CharField()
    pool = serializers.CharField(source="pool.name")
    nodes = serializers.ListField(child=serializers.CharField(), help_text="one per pod, by rank")
    workload_name = serializers.CharField()
    admitted_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    ended_at = serializers.DateTimeField(allow_null=True)
    last_checkpoint_at = serializers.DateTimeField(allow_null=True)
    checkpoints = serializers.IntegerField(help_text="checkpoints the workload reported")
    exit_code = serializers.IntegerField(allow_null=True)
    end_reason = serializers.CharField()


class WaitSerializer(serializers.Serializer[Any]):
    reason = serializers.CharField(
        help_text="unschedulable, quota, capacity, provisioning or backoff"
    )
    seconds = serializers.IntegerField()


class GpuRequestDetailApi(ApiView):
    class OutputSerializer(GpuRequestOutputSerializer):
        latest_attempt = serializers.SerializerMethodField()
        wait = serializers.SerializerMethodField(help_text="where the wait went, by reason")

        @extend_schema_field(AttemptSerializer(allow_null=True))
        def get_latest_attempt(self, obj: GpuRequest) -> dict[str, Any] | None:
            attempt = obj.attempts.select_related("pool").order_by("-number").first()
            return None if attempt is None else dict(AttemptSerializer(attempt).data)

        @extend_schema_field(WaitSerializer(many=True))
        def get_wait(self, obj: GpuRequest) -> list[dict[str, Any]]:
            return [{"reason": r, "seconds": s} for r, s in request_wait_split(obj)]

    @extend_schema(operation_id="requests_get", responses=OutputSerializer)
    def get(self, request: Request, request_id: int) -> Response:
        req = access.get_gpu_request_for_user(request.user, request_id)
        return Response(self.OutputSerializer(req).data)


#: `after` lines a reconnecting follower may send, and the characters of each that count
MAX_AFTER_LINES = 20
MAX_AFTER_CHARS = 2000


class NotStarted(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_code = "not_started"


def _whole(request: Request, name: str, default: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValidationError({name: ["A whole number."]}) from None
    if not 0 <= value <= high:
        raise ValidationError({name: [f"From 0 to {high}."]})
    return value


class GpuRequestLogsApi(ApiView):
    """The latest attempt's log, as the request page shows it, or followed as it grows.

    Authorized like the request page: its team's members and leads, and admins.
    """

    class OutputSerializer(serializers.Serializer[Any]):
        request = serializers.IntegerField()
        attempt = serializers.IntegerField()
        pod = serializers.IntegerField(help_text="the pod's rank in the gang (0 if one pod)")
        pods = serializers.IntegerField()
        live = serializers.BooleanField(
            help_text="read from the running workload (else the lines kept when it ended)"
        )
        text = serializers.CharField()

    @extend_schema(
        operation_id="requests_logs",
        parameters=[
            OpenApiParameter("tail", int, description=f"last lines (default {LOG_PAGE_LINES})"),
            OpenApiParameter("pod", int, description="a gang's pod by rank (default 0)"),
            OpenApiParameter(
                "follow",
                bool,
                description="stream the log as text/plain until the request is over: "
                "the tail, then each new line (a pending request's once it starts). A stream "
                f"ends after {int(LOG_FOLLOW_MAX_S)} s; reconnect with `after`",
            ),
            OpenApiParameter(
                "after",
                str,
                many=True,
                description=f"with follow: the last lines you have (up to {MAX_AFTER_LINES}, "
                "repeated); the stream starts after them, or with the tail if the log no "
                "longer holds them",
            ),
        ],
        responses={
            (200, "application/json"): OpenApiResponse(
                OutputSerializer, description="the tail; with ?follow=1, a stream of lines"
            ),
            (200, "text/plain"): OpenApiResponse(
                OpenApiTypes.STR, description="with ?follow=1: the log's lines as they come"
            ),
            409: OpenApiResponse(
                ErrorSerializer, description="The request has not run yet: it has no log."
            ),
        },
    )
    def get(self, request: Request, request_id: int) -> Response | StreamingHttpResponse:
        req = access.get_gpu_request_for_user(request.user, request_id)
        tail = _whole(request, "tail", LOG_PAGE_LINES, LOG_DOWNLOAD_LINES)
        pod = _whole(request, "pod", 0, 1000)
        follow = request.query_params.get("follow", "") in ("1", "true")
        # The last lines a reconnecting client has (a stream ends after LOG_FOLLOW_MAX_S).
        after = [line[:MAX_AFTER_CHARS] for line in request.query_params.getlist("after")]
        if len(after) > MAX_AFTER_LINES:
            raise ValidationError({"after": [f"At most {MAX_AFTER_LINES} lines."]})
        try:
            view = request_logs(req, tail_lines=tail, events=False, pod=pod, read_ended=True)
        except NoSuchPod as exc:
            raise ValidationError({"pod": [str(exc)]}) from None
        if follow:
            response = StreamingHttpResponse(
                request_log_follow(req.pk, tail_lines=tail, pod=pod, after=after),
                content_type="text/plain; charset=utf-8",
            )
            # Lines as they come: no proxy buffering, no caching.
            response["X-Accel-Buffering"] = "no"
            response["Cache-Control"] = "no-store"
            return response
        if view.attempt is None:
            raise NotStarted(f"Request #{req.pk} has not run yet, so it has no log.")
        data = {
            "request": req.pk,
            "attempt": view.attempt.number,
            "pod": pod,
            "pods": view.pods,
            "live": view.live,
            "text": view.text,
        }
        return Response(self.OutputSerializer(data).data)


class WorkloadEventSerializer(serializers.Serializer[Any]):
    at = serializers.DateTimeField(allow_null=True)
    type = serializers.CharField(help_text='"Normal" or "Warning"')
    reason = serializers.CharField()
    message = serializers.CharField()
    object = serializers.CharField(help_text='e.g. "Job/qm-4-1" or "Pod/qm-4-1-x7k2p"')


class GpuRequestEventsApi(ApiView):
    """Events about the latest attempt's workload and pods, oldest first (Kubernetes Events,
    or the simulation's). Authorized like the request page."""

    class OutputSerializer(serializers.Serializer[Any]):
        request = serializers.IntegerField()
        attempt = serializers.IntegerField(
            allow_null=True, help_text="null: the request has not run yet"
        )
        events = WorkloadEventSerializer(many=True)

    @extend_schema(operation_id="requests_events", responses=OutputSerializer)
    def get(self, request: Request, request_id: int) -> Response:
        req = access.get_gpu_request_for_user(request.user, request_id)
        view = request_logs(req, tail_lines=0, events=True)
        data = {
            "request": req.pk,
            "attempt": view.attempt.number if view.attempt else None,
            "events": view.events,
        }
        return Response(self.OutputSerializer(data).data)


class ReasonInputSerializer(StrictSerializer):
    reason = serializers.CharField(
        required=False, allow_blank=True, max_length=500, help_text="why; goes into the audit log"
    )


class GpuRequestCancelApi(ApiView):
    OutputSerializer = GpuRequestOutputSerializer

    @extend_schema(
        operation_id="requests_cancel",
        request=ReasonInputSerializer,
        responses=GpuRequestOutputSerializer,
    )
    def post(self, request: Request, request_id: int) -> Response:
        req = access.get_gpu_request_for_user(request.user, request_id, write=True)
        serializer = ReasonInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        req = gpu_request_cancel(
            user=signed_in_user(request),
            gpu_request=req,
            reason=serializer.validated_data.get("reason", ""),
        )
        return Response(self.OutputSerializer(req).data)


class QueueApi(ListApiView):
    """Pending requests in scheduling order (your teams'; all for admins)."""

    class OutputSerializer(serializers.Serializer[Any]):
        id = serializers.IntegerField()
        name = serializers.CharField()
        state = serializers.CharField()
        queue_position = serializers.IntegerField(allow_null=True)
        team = serializers.CharField(source="team.name")
        workload_class = serializers.CharField(source="workload_class.name")
        pool = serializers.CharField(source="pool.name", allow_null=True, default=None)
        profile = serializers.CharField(source="profile_label")
        count = serializers.IntegerField()
        pods = serializers.IntegerField()
        reason_code = serializers.CharField(source="status_code")
        reason = serializers.CharField(source="status_message")
        escalated = serializers.BooleanField()
        estimated_start = serializers.DateTimeField(allow_null=True)
        created_at = serializers.DateTimeField()

    @extend_schema(
        operation_id="queue_list",
        parameters=[
            OpenApiParameter("workload_class", str),
            OpenApiParameter("team", str),
            OpenApiParameter("pool", str),
        ],
        responses=OutputSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        filters: dict[str, Any] = {}
        # Teams among the user's only: another team's name answers as a name that does not exist.
        teams = access.teams_for(request.user)
        for key, qs in (
            ("workload_class", WorkloadClass.objects.all()),
            ("team", teams),
            ("pool", Pool.objects.all()),
        ):
            name = request.query_params.get(key)
            if name:
                obj = qs.filter(name=name).first()
                if obj is None:
                    raise ValidationError({key: [f"No such {key.replace('_', ' ')}."]})
                filters[key] = obj
        return paginate(self, request, queue_list(request.user, **filters), self.OutputSerializer)


name_nested_serializers(globals())
