from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from portal import models, services


@admin.register(models.Team)
class TeamAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["name", "namespace", "weight"]


@admin.register(models.Membership)
class MembershipAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["user", "team", "role", "gpu_cap_milli"]
    list_filter = ["team", "role"]

    # Removing a member cancels their pending requests, audited: through the service.
    def delete_model(self, request: HttpRequest, obj: models.Membership) -> None:
        services.membership_remove(actor=request.user, membership=obj)  # type: ignore[arg-type]

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        for m in queryset:
            services.membership_remove(actor=request.user, membership=m)  # type: ignore[arg-type]


@admin.register(models.WorkloadClass)
class WorkloadClassAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["name", "band", "preemption", "min_runtime_s", "max_queue_s", "inference"]


@admin.register(models.DeviceProfile)
class DeviceProfileAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["name", "kind", "mig_profile", "milli", "gpu_memory_mib"]


@admin.register(models.Pool)
class PoolAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["name", "gpu_model", "partitioning", "lifecycle", "inference_floor_milli"]


class DeviceInline(admin.TabularInline):  # type: ignore[type-arg]
    model = models.Device
    extra = 0


@admin.register(models.Node)
class NodeAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["name", "pool", "ready", "cordoned", "last_heartbeat"]
    list_filter = ["pool", "ready", "cordoned"]
    inlines = [DeviceInline]


@admin.register(models.Quota)
class QuotaAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = [
        "team",
        "pool",
        "nominal_milli",
        "borrowing_limit_milli",
        "lending_limit_milli",
        "granted_milli",
    ]


class AttemptInline(admin.TabularInline):  # type: ignore[type-arg]
    model = models.Attempt
    extra = 0
    readonly_fields = [
        "number",
        "state",
        "pool",
        "nodes",
        "admitted_at",
        "started_at",
        "ended_at",
        "released_at",
    ]


@admin.register(models.GpuRequest)
class GpuRequestAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["id", "name", "team", "workload_class", "state", "created_at"]
    list_filter = ["state", "team", "workload_class"]
    inlines = [AttemptInline]


@admin.register(models.Decision)
class DecisionAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["created_at", "kind", "code", "request", "team", "message"]
    list_filter = ["kind", "team"]


@admin.register(models.AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Read-only: audit events are append-only, admin included."""

    list_display = ["created_at", "actor_name", "action", "object_type", "object_id", "team"]
    list_filter = ["action"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
