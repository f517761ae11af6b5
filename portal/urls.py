"""URLs. Object ids in paths are named after their model (request_id, team_id, ...) so the
cross-tenant test in tests/portal/security/test_views_access.py knows what to put in each."""

from django.contrib import admin
from django.urls import include, path, register_converter
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.permissions import IsAuthenticated

from portal.api import agent as agent_api
from portal.api import demand as api_capacity
from portal.api import lifecycle as api_lifecycle
from portal.api import serving as api_serving
from portal.api.agent import AttemptCheckpointApi
from portal.api.audit import AuditListApi, DecisionListApi
from portal.api.capacity import CapacityApi, DeviceClearQuarantineApi, NodeActionApi
from portal.api.pools import ClassDetailApi, ClassListApi, PoolDetailApi, PoolListCreateApi
from portal.api.profiles import ProfileActivateApi, ProfileDetailApi, ProfileListCreateApi
from portal.api.requests import (
    GpuRequestCancelApi,
    GpuRequestDetailApi,
    GpuRequestEventsApi,
    GpuRequestListSubmitApi,
    GpuRequestLogsApi,
    GpuRequestPreviewApi,
    QueueApi,
)
from portal.api.teams import (
    QuotaSetApi,
    TeamDetailApi,
    TeamListApi,
    TeamMemberDetailApi,
    TeamMemberListApi,
)
from portal.api.tokens import TokenDetailApi, TokenListCreateApi
from portal.metrics import collector as metrics
from portal.views import autoscaling as views_autoscaling
from portal.views import lifecycle as views_lifecycle
from portal.views import reports as views_reports
from portal.views import whatif as views_whatif
from portal.views.audit import audit_csv, audit_log, decision_log
from portal.views.capacity import capacity, device_clear_quarantine, node_action, nodes_bulk_action
from portal.views.discovery import discover_create, discover_page
from portal.views.health import healthz, readyz
from portal.views.history import node_history, pool_history, team_history
from portal.views.me import LoginView, LogoutView, notification_settings, template_delete
from portal.views.overview import overview
from portal.views.requests import (
    home,
    queue,
    request_cancel,
    request_detail,
    request_logs,
    request_logs_download,
    request_preview,
    request_submit,
    requests_bulk_cancel,
)
from portal.views.serving import serving_change, serving_panel
from portal.views.settings import (
    pool_edit,
    pool_new,
    pool_retire_view,
    profile_activate,
    profile_compare,
    profile_create,
    profile_edit,
    settings_page,
    workload_class_edit,
    workload_class_new,
    workload_class_retire_view,
)
from portal.views.teams import (
    member_add,
    member_edit,
    member_remove,
    quota_edit,
    team_create,
    team_detail,
    team_list,
    team_retire_view,
)
from portal.views.tokens import all_tokens, my_tokens, token_revoke_view


class NodeActionConverter:
    regex = "cordon|drain|return"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(NodeActionConverter, "node_action")

portal_patterns = [
    path("", home, name="home"),
    path("requests/new/", request_submit, name="request-submit"),
    path("requests/preview/", request_preview, name="request-preview"),
    path("requests/<int:request_id>/", request_detail, name="request-detail"),
    path("requests/<int:request_id>/cancel/", request_cancel, name="request-cancel"),
    path("requests/<int:request_id>/logs/", request_logs, name="request-logs"),
    path(
        "requests/<int:request_id>/logs/download/",
        request_logs_download,
        name="request-logs-download",
    ),
    path("me/notifications/", notification_settings, name="notifications"),
    path("me/tokens/", my_tokens, name="tokens"),
    path("me/tokens/revoke/", token_revoke_view, name="token-revoke"),
    path("ops/tokens/", all_tokens, name="tokens-all"),
    path(
        "me/templates/<int:template_id>/delete/",
        template_delete,
        name="template-delete",
    ),
    path("queue/", queue, name="queue"),
    path("decisions/", decision_log, name="decisions"),
    path("teams/", team_list, name="team-list"),
    path("teams/new/", team_create, name="team-create"),
    path("teams/<int:team_id>/", team_detail, name="team-detail"),
    path("teams/<int:team_id>/retire/", team_retire_view, name="team-retire"),
    path("teams/<int:team_id>/members/add/", member_add, name="member-add"),
    path(
        "teams/<int:team_id>/members/<int:membership_id>/remove/",
        member_remove,
        name="member-remove",
    ),
    path("teams/<int:team_id>/quotas/<int:pool_id>/", quota_edit, name="quota-edit"),
    path("teams/<int:team_id>/members/<int:membership_id>/", member_edit, name="member-edit"),
    path("ops/overview/", overview, name="overview"),
    path("ops/capacity/", capacity, name="capacity"),
    path("ops/audit/", audit_log, name="audit"),
    path("ops/settings/", settings_page, name="settings"),
    path("ops/classes/new/", workload_class_new, name="class-new"),
    path("ops/classes/<int:class_id>/", workload_class_edit, name="class-edit"),
    path("ops/classes/<int:class_id>/retire/", workload_class_retire_view, name="class-retire"),
    path("ops/pools/new/", pool_new, name="pool-new"),
    path("ops/discover/", discover_page, name="discover"),
    path("ops/discover/create/", discover_create, name="discover-create"),
    path("ops/pools/<int:pool_id>/", pool_edit, name="pool-edit"),
    path("ops/pools/<int:pool_id>/retire/", pool_retire_view, name="pool-retire"),
    path("ops/profiles/new/", profile_create, name="profile-create"),
    path("ops/profiles/compare/", profile_compare, name="profile-compare"),
    path("ops/profiles/<int:profile_id>/", profile_edit, name="profile-edit"),
    path(
        "ops/profiles/<int:profile_id>/activate/",
        profile_activate,
        name="profile-activate",
    ),
    path(
        "ops/nodes/<int:node_id>/<node_action:action>/",
        node_action,
        name="node-action",
    ),
    path("ops/whatif/", views_whatif.whatif_list, name="whatif"),
    path("ops/whatif/<int:run_id>/", views_whatif.whatif_detail, name="whatif-detail"),
    path("ops/whatif/<int:run_id>/apply/", views_whatif.whatif_apply, name="whatif-apply"),
    path(
        "ops/devices/<int:device_id>/clear-quarantine/",
        device_clear_quarantine,
        name="device-clear-quarantine",
    ),
    path("ops/audit.csv", audit_csv, name="audit-csv"),
    path("requests/bulk-cancel/", requests_bulk_cancel, name="requests-bulk-cancel"),
    path("ops/nodes/bulk/", nodes_bulk_action, name="nodes-bulk-action"),
    path("requests/<int:request_id>/serving/", serving_panel, name="request-serving"),
    path(
        "requests/<int:request_id>/serving/change/",
        serving_change,
        name="request-serving-change",
    ),
    path("pools/<int:pool_id>/history/", pool_history, name="pool-history"),
    path("ops/nodes/<int:node_id>/history/", node_history, name="node-history"),
    path("teams/<int:team_id>/history/", team_history, name="team-history"),
    path("ops/pools/<int:pool_id>/lifecycle/", views_lifecycle.pool_detail, name="pool-detail"),
    path(
        "ops/pools/<int:pool_id>/rollouts/",
        views_lifecycle.rollout_create,
        name="rollout-create",
    ),
    path("ops/nodes/<int:node_id>/validate/", views_lifecycle.node_validate, name="node-validate"),
    path("ops/pools/<int:pool_id>/validate/", views_lifecycle.pool_validate, name="pool-validate"),
    path(
        "ops/pools/<int:pool_id>/mig-relayout/",
        views_lifecycle.pool_mig_relayout,
        name="mig-relayout",
    ),
    path("ops/rollouts/", views_lifecycle.rollout_index, name="rollouts"),
    path("ops/autoscaling/", views_autoscaling.autoscaling, name="autoscaling"),
    path("ops/reports/estimates/", views_reports.estimates, name="report-estimates"),
    path("ops/reports/idle-quota/", views_reports.idle_quota, name="report-idle-quota"),
    path("ops/rollouts/<int:rollout_id>/", views_lifecycle.rollout_detail, name="rollout-detail"),
    path("ops/rollouts/<int:rollout_id>/halt/", views_lifecycle.rollout_halt, name="rollout-halt"),
]

api_patterns = [
    path("requests/", GpuRequestListSubmitApi.as_view(), name="requests"),
    path("requests/preview/", GpuRequestPreviewApi.as_view(), name="request-preview"),
    path("requests/<int:request_id>/", GpuRequestDetailApi.as_view(), name="request-detail"),
    path("requests/<int:request_id>/logs/", GpuRequestLogsApi.as_view(), name="request-logs"),
    path("requests/<int:request_id>/events/", GpuRequestEventsApi.as_view(), name="request-events"),
    path(
        "requests/<int:request_id>/cancel/",
        GpuRequestCancelApi.as_view(),
        name="request-cancel",
    ),
    path("queue/", QueueApi.as_view(), name="queue"),
    path("tokens/", TokenListCreateApi.as_view(), name="tokens"),
    path("tokens/<int:token_id>/", TokenDetailApi.as_view(), name="token-detail"),
    path("pools/", PoolListCreateApi.as_view(), name="pools"),
    path("capacity/", CapacityApi.as_view(), name="capacity"),
    path("nodes/<int:node_id>/<node_action:action>/", NodeActionApi.as_view(), name="node-action"),
    path(
        "devices/<int:device_id>/clear-quarantine/",
        DeviceClearQuarantineApi.as_view(),
        name="device-clear-quarantine",
    ),
    path(
        "attempts/<int:attempt_id>/checkpoint",
        AttemptCheckpointApi.as_view(),
        name="attempt-checkpoint",
    ),
    path("decisions/", DecisionListApi.as_view(), name="decisions"),
    path("audit/", AuditListApi.as_view(), name="audit"),
    path("pools/<int:pool_id>/", PoolDetailApi.as_view(), name="pool-detail"),
    path("classes/", ClassListApi.as_view(), name="classes"),
    path("classes/<int:class_id>/", ClassDetailApi.as_view(), name="class-detail"),
    path("teams/", TeamListApi.as_view(), name="teams"),
    path("teams/<int:team_id>/", TeamDetailApi.as_view(), name="team-detail"),
    path("teams/<int:team_id>/members/", TeamMemberListApi.as_view(), name="team-members"),
    path(
        "teams/<int:team_id>/members/<int:membership_id>/",
        TeamMemberDetailApi.as_view(),
        name="team-member",
    ),
    path("teams/<int:team_id>/quotas/<int:pool_id>/", QuotaSetApi.as_view(), name="quota-set"),
    path("profiles/", ProfileListCreateApi.as_view(), name="profiles"),
    path("profiles/<int:profile_id>/", ProfileDetailApi.as_view(), name="profile-detail"),
    path(
        "profiles/<int:profile_id>/activate/",
        ProfileActivateApi.as_view(),
        name="profile-activate",
    ),
    path(
        "requests/<int:request_id>/serving/",
        api_serving.ServingUpdateApi.as_view(),
        name="request-serving",
    ),
    path(
        "requests/<int:request_id>/metrics/",
        api_serving.RequestMetricsApi.as_view(),
        name="request-metrics",
    ),
    path("rollouts/", api_lifecycle.RolloutListCreateApi.as_view(), name="rollouts"),
    path(
        "rollouts/<int:rollout_id>/",
        api_lifecycle.RolloutDetailApi.as_view(),
        name="rollout-detail",
    ),
    path(
        "rollouts/<int:rollout_id>/halt/",
        api_lifecycle.RolloutHaltApi.as_view(),
        name="rollout-halt",
    ),
    path(
        "validations/<int:validation_id>/result",
        api_lifecycle.ValidationResultApi.as_view(),
        name="validation-result",
    ),
    path("capacity/demand/", api_capacity.DemandApi.as_view(), name="capacity-demand"),
    path("policy/versions/", api_capacity.PolicyVersionListApi.as_view(), name="policy-versions"),
]

urlpatterns = [
    path("", include((portal_patterns, "portal"))),
    path("api/v1/", include((api_patterns, "api"))),
    # Machine endpoints (bearer tokens, no sessions): see portal/api/agent.py.
    path("api/v1/agent/report/", agent_api.agent_report, name="agent-report"),
    path(
        "api/v1/agent/attempts/<int:attempt_id>/ready",
        agent_api.attempt_ready,
        name="agent-attempt-ready",
    ),
    path(
        "api/schema/",
        SpectacularAPIView.as_view(permission_classes=[IsAuthenticated]),
        name="schema",
    ),
    path(
        "api/docs/",
        # Split: its script is a file of its own (?script), not inline, as the CSP asks.
        SpectacularSwaggerSplitView.as_view(
            url_name="schema",
            permission_classes=[IsAuthenticated],
            template_name="portal/swagger_ui.html",
        ),
        name="api-docs",
    ),
    path("accounts/login/", LoginView.as_view(), name="login"),
    # Single sign-on (portal/auth/sso.py): /oidc/authenticate/ and /oidc/callback/; 404 while off.
    path("oidc/", include("mozilla_django_oidc.urls")),
    path("accounts/logout/", LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("healthz", healthz, name="healthz"),
    path("readyz", readyz, name="readyz"),
    path("metrics", metrics.metrics_view, name="metrics"),
]

handler404 = "portal.views.errors.not_found"
handler403 = "portal.views.errors.permission_denied"
handler500 = "portal.views.errors.server_error"
