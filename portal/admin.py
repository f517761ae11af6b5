"""Django admin: a read-only window on audited data.

Every change to teams, memberships, quotas, pools, classes, nodes, devices and
requests goes through `portal.services`, which writes the audit event; the
portal's pages (settings, capacity, team pages) are where admins make them.
Decisions and audit events are append-only records: nobody edits or deletes
them, admin included. Removing a membership is allowed here because it goes
through `services.membership_remove`. Device profiles carry no audit and stay editable here.
"""

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from portal import access, models
from portal.services.teams import membership_remove


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Viewable, never added to, changed or deleted here: the services audit each change."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ReadOnlyInline(admin.TabularInline):  # type: ignore[type-arg]
    extra = 0

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(models.Team)
class TeamAdmin(ReadOnlyAdmin):
    list_display = ["name", "namespace", "weight"]


@admin.register(models.Membership)
class MembershipAdmin(ReadOnlyAdmin):
    """Read-only, except removal, which goes through the service (pending requests cancelled, audited)."""

    list_display = ["user", "team", "role", "gpu_cap_milli", "source"]
    list_filter = ["team", "role"]

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return access.is_admin(request.user)

    def delete_model(self, request: HttpRequest, obj: models.Membership) -> None:
        membership_remove(actor=request.user, membership=obj)  # type: ignore[arg-type]

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        for m in queryset:
            membership_remove(actor=request.user, membership=m)  # type: ignore[arg-type]


@admin.register(models.WorkloadClass)
class WorkloadClassAdmin(ReadOnlyAdmin):
    list_display = [
        "name",
        "band",
        "preemption",
        "min_runtime_s",
        "max_queue_s",
        "inference",
        "restricted",
        "kinds",
    ]


@admin.register(models.DeviceProfile)
class DeviceProfileAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["name", "kind", "mig_profile", "milli", "gpu_memory_mib"]


@admin.register(models.Pool)
class PoolAdmin(ReadOnlyAdmin):
    list_display = ["name", "gpu_model", "partitioning", "lifecycle", "inference_floor_milli"]


class DeviceInline(ReadOnlyInline):
    model = models.Device


@admin.register(models.Node)
class NodeAdmin(ReadOnlyAdmin):
    list_display = ["name", "pool", "ready", "cordoned", "last_heartbeat"]
    list_filter = ["pool", "ready", "cordoned"]
    inlines = [DeviceInline]


@admin.register(models.Device)
class DeviceAdmin(ReadOnlyAdmin):
    list_display = ["__str__", "model", "healthy", "agent_healthy", "quarantined", "health_reason"]
    list_filter = ["quarantined", "healthy", "agent_healthy"]


@admin.register(models.Quota)
class QuotaAdmin(ReadOnlyAdmin):
    list_display = [
        "team",
        "pool",
        "nominal_milli",
        "borrowing_limit_milli",
        "lending_limit_milli",
        "granted_milli",
    ]


class AttemptInline(ReadOnlyInline):
    model = models.Attempt


@admin.register(models.GpuRequest)
class GpuRequestAdmin(ReadOnlyAdmin):
    list_display = ["id", "name", "team", "workload_class", "state", "created_at"]
    list_filter = ["state", "team", "workload_class"]
    inlines = [AttemptInline]


@admin.register(models.Decision)
class DecisionAdmin(ReadOnlyAdmin):
    """Read-only: decisions are the scheduler's record, never edited or deleted."""

    list_display = ["created_at", "kind", "code", "request", "team", "message"]
    list_filter = ["kind", "team"]


@admin.register(models.AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    """Read-only: audit events are append-only, admin included."""

    list_display = ["created_at", "actor_name", "action", "object_type", "object_id", "team"]
    list_filter = ["action"]
