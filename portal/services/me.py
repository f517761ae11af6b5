"""A user's own settings: notification preferences and saved request templates."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction

from portal.lib import validation
from portal.models import NotificationPreference, RequestTemplate


def notification_preference_set(*, user: User, **fields: Any) -> NotificationPreference:
    pref, _ = NotificationPreference.objects.get_or_create(user=user)
    for key, value in fields.items():
        setattr(pref, key, value)
    pref.full_clean()
    pref.save()
    return pref


#: most saved templates per user
MAX_TEMPLATES = 50


def request_template_save(*, user: User, name: str, fields: dict[str, Any]) -> RequestTemplate:
    """Save (or replace) the user's template of this name: the submit form's fields as posted."""
    name = name.strip()
    if not name:
        raise ValidationError({"template_name": "Give the template a name."})
    problem = validation.json_problem(fields)
    if problem:
        raise ValidationError({"template_name": problem})
    with transaction.atomic():
        existing = RequestTemplate.objects.select_for_update().filter(user=user, name=name).first()
        if existing is None and RequestTemplate.objects.filter(user=user).count() >= MAX_TEMPLATES:
            raise ValidationError(
                {"template_name": f"At most {MAX_TEMPLATES} templates: delete one first."}
            )
        tpl, _ = RequestTemplate.objects.update_or_create(
            user=user, name=name, defaults={"fields": fields}
        )
    return tpl


def request_template_delete(*, user: User, template: RequestTemplate) -> None:
    if template.user_id != user.pk:
        raise PermissionDenied("Not your template.")
    template.delete()
