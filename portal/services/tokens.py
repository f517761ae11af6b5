"""Personal access tokens: created (the secret returned once), revoked, their use noted."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from portal import access
from portal.lib.tokens import token_digest, token_secret_new, token_shown
from portal.models import PersonalToken
from portal.services.audit import Actor, audit

#: most unrevoked tokens a user holds at once
MAX_ACTIVE_TOKENS = 50
#: last use is written at most this often per token (a busy script would write on every call)
LAST_USED_RESOLUTION = timedelta(seconds=60)


def token_create(
    *, user: User, name: str, scope: str, expires_in_days: int | None = None
) -> tuple[PersonalToken, str]:
    """Make a token for `user` (who acts), returning it and its secret, which is never stored.

    Raises ValidationError naming the field for a bad name, scope or expiry.
    """
    name = (name or "").strip()
    days = settings.PERSONAL_TOKEN_DAYS if expires_in_days is None else expires_in_days
    errors: dict[str, list[str]] = {}
    if not name:
        errors["name"] = ["Give the token a name, e.g. the machine or script that uses it."]
    elif len(name) > 100:
        errors["name"] = ["At most 100 characters."]
    if scope not in PersonalToken.Scope.values:
        errors["scope"] = [f"One of: {', '.join(PersonalToken.Scope.values)}."]
    elif scope == PersonalToken.Scope.ADMIN and not access.is_admin(user):
        errors["scope"] = ["Only platform admins may create admin-scoped tokens."]
    elif scope != PersonalToken.Scope.READ and access.is_read_only(user):
        errors["scope"] = ["Auditors read and change nothing: their tokens have scope read."]
    if not 1 <= days <= settings.PERSONAL_TOKEN_MAX_DAYS:
        errors["expires_in_days"] = [
            f"Between 1 and {settings.PERSONAL_TOKEN_MAX_DAYS} days (the site's maximum)."
        ]
    if errors:
        raise ValidationError(errors)
    secret = token_secret_new()
    with transaction.atomic():
        active = PersonalToken.objects.select_for_update().filter(user=user, revoked_at=None)
        if len(active) >= MAX_ACTIVE_TOKENS:
            raise ValidationError(
                {"name": [f"You hold {MAX_ACTIVE_TOKENS} tokens: revoke one first."]}
            )
        token = PersonalToken.objects.create(
            user=user,
            name=name,
            prefix=token_shown(secret),
            digest=token_digest(secret),
            scope=scope,
            expires_at=timezone.now() + timedelta(days=days),
        )
        audit(
            actor=user,
            action="token.create",
            obj=token,
            after={
                "user": user.username,
                "name": token.name,
                "prefix": token.prefix,
                "scope": token.scope,
                "expires_at": token.expires_at,
            },
        )
    return token, secret


def token_revoke(*, token: PersonalToken, actor: Actor, reason: str = "") -> bool:
    """Revoke the token at once; False when it was already revoked (nothing is recorded)."""
    now = timezone.now()
    with transaction.atomic():
        changed = PersonalToken.objects.filter(pk=token.pk, revoked_at=None).update(revoked_at=now)
        if not changed:
            return False
        token.revoked_at = now
        audit(
            actor=actor,
            action="token.revoke",
            obj=token,
            before={"user": token.user.username, "name": token.name, "prefix": token.prefix},
            after={"revoked_at": now},
            reason=reason,
        )
    return True


def token_used(*, token: PersonalToken, now: datetime) -> None:
    """Note the token's use, at most once per LAST_USED_RESOLUTION (one conditional UPDATE)."""
    if token.last_used_at is not None and now - token.last_used_at < LAST_USED_RESOLUTION:
        return
    PersonalToken.objects.filter(pk=token.pk).exclude(
        last_used_at__gt=now - LAST_USED_RESOLUTION
    ).update(last_used_at=now)
    token.last_used_at = now
