"""Single sign-on with OpenID Connect (mozilla-django-oidc), docs/portal.md.

Authorization-code flow with PKCE. Users are matched by a configurable claim
(OIDC_USERNAME_CLAIM, `preferred_username` by default) and created on first
sign-in; at every sign-in the groups claim (OIDC_GROUPS_CLAIM) is mapped
through OIDC_GROUP_MAP to team memberships and platform roles by
services.sso_sync. With OIDC_RP_CLIENT_ID unset, the /oidc/ URLs answer 404.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import SuspiciousOperation
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.views import (
    OIDCAuthenticationCallbackView,
    OIDCAuthenticationRequestView,
)

from portal.services.sso import sso_sync

log = logging.getLogger(__name__)


def _username(claims: dict[str, Any]) -> str:
    value = claims.get(settings.OIDC_USERNAME_CLAIM)
    if not isinstance(value, str) or not value.strip():
        raise SuspiciousOperation(f"the identity provider sent no {settings.OIDC_USERNAME_CLAIM}")
    # Django usernames hold at most 150 characters.
    return value.strip()[:150]


class GroupMappingBackend(OIDCAuthenticationBackend):  # type: ignore[misc]
    """OpenID Connect sign-in that keeps memberships and roles in step with the IdP's groups."""

    def filter_users_by_claims(self, claims: dict[str, Any]) -> QuerySet[Any]:
        users: QuerySet[Any] = self.UserModel.objects.filter(username=_username(claims))
        return users

    def describe_user_by_claims(self, claims: dict[str, Any]) -> str:
        return f"{settings.OIDC_USERNAME_CLAIM} {claims.get(settings.OIDC_USERNAME_CLAIM)!r}"

    def verify_claims(self, claims: dict[str, Any]) -> bool:
        _username(claims)
        return True

    def create_user(self, claims: dict[str, Any]) -> User:
        user = self.UserModel.objects.create_user(
            _username(claims), email=str(claims.get("email") or "")
        )
        return self._synced(user, claims)

    def update_user(self, user: User, claims: dict[str, Any]) -> User:
        if claims.get("email") and user.email != claims["email"]:
            user.email = str(claims["email"])
            user.save(update_fields=["email"])
        return self._synced(user, claims)

    def _synced(self, user: User, claims: dict[str, Any]) -> User:
        changes = sso_sync(user=user, groups=claims.get(settings.OIDC_GROUPS_CLAIM, []))
        if changes["unknown_teams"]:
            log.warning(
                "sso: %s is mapped to teams that do not exist: %s",
                user.get_username(),
                ", ".join(changes["unknown_teams"]),
            )
        return user


class AuthenticateView(OIDCAuthenticationRequestView):  # type: ignore[misc]
    """Sends the browser to the provider (with a PKCE challenge); 404 while SSO is off."""

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not settings.OIDC_ENABLED:
            raise Http404("Single sign-on is not configured.")
        return super().dispatch(request, *args, **kwargs)  # type: ignore[no-any-return]


class CallbackView(OIDCAuthenticationCallbackView):  # type: ignore[misc]
    """The provider's redirect back with the code; 404 while SSO is off."""

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not settings.OIDC_ENABLED:
            raise Http404("Single sign-on is not configured.")
        return super().dispatch(request, *args, **kwargs)  # type: ignore[no-any-return]
