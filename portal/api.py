"""REST API under /api/v1/: one APIView per operation, nested Input/Output serializers.

Same services and the same access choke-point as the pages. A Django
`ValidationError` from a service becomes a 400 naming the field; another
team's objects answer 404; admin-only operations answer 403 to others.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_serializer,
)
from rest_framework import serializers, status
from rest_framework.exceptions import (
    APIException,
    AuthenticationFailed,
    PermissionDenied,
    ValidationError,
)
from rest_framework.pagination import PageNumberPagination
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal import access, selectors, services, shapes
from portal.api_schema import ErrorSerializer
from portal.models import (
    Decision,
    DeviceProfile,
    GpuRequest,
    Membership,
    Node,
    PolicyProfile,
    Pool,
    Team,
    WorkloadClass,
)
from portal.preview import gpu_request_preview
from scheduling import profile as scheduling_profile

# Keys a client may not send: the platform derives them (RELIABILITY.md §8.6).
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


def _detail(exc: DjangoValidationError) -> dict[str, Any]:
    if hasattr(exc, "error_dict"):
        return {
            ("non_field_errors" if k == "__all__" else k): v for k, v in exc.message_dict.items()
        }
    return {"non_field_errors": exc.messages}


class ApiView(APIView):
    """Turns a service's Django ValidationError into a 400 naming the field.

    Throttles count before credentials are refused: a wrong token or an
    anonymous call counts against the client's address (DRF would answer 401
    or 403 first and never count them, leaving token guessing unthrottled).
    """

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        try:
            user = request.user
        except AuthenticationFailed:
            self.check_throttles(request)
            raise
        if not user.is_authenticated:
            self.check_throttles(request)
            request._throttled = True  # type: ignore[attr-defined]
        super().initial(request, *args, **kwargs)

    def check_throttles(self, request: Request) -> None:
        if not getattr(request, "_throttled", False):
            super().check_throttles(request)

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, DjangoValidationError):
            exc = ValidationError(detail=_detail(exc))
        return super().handle_exception(exc)


class ListApiView(ApiView):
    """A list answered a page at a time: `{"count", "next", "previous", "results": [...]}`.

    `pagination_class` is what tells the schema the response is a page, not an array.
    """

    pagination_class = PageNumberPagination


def _paginate(
    view: APIView, request: Request, qs: Any, serializer: type[serializers.Serializer]
) -> Response:
    paginator = PageNumberPagination()
    page = paginator.paginate_queryset(qs, request, view=view)
    return paginator.get_paginated_response(serializer(page, many=True).data)


class StrictSerializer(serializers.Serializer):
    """Rejects keys it does not know, so `namespace` or `nodeName` cannot ride along unnoticed."""

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        unknown = set(getattr(self, "initial_data", {}) or {}) - set(self.fields)
        if unknown:
            raise ValidationError({k: ["This field is not accepted."] for k in sorted(unknown)})
        return attrs


# ---------------------------------------------------------------------------
# Requests


class GpuRequestOutputSerializer(serializers.Serializer):
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
    count = serializers.IntegerField(default=1, min_value=1, max_value=services.MAX_GPUS_PER_NODE)

    def resolve(self, user: Any) -> dict[str, Any]:
        """Turn names into rows; the team must be one of the user's (membership, never request data)."""
        d = dict(self.validated_data)
        mine = Team.objects.filter(memberships__user=user)
        if d.get("team"):
            team = mine.filter(name=d.pop("team")).first()
            if team is None:
                raise ValidationError({"team": ["You are not a member of this team."]})
        else:
            teams = list(mine[:2])
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
        pods = serializers.IntegerField(default=1, min_value=1, max_value=64)
        cpu_milli = serializers.IntegerField(default=1000, min_value=0, max_value=10**9)
        memory_mib = serializers.IntegerField(default=4096, min_value=0, max_value=10**9)
        image = serializers.CharField(max_length=500)
        command = serializers.JSONField(
            required=False, default=list, help_text="list of strings (or one string)"
        )
        env = serializers.JSONField(required=False, default=dict, help_text="mapping NAME -> value")
        checkpoint_interval_s = serializers.IntegerField(default=0, min_value=0, max_value=10**9)
        max_runtime_s = serializers.IntegerField(default=0, min_value=0, max_value=10**9)
        estimated_runtime_s = serializers.IntegerField(default=3600, min_value=1, max_value=10**9)
        priority = serializers.IntegerField(default=0, min_value=-100, max_value=100)
        kind = serializers.ChoiceField(choices=GpuRequest.Kind.values, default="batch")
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
        qs = selectors.request_list(
            request.user, mine=request.query_params.get("mine") in ("1", "true"), state=state
        )
        return _paginate(self, request, qs, self.OutputSerializer)

    @extend_schema(
        operation_id="requests_submit",
        request=SubmitInputSerializer,
        responses={201: GpuRequestOutputSerializer},
    )
    def post(self, request: Request) -> Response:
        serializer = self.SubmitInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        req = services.gpu_request_submit(user=request.user, **serializer.resolve(request.user))
        req.attempt_count = 0  # type: ignore[attr-defined]  # new: no query needed
        return Response(self.OutputSerializer(req).data, status=status.HTTP_201_CREATED)


class GpuRequestPreviewApi(ApiView):
    """What the scheduler would do with this request now; nothing is written."""

    class InputSerializer(SubmitFields):
        pass

    class OutputSerializer(serializers.Serializer):
        outcome = serializers.ChoiceField(choices=["fits", "waits", "rejected"])
        message = serializers.CharField()
        pool = serializers.CharField()
        code = serializers.CharField()
        position = serializers.IntegerField()
        estimated_start = serializers.DateTimeField(allow_null=True)
        borrowing = serializers.BooleanField()

    @extend_schema(
        operation_id="requests_preview", request=InputSerializer, responses=OutputSerializer
    )
    def post(self, request: Request) -> Response:
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        d = serializer.resolve(request.user)
        preview = gpu_request_preview(**d)
        return Response(self.OutputSerializer(preview).data)


class GpuRequestDetailApi(ApiView):
    OutputSerializer = GpuRequestOutputSerializer

    @extend_schema(operation_id="requests_get", responses=GpuRequestOutputSerializer)
    def get(self, request: Request, request_id: int) -> Response:
        req = access.get_gpu_request_for_user(request.user, request_id)
        return Response(self.OutputSerializer(req).data)


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
        req = services.gpu_request_cancel(
            user=request.user, gpu_request=req, reason=serializer.validated_data.get("reason", "")
        )
        return Response(self.OutputSerializer(req).data)


class QueueApi(ListApiView):
    """Pending requests in scheduling order (your teams'; all for admins)."""

    class OutputSerializer(serializers.Serializer):
        id = serializers.IntegerField()
        queue_position = serializers.IntegerField(allow_null=True)
        team = serializers.CharField(source="team.name")
        workload_class = serializers.CharField(source="workload_class.name")
        pool = serializers.CharField(source="pool.name", allow_null=True, default=None)
        profile = serializers.CharField(source="profile_label")
        count = serializers.IntegerField()
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
        return _paginate(
            self, request, selectors.queue_list(request.user, **filters), self.OutputSerializer
        )


# ---------------------------------------------------------------------------
# Pools and capacity


class PoolListApi(ApiView):
    """Pools with their capacity summary and the device profiles they offer."""

    class OutputSerializer(serializers.Serializer):
        id = serializers.IntegerField(source="pool.pk")
        name = serializers.CharField(source="pool.name")
        gpu_model = serializers.CharField(source="pool.gpu_model")
        gpu_memory_mib = serializers.IntegerField(source="pool.gpu_memory_mib")
        partitioning = serializers.CharField(source="pool.partitioning")
        lifecycle = serializers.CharField(source="pool.lifecycle")
        interconnect = serializers.CharField(source="pool.interconnect")
        mig_layout = serializers.ListField(source="pool.mig_layout", child=serializers.CharField())
        inference_floor_milli = serializers.IntegerField(source="pool.inference_floor_milli")
        nodes = serializers.IntegerField()
        cordoned = serializers.IntegerField()
        devices = serializers.IntegerField()
        unhealthy = serializers.IntegerField()
        quarantined = serializers.IntegerField()
        stale = serializers.IntegerField()
        usable = serializers.IntegerField()
        total_milli = serializers.IntegerField()
        allocated_milli = serializers.IntegerField()
        free_milli = serializers.IntegerField()
        profiles = serializers.ListField(child=serializers.CharField())

    @extend_schema(operation_id="pools_list", responses=OutputSerializer(many=True))
    def get(self, request: Request) -> Response:
        rows = selectors.pool_summaries()
        for r in rows:
            r["profiles"] = list(
                selectors.offered_profiles(r["pool"]).values_list("name", flat=True)
            )
        return Response(self.OutputSerializer(rows, many=True).data)


class CapacityApi(ListApiView):
    """Admins: node → device → slot, paginated by node."""

    class CellSerializer(serializers.Serializer):
        label = serializers.CharField()
        status = serializers.CharField()
        team = serializers.CharField()
        request_id = serializers.IntegerField(allow_null=True)
        width = serializers.IntegerField()

    class DeviceSerializer(serializers.Serializer):
        id = serializers.IntegerField(source="pk")
        index = serializers.IntegerField()
        model = serializers.CharField()
        partitioning = serializers.CharField()
        healthy = serializers.BooleanField()
        condition = serializers.CharField()
        quarantined = serializers.BooleanField()
        health_reason = serializers.CharField()
        utilization_pct = serializers.IntegerField()
        memory_used_mib = serializers.IntegerField()
        memory_mib = serializers.IntegerField()
        cells = serializers.SerializerMethodField()

        def get_cells(self, obj: Any) -> list[dict[str, Any]]:
            return CapacityApi.CellSerializer(obj.cells, many=True).data  # type: ignore[return-value]

    class OutputSerializer(serializers.Serializer):
        id = serializers.IntegerField(source="node.pk")
        name = serializers.CharField(source="node.name")
        pool = serializers.CharField(source="node.pool.name")
        ready = serializers.BooleanField(source="node.ready")
        cordoned = serializers.BooleanField(source="node.cordoned")
        draining = serializers.BooleanField(source="node.draining")
        devices = serializers.SerializerMethodField()

        def get_devices(self, obj: Any) -> list[dict[str, Any]]:
            return CapacityApi.DeviceSerializer(obj.devices, many=True).data  # type: ignore[return-value]

    @extend_schema(
        operation_id="capacity_list",
        parameters=[OpenApiParameter("pool", str)],
        responses=OutputSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        access.require_admin_read(request.user)
        nodes = Node.objects.select_related("pool").order_by("pool__name", "name")
        if request.query_params.get("pool"):
            nodes = nodes.filter(pool__name=request.query_params["pool"])
        paginator = PageNumberPagination()
        page = paginator.paginate_queryset(nodes, request, view=self)
        views = selectors.capacity_nodes(page or [])
        return paginator.get_paginated_response(self.OutputSerializer(views, many=True).data)


class NodeActionApi(ApiView):
    """Admins: cordon, drain or return a node."""

    class OutputSerializer(serializers.Serializer):
        id = serializers.IntegerField()
        name = serializers.CharField()
        cordoned = serializers.BooleanField()
        draining = serializers.BooleanField()

    @extend_schema(
        operation_id="nodes_action",
        request=ReasonInputSerializer,
        responses=OutputSerializer,
        parameters=[
            OpenApiParameter(
                "action", str, OpenApiParameter.PATH, enum=["cordon", "drain", "return"]
            )
        ],
    )
    def post(self, request: Request, node_id: int, action: str) -> Response:
        node = access.get_node_for_admin(request.user, node_id)
        serializer = ReasonInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        service = {
            "cordon": services.node_cordon,
            "drain": services.node_drain,
            "return": services.node_return,
        }[action]
        reason = serializer.validated_data.get("reason", "")
        return Response(
            self.OutputSerializer(service(actor=request.user, node=node, reason=reason)).data
        )


class DeviceClearQuarantineApi(ApiView):
    """Admins: return a quarantined device to service (audited). 400 if it is not quarantined."""

    class OutputSerializer(serializers.Serializer):
        id = serializers.IntegerField()
        node = serializers.CharField(source="node.name")
        index = serializers.IntegerField()
        quarantined = serializers.BooleanField()
        health_reason = serializers.CharField()

    @extend_schema(
        operation_id="devices_clear_quarantine", request=None, responses=OutputSerializer
    )
    def post(self, request: Request, device_id: int) -> Response:
        device = access.get_device_for_admin(request.user, device_id)
        device = services.device_clear_quarantine(actor=request.user, device=device)
        return Response(self.OutputSerializer(device).data)


# ---------------------------------------------------------------------------
# Decisions and audit


class DecisionListApi(ListApiView):
    class OutputSerializer(serializers.Serializer):
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
        return _paginate(
            self, request, selectors.decision_list(request.user, **filters), self.OutputSerializer
        )


class AuditListApi(ListApiView):
    class OutputSerializer(serializers.Serializer):
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
        qs: Any = selectors.audit_list(action=request.query_params.get("action", "")[:50])
        return _paginate(self, request, qs, self.OutputSerializer)


# ---------------------------------------------------------------------------
# Teams and quotas


class QuotaOutputSerializer(serializers.Serializer):
    pool = serializers.CharField(source="pool.name")
    nominal_milli = serializers.IntegerField()
    borrowing_limit_milli = serializers.IntegerField(allow_null=True)
    lending_limit_milli = serializers.IntegerField(allow_null=True)
    granted_milli = serializers.IntegerField()


class TeamOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    display_name = serializers.CharField()
    namespace = serializers.CharField()
    weight = serializers.IntegerField()


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
        return _paginate(
            self, request, access.teams_for(request.user).order_by("name"), self.OutputSerializer
        )

    @extend_schema(
        operation_id="teams_create",
        request=InputSerializer,
        responses={201: TeamOutputSerializer},
    )
    def post(self, request: Request) -> Response:
        access.require_admin(request.user)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        team = services.team_create(actor=request.user, **serializer.validated_data)
        return Response(self.OutputSerializer(team).data, status=status.HTTP_201_CREATED)


class MemberOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField(source="membership.pk")
    username = serializers.CharField(source="membership.user.username")
    role = serializers.CharField(source="membership.role")
    gpu_cap_milli = serializers.IntegerField(source="membership.gpu_cap_milli", allow_null=True)
    source = serializers.CharField(source="membership.source")
    holding_milli = serializers.IntegerField()
    pending = serializers.IntegerField()


def _member_view(membership: Membership) -> dict[str, Any]:
    """One member as team_members() lists them (holding and pending included)."""
    for m in selectors.team_members(membership.team):
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
        return _paginate(self, request, selectors.team_members(team), MemberOutputSerializer)

    @extend_schema(
        operation_id="team_members_add",
        request=InputSerializer,
        responses={201: MemberOutputSerializer},
    )
    def post(self, request: Request, team_id: int) -> Response:
        team = access.get_team_for_user(request.user, team_id, role=Membership.Role.LEAD)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        role = data.get("role", Membership.Role.MEMBER)
        if role != Membership.Role.MEMBER and not access.is_admin(request.user):
            raise ValidationError({"role": ["Only platform admins add leads."]})
        membership = services.membership_add(
            actor=request.user, team=team, username=data["username"], role=role
        )
        if data.get("gpu_cap_milli") is not None:
            membership = services.membership_set(
                actor=request.user,
                team=team,
                user=membership.user,
                role=membership.role,
                gpu_cap_milli=data["gpu_cap_milli"],
            )
        return Response(
            MemberOutputSerializer(_member_view(membership)).data, status=status.HTTP_201_CREATED
        )


class TeamMemberDetailApi(ApiView):
    """One member: leads set the cap and remove members; admins also change roles and remove leads.

    Removing a member cancels their pending requests in the team (running work finishes).
    """

    class InputSerializer(StrictSerializer):
        role = serializers.ChoiceField(choices=Membership.Role.values, required=False)
        gpu_cap_milli = serializers.IntegerField(
            min_value=0, max_value=10**9, required=False, allow_null=True
        )

    class RemovedSerializer(serializers.Serializer):
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
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        role = data.get("role", membership.role)
        if role != membership.role and not access.is_admin(request.user):
            raise ValidationError({"role": ["Only platform admins change roles."]})
        cap = data.get("gpu_cap_milli", membership.gpu_cap_milli)
        membership = services.membership_set(
            actor=request.user,
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
        cancelled = services.membership_remove(actor=request.user, membership=membership)
        return Response({"cancelled_requests": cancelled})


class TeamDetailApi(ApiView):
    """A team with its usage against guarantee per pool, and its members."""

    class UsageSerializer(serializers.Serializer):
        pool = serializers.CharField(source="pool.name")
        nominal_milli = serializers.IntegerField()
        used_milli = serializers.IntegerField()
        borrowed_milli = serializers.IntegerField()
        lent_milli = serializers.IntegerField()

    MemberSerializer = MemberOutputSerializer

    class OutputSerializer(serializers.Serializer):
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
            "usage": self.UsageSerializer(selectors.team_usage(team), many=True).data,
            "quotas": QuotaOutputSerializer(team.quotas.select_related("pool"), many=True).data,
            "members": self.MemberSerializer(selectors.team_members(team), many=True).data,
        }
        return Response(data)


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
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        quota = services.quota_set(
            actor=request.user, team=team, pool=pool, **serializer.validated_data
        )
        return Response(self.OutputSerializer(quota).data)


# ---------------------------------------------------------------------------
# Scheduling profiles


def _knob_field(knob: scheduling_profile.Knob, *, required: bool) -> serializers.Field:
    """A serializer field with the core's own bounds for one knob (`scheduling.profile`)."""
    kw: dict[str, Any] = {"required": required, "help_text": knob.help}
    if knob.choices:
        return serializers.ChoiceField(choices=list(knob.choices), **kw)
    if knob.type is str:
        return serializers.CharField(**kw)
    bounds = {"min_value": knob.minimum, "max_value": knob.maximum}
    if knob.type is int:
        return serializers.IntegerField(**bounds, **kw)
    return serializers.FloatField(**bounds, **kw)


def _knob_fields(*, required: bool) -> dict[str, serializers.Field]:
    return {
        name: _knob_field(knob, required=required)
        for name, knob in scheduling_profile.KNOBS.items()
    }


class _ProfileMeta(serializers.Serializer):
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
        serializer = ProfileCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        name = data.pop("name")
        row = services.policy_profile_create(actor=request.user, name=name, knobs=data)
        return Response(_profile_data(row), status=status.HTTP_201_CREATED)


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
        serializer = ProfileUpdateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        row = services.policy_profile_update(
            actor=request.user, profile=row, knobs=dict(serializer.validated_data)
        )
        return Response(_profile_data(row))


class ProfileActivateApi(ApiView):
    """Admins: make this the profile the scheduler runs from its next tick."""

    @extend_schema(
        operation_id="profiles_activate", request=None, responses=ProfileOutputSerializer
    )
    def post(self, request: Request, profile_id: int) -> Response:
        row = access.get_policy_profile_for_admin(request.user, profile_id)
        row = services.policy_profile_activate(actor=request.user, profile=row)
        return Response(_profile_data(row))


def _name_nested_serializers() -> None:
    """Name each nested serializer after its view in the schema ("QueueApiOutput", not "Output")."""
    for api_name, view in list(globals().items()):
        if not (isinstance(view, type) and issubclass(view, APIView)):
            continue
        for attr, value in vars(view).items():
            if (
                isinstance(value, type)
                and issubclass(value, serializers.Serializer)
                and value.__qualname__.startswith(api_name)
            ):
                extend_schema_serializer(component_name=api_name + attr.removesuffix("Serializer"))(
                    value
                )


_name_nested_serializers()


# ---------------------------------------------------------------------------
# Workloads


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

    class OutputSerializer(serializers.Serializer):
        attempt = serializers.IntegerField(source="pk")
        last_checkpoint_at = serializers.DateTimeField(allow_null=True)
        checkpoints = serializers.IntegerField()

    @extend_schema(
        operation_id="attempts_checkpoint",
        request=None,
        responses={
            200: OutputSerializer,
            409: OpenApiResponse(ErrorSerializer, description="The attempt has ended."),
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
            attempt = services.attempt_checkpoint_report(attempt_id=attempt_id, token=token)
        except services.AttemptNotRunning as exc:
            raise AttemptConflict(f"The attempt is {exc.state}: nothing to checkpoint.") from None
        return Response(self.OutputSerializer(attempt).data)
