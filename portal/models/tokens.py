"""Personal access tokens for the API, and the idempotency keys of API submits."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import models


class PersonalToken(models.Model):
    """A user's API token. Only the secret's sha256 is kept; `prefix` tells tokens apart."""

    class Scope(models.TextChoices):
        #: safe methods only (GET, HEAD, OPTIONS)
        READ = "read", "read"
        #: everything the user may do, except what only admins may do
        SUBMIT = "read+submit", "read and submit"
        #: everything the user may do; only admins hold one
        ADMIN = "admin", "admin"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="personal_tokens"
    )
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16)
    digest = models.CharField(max_length=64, unique=True)
    scope = models.CharField(max_length=16, choices=Scope.choices, default=Scope.SUBMIT)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    def state_at(self, now: datetime) -> str:
        """ "active", "revoked" or "expired"."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at <= now:
            return "expired"
        return "active"


class IdempotencyKey(models.Model):
    """The first answer to a submit sent with an `Idempotency-Key`; a retry gets it again.

    The unique constraint is what makes two racing submits with one key create one request.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    #: sha256 of the request body: the same key with another body is refused
    fingerprint = models.CharField(max_length=64)
    status_code = models.PositiveSmallIntegerField(default=0)
    body = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "key"], name="idempotency_key_one_per_user")
        ]
