"""The audit log (append-only) and the policy versions its changes create."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import models

from portal.models.teams import Team

if TYPE_CHECKING:
    pass


class AuditEventQuerySet(models.QuerySet["AuditEvent"]):
    def update(self, **kwargs: Any) -> int:
        raise PermissionError("audit events are append-only")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise PermissionError("audit events are append-only")


class AuditEvent(models.Model):
    """Who changed what, before and after. Append-only, in Python and in the database."""

    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    actor_name = models.CharField(max_length=150)
    action = models.CharField(max_length=50, db_index=True)
    object_type = models.CharField(max_length=50)
    object_id = models.CharField(max_length=50)
    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.SET_NULL)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    #: why, in the actor's words (asked for cancel, cordon, drain and quota changes)
    reason = models.CharField(max_length=500, blank=True, default="")

    objects = AuditEventQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None:
            raise PermissionError("audit events are append-only")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise PermissionError("audit events are append-only")


class PolicyVersion(models.Model):
    """One applied change of scheduling policy: a quota, a workload class, a pool's
    settings, or a scheduling profile (created, changed, activated). Numbered in order;
    every decision records the number in force (`Decision.policy_version`), so a decision
    can be read against the settings it was made under. Written with the audit event
    (`services.audit`), whose before and after it keeps."""

    number = models.PositiveIntegerField(unique=True)
    action = models.CharField(max_length=50)
    object_type = models.CharField(max_length=50)
    object_id = models.CharField(max_length=50)
    actor_name = models.CharField(max_length=150, blank=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-number"]

    def __str__(self) -> str:
        return f"policy v{self.number}: {self.action}"
