"""Personal access tokens as their pages and the API list them (never a secret: none is kept)."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.db.models import QuerySet

from portal.models import PersonalToken


def token_list(*, user: User | None) -> QuerySet[PersonalToken]:
    """One user's tokens, newest first; every user's for `user=None` (admins' lists)."""
    qs = PersonalToken.objects.select_related("user")
    return qs if user is None else qs.filter(user=user)
