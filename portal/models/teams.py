"""Teams and the people in them: memberships, quotas per pool, and each user's own settings."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models

from portal.lib import validation

slug_validator = RegexValidator(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
    "Use lower-case letters, digits and dashes (a Kubernetes name).",
)


class Team(models.Model):
    name = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    display_name = models.CharField(max_length=200, blank=True)
    #: Kubernetes namespace the team's workloads run in; set by admins only.
    namespace = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    #: fair-share weight
    weight = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1)])
    #: most pending requests at once; 0 = the site default
    max_pending = models.PositiveIntegerField(default=0, help_text="0 = the site default")
    created_at = models.DateTimeField(auto_now_add=True)
    #: written by `manage.py config apply`: a change in the pages is drift the next apply reverts
    config_managed = models.BooleanField(default=False)
    #: identity-provider groups whose members single sign-on makes members of this team:
    #: {group: "member" | "lead"}, beside the site-wide OIDC_GROUP_MAP
    groups = models.JSONField(default=dict, blank=True)
    #: retired: no new requests, no quota in the cohort; the row stays for the audit and
    #: decision logs
    retired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if not isinstance(self.groups, dict) or not all(
            isinstance(g, str) and g and len(g) <= 200 and r in ("member", "lead")
            for g, r in self.groups.items()
        ):
            raise ValidationError({"groups": 'Groups are {"group name": "member" or "lead"}.'})


class Membership(models.Model):
    class Role(models.TextChoices):
        MEMBER = "member"
        LEAD = "lead"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)

    class Source(models.TextChoices):
        #: added by a lead or an admin; single sign-on leaves it alone
        MANUAL = "manual"
        #: from the identity provider's groups (OIDC_GROUP_MAP); synced at each sign-in
        SSO = "sso"

    #: most GPU milli this member may hold at once; null = no cap beyond the team's
    gpu_cap_milli = models.PositiveIntegerField(null=True, blank=True)
    source = models.CharField(max_length=10, choices=Source.choices, default=Source.MANUAL)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "team"], name="membership_unique")]
        ordering = ["team__name", "user__username"]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


class Quota(models.Model):
    """A team's share of a pool, in GPU milli. Null limits are unlimited."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="quotas")
    pool = models.ForeignKey("Pool", on_delete=models.CASCADE, related_name="quotas")
    nominal_milli = models.PositiveIntegerField(default=0)
    borrowing_limit_milli = models.PositiveIntegerField(null=True, blank=True)
    lending_limit_milli = models.PositiveIntegerField(null=True, blank=True)
    #: the most the lead may set nominal to; admins set it (0 = nominal is admin-only)
    granted_milli = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["team__name", "pool__name"]
        constraints = [models.UniqueConstraint(fields=["team", "pool"], name="quota_unique")]

    def __str__(self) -> str:
        return f"{self.team}@{self.pool}"


class NotificationPreference(models.Model):
    """What a user is told about their requests, and how (portal/services/notify.py).

    A user without a row gets the defaults below (email, if they have an address).
    """

    class Event(models.TextChoices):
        START = "start", "started"
        END = "end", "finished"
        FAILURE = "failure", "failed"
        PREEMPTION = "preemption", "preempted"
        LONG_WAIT = "long_wait", "still waiting"

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notification_preference"
    )
    email = models.BooleanField(default=True, help_text="to the address on your account")

    class WebhookFormat(models.TextChoices):
        #: Teams Workflows by its host (*.logic.azure.com, *.powerplatform.com), else Slack's
        AUTO = "auto", "by the address"
        #: {"text": …}: Slack, and the chat servers that speak Slack's format (Mattermost, …)
        SLACK = "slack", "Slack"
        #: a message with an Adaptive Card: Microsoft Teams Workflows
        TEAMS = "teams", "Microsoft Teams Workflows"

    webhook_url = models.URLField(
        max_length=500,
        blank=True,
        help_text="Slack incoming webhook or Microsoft Teams Workflows webhook",
        validators=[validation.webhook_url],
    )
    webhook_format = models.CharField(
        max_length=10,
        choices=WebhookFormat.choices,
        default=WebhookFormat.AUTO,
        help_text='what the webhook is posted: Slack\'s {"text": …} or a Teams Adaptive Card',
    )
    on_start = models.BooleanField(default=False, verbose_name="when a request starts")
    on_end = models.BooleanField(default=True, verbose_name="when it finishes")
    on_failure = models.BooleanField(default=True, verbose_name="when it fails")
    on_preemption = models.BooleanField(default=True, verbose_name="when it is preempted")
    on_long_wait = models.BooleanField(default=True, verbose_name="when it waits long")

    def __str__(self) -> str:
        return f"notifications of {self.user}"

    def wants(self, event: str) -> bool:
        return bool(getattr(self, f"on_{event}", False))


class RequestTemplate(models.Model):
    """A submit form saved under a name, to fill the form again later."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="request_templates"
    )
    name = models.CharField(max_length=100)
    #: the submit form's fields as posted (team and class by id, env as text)
    fields = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["user", "name"], name="request_template_unique")
        ]

    def __str__(self) -> str:
        return self.name
