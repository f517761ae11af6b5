"""URLs. Object ids in paths are named after their model (request_id, team_id, ...) so the
cross-tenant test in tests/portal/test_views_access.py knows what to put in each."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path, register_converter
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.permissions import IsAuthenticated

from portal import (
    agent_api,
    api,
    api_capacity,
    api_lifecycle,
    api_serving,
    metrics,
    views,
    views_admin,
    views_lifecycle,
    views_people,
    views_serving,
    views_whatif,
)


class NodeActionConverter:
    regex = "cordon|drain|return"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(NodeActionConverter, "node_action")

portal_patterns = [
    path("", views.home, name="home"),
    path("requests/new/", views.request_submit, name="request-submit"),
    path("requests/preview/", views.request_preview, name="request-preview"),
    path("requests/<int:request_id>/", views.request_detail, name="request-detail"),
    path("requests/<int:request_id>/cancel/", views_admin.request_cancel, name="request-cancel"),
    path("requests/<int:request_id>/logs/", views_people.request_logs, name="request-logs"),
    path(
        "requests/<int:request_id>/logs/download/",
        views_people.request_logs_download,
        name="request-logs-download",
    ),
    path("me/notifications/", views_people.notification_settings, name="notifications"),
    path(
        "me/templates/<int:template_id>/delete/",
        views_people.template_delete,
        name="template-delete",
    ),
    path("queue/", views.queue, name="queue"),
    path("decisions/", views.decision_log, name="decisions"),
    path("teams/", views.team_list, name="team-list"),
    path("teams/new/", views.team_create, name="team-create"),
    path("teams/<int:team_id>/", views.team_detail, name="team-detail"),
    path("teams/<int:team_id>/members/add/", views.member_add, name="member-add"),
    path(
        "teams/<int:team_id>/members/<int:membership_id>/remove/",
        views.member_remove,
        name="member-remove",
    ),
    path("teams/<int:team_id>/quotas/<int:pool_id>/", views.quota_edit, name="quota-edit"),
    path("teams/<int:team_id>/members/<int:membership_id>/", views.member_edit, name="member-edit"),
    path("ops/capacity/", views.capacity, name="capacity"),
    path("ops/audit/", views_admin.audit_log, name="audit"),
    path("ops/settings/", views.settings_page, name="settings"),
    path("ops/classes/<int:class_id>/", views.workload_class_edit, name="class-edit"),
    path("ops/pools/<int:pool_id>/", views.pool_edit, name="pool-edit"),
    path("ops/profiles/new/", views.profile_create, name="profile-create"),
    path("ops/profiles/<int:profile_id>/", views.profile_edit, name="profile-edit"),
    path(
        "ops/profiles/<int:profile_id>/activate/",
        views.profile_activate,
        name="profile-activate",
    ),
    path(
        "ops/nodes/<int:node_id>/<node_action:action>/",
        views_admin.node_action,
        name="node-action",
    ),
    path("ops/whatif/", views_whatif.whatif_list, name="whatif"),
    path("ops/whatif/<int:run_id>/", views_whatif.whatif_detail, name="whatif-detail"),
    path("ops/whatif/<int:run_id>/apply/", views_whatif.whatif_apply, name="whatif-apply"),
    path(
        "ops/devices/<int:device_id>/clear-quarantine/",
        views.device_clear_quarantine,
        name="device-clear-quarantine",
    ),
    path("ops/audit.csv", views_admin.audit_csv, name="audit-csv"),
    path("requests/bulk-cancel/", views_admin.requests_bulk_cancel, name="requests-bulk-cancel"),
    path("ops/nodes/bulk/", views_admin.nodes_bulk_action, name="nodes-bulk-action"),
    path("requests/<int:request_id>/serving/", views_serving.serving_panel, name="request-serving"),
    path(
        "requests/<int:request_id>/serving/change/",
        views_serving.serving_change,
        name="request-serving-change",
    ),
    path("pools/<int:pool_id>/history/", views_serving.pool_history, name="pool-history"),
    path("ops/nodes/<int:node_id>/history/", views_serving.node_history, name="node-history"),
    path("teams/<int:team_id>/history/", views_serving.team_history, name="team-history"),
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
    path("ops/rollouts/<int:rollout_id>/", views_lifecycle.rollout_detail, name="rollout-detail"),
    path("ops/rollouts/<int:rollout_id>/halt/", views_lifecycle.rollout_halt, name="rollout-halt"),
]

api_patterns = [
    path("requests/", api.GpuRequestListSubmitApi.as_view(), name="requests"),
    path("requests/preview/", api.GpuRequestPreviewApi.as_view(), name="request-preview"),
    path("requests/<int:request_id>/", api.GpuRequestDetailApi.as_view(), name="request-detail"),
    path(
        "requests/<int:request_id>/cancel/",
        api.GpuRequestCancelApi.as_view(),
        name="request-cancel",
    ),
    path("queue/", api.QueueApi.as_view(), name="queue"),
    path("pools/", api.PoolListApi.as_view(), name="pools"),
    path("capacity/", api.CapacityApi.as_view(), name="capacity"),
    path(
        "nodes/<int:node_id>/<node_action:action>/", api.NodeActionApi.as_view(), name="node-action"
    ),
    path(
        "devices/<int:device_id>/clear-quarantine/",
        api.DeviceClearQuarantineApi.as_view(),
        name="device-clear-quarantine",
    ),
    path(
        "attempts/<int:attempt_id>/checkpoint",
        api.AttemptCheckpointApi.as_view(),
        name="attempt-checkpoint",
    ),
    path("decisions/", api.DecisionListApi.as_view(), name="decisions"),
    path("audit/", api.AuditListApi.as_view(), name="audit"),
    path("teams/", api.TeamListApi.as_view(), name="teams"),
    path("teams/<int:team_id>/", api.TeamDetailApi.as_view(), name="team-detail"),
    path("teams/<int:team_id>/members/", api.TeamMemberListApi.as_view(), name="team-members"),
    path(
        "teams/<int:team_id>/members/<int:membership_id>/",
        api.TeamMemberDetailApi.as_view(),
        name="team-member",
    ),
    path("teams/<int:team_id>/quotas/<int:pool_id>/", api.QuotaSetApi.as_view(), name="quota-set"),
    path("profiles/", api.ProfileListCreateApi.as_view(), name="profiles"),
    path("profiles/<int:profile_id>/", api.ProfileDetailApi.as_view(), name="profile-detail"),
    path(
        "profiles/<int:profile_id>/activate/",
        api.ProfileActivateApi.as_view(),
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
    # Machine endpoints (bearer tokens, no sessions): see portal/agent_api.py.
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
        SpectacularSwaggerView.as_view(url_name="schema", permission_classes=[IsAuthenticated]),
        name="api-docs",
    ),
    path("accounts/login/", views.LoginView.as_view(), name="login"),
    # Single sign-on (portal/sso.py): /oidc/authenticate/ and /oidc/callback/; 404 while off.
    path("oidc/", include("mozilla_django_oidc.urls")),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("healthz", views.healthz, name="healthz"),
    path("readyz", views.readyz, name="readyz"),
    path("metrics", metrics.metrics_view, name="metrics"),
]

handler404 = "portal.views.not_found"
handler403 = "portal.views_people.permission_denied"
