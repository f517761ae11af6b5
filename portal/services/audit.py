"""The audit log's one writer: every change is one event, old → new; policy changes become versions."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Model
from django.forms.models import model_to_dict

from portal.models import AuditEvent, PolicyVersion, Team

M = TypeVar("M", bound=Model)

#: who acted: a signed-in user, or None (or an anonymous user) for the system
Actor = AbstractBaseUser | AnonymousUser | None


def audit(
    *,
    actor: Actor,
    action: str,
    obj: Model,
    team: Team | None = None,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    actor_name: str = "",
    reason: str = "",
) -> AuditEvent:
    """Record who changed what; call inside the transaction that made the change.

    With no signed-in actor, `actor_name` says what acted ("sso"; default "system").
    `reason` is the actor's own words on why.
    """
    real = actor if isinstance(actor, User) and actor.is_authenticated else None
    event = AuditEvent.objects.create(
        actor=real,
        actor_name=getattr(real, "username", "") or actor_name or "system",
        action=action,
        object_type=obj._meta.model_name or "",
        object_id=str(obj.pk),
        team=team,
        before=_jsonable(before),
        after=_jsonable(after),
        reason=reason[:500],
    )
    if action in POLICY_ACTIONS:
        policy_version_record(event)
    return event


#: audited changes that change how the scheduler decides: each is a new policy version
POLICY_ACTIONS = frozenset(
    {
        "quota.set",
        "class.update",
        "class.teams",
        "pool.update",
        "pool.create",
        "pool.retire",
        "class.create",
        "class.retire",
        "team.update",
        "team.retire",
        "profile.create",
        "profile.update",
        "profile.activate",
    }
)


def policy_version_record(event: AuditEvent) -> PolicyVersion:
    """The next policy version, for an audited change (in its transaction). Numbers come
    from the latest row under a lock on it, so two changes never share one."""
    latest = PolicyVersion.objects.select_for_update().order_by("-number").first()
    return PolicyVersion.objects.create(
        number=(latest.number if latest else 0) + 1,
        action=event.action,
        object_type=event.object_type,
        object_id=event.object_id,
        actor_name=event.actor_name,
        before=event.before,
        after=event.after,
    )


def _jsonable(data: dict[str, Any] | None) -> dict[str, Any] | None:
    if data is None:
        return None
    return {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in data.items()}


def field_values(obj: Model, fields: list[str]) -> dict[str, Any]:
    return model_to_dict(obj, fields=fields)


def update_audited(
    *,
    actor: Actor,
    obj: M,
    fields: list[str],
    action: str,
    changes: dict[str, Any],
    check: Callable[[M], None] | None = None,
) -> M:
    """Change `fields` of `obj` (validated, under a row lock), audited as one event, old → new.

    `check` validates what the model's own `clean` cannot (a MIG layout against geometry)."""
    unknown = set(changes) - set(fields)
    if unknown:
        raise ValidationError({sorted(unknown)[0]: "This field cannot be changed here."})
    with transaction.atomic():
        obj = type(obj)._default_manager.select_for_update().get(pk=obj.pk)
        before = field_values(obj, fields)
        for key, value in changes.items():
            setattr(obj, key, value)
        obj.full_clean()
        if check is not None:
            check(obj)
        obj.save()
        audit(actor=actor, action=action, obj=obj, before=before, after=field_values(obj, fields))
    return obj
