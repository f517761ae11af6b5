"""API authentication by personal access token: `Authorization: Bearer <secret>` (or the older
`Token <secret>`). The token is looked up by its digest on every call and the user's rights
are computed per call, so a revocation, an expiry or a membership change counts at once."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from portal.access import TOKEN_SCOPE_ATTR
from portal.lib.tokens import token_digest
from portal.models import PersonalToken
from portal.services.tokens import token_used

KEYWORDS = ("bearer", "token")


class PersonalTokenAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[Any, PersonalToken] | None:
        parts = authentication.get_authorization_header(request).split()
        if not parts or parts[0].lower().decode(errors="replace") not in KEYWORDS:
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed(
                "Invalid Authorization header: send `Bearer <token>`, with no spaces in the token."
            )
        try:
            secret = parts[1].decode()
        except UnicodeError:
            raise exceptions.AuthenticationFailed("Invalid token.") from None
        token = (
            PersonalToken.objects.select_related("user").filter(digest=token_digest(secret)).first()
        )
        if token is None:
            raise exceptions.AuthenticationFailed("Invalid token.")
        now = timezone.now()
        state = token.state_at(now)
        if state != "active":
            said = "was revoked" if state == "revoked" else "has expired"
            raise exceptions.AuthenticationFailed(
                f"This token {said} ({token.prefix}…): create a new one at /me/tokens/.",
                code=f"token_{state}",
            )
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed("This token's user is inactive.")
        token_used(token=token, now=now)
        user = token.user
        setattr(user, TOKEN_SCOPE_ATTR, token.scope)
        return user, token

    def authenticate_header(self, request: Request) -> str:
        # A 401 (not a 403) for a missing or bad token: DRF answers 401 only with this header.
        return 'Bearer realm="api"'
