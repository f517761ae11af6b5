"""Sign-in from a header that an authenticating proxy sets (oauth2-proxy, an ingress with OIDC)."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.backends import RemoteUserBackend
from django.contrib.auth.middleware import RemoteUserMiddleware


class TrustedHeaderMiddleware(RemoteUserMiddleware):
    """Sign users in from a header set by an authenticating proxy (oauth2-proxy, an ingress with OIDC).

    Off unless settings.MIDDLEWARE lists it after AuthenticationMiddleware and
    AUTHENTICATION_BACKENDS includes `portal.auth.trusted_header.TrustedHeaderBackend`. Only
    safe when the proxy strips the header from client requests: see docs/portal.md.
    """

    force_logout_if_no_header = False

    @property
    def header(self) -> str:  # type: ignore[override]  # a setting, read per request
        return str(getattr(settings, "QM_TRUSTED_USER_HEADER", "HTTP_X_FORWARDED_USER"))


class TrustedHeaderBackend(RemoteUserBackend):
    """Creates unknown users on first sign-in with no team and no staff bit: admins add memberships."""

    create_unknown_user = True
