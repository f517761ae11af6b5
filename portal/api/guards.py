"""What every API request goes through: the JSON parser, throttles and the error handler.

- JSON deeper than `validation.MAX_JSON_DEPTH`, or with a NUL in any string,
  is a 400 before a view sees it (PostgreSQL refuses NUL in text; deep
  nesting overflows the stack further in).
- Throttles count per user, per API token and per anonymous client address
  in the shared cache (Redis when REDIS_URL is set), so every web replica
  sees the same counts; over the rate the answer is 429 with Retry-After.
  Rates are read when a request comes, so settings changes take effect.
- A database that cannot be reached is a 503 with Retry-After, not a 500.
"""

from __future__ import annotations

from typing import Any, cast

from django.db import InterfaceError, OperationalError
from django.http import HttpResponse
from rest_framework import exceptions, parsers, permissions, throttling
from rest_framework.request import Request
from rest_framework.settings import api_settings

from portal.lib import problems
from portal.lib.validation import json_problem

DATABASE_RETRY_AFTER_S = 5


class SafeJSONParser(parsers.JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise exceptions.ParseError("JSON parse error - nested too deeply") from None
        problem = json_problem(data)
        if problem:
            raise exceptions.ParseError(f"JSON parse error - {problem}")
        return data


class ReadOnlyRolePermission(permissions.BasePermission):
    """Read-only users (auditors) may only use safe methods, by session or by token."""

    message = "Auditors may read but not change anything."
    code = "read_only_role"

    def has_permission(self, request: Request, view: Any) -> bool:
        # Imported here: DRF imports this module while it reads its settings.
        from portal import access

        return request.method in permissions.SAFE_METHODS or not access.is_read_only(request.user)


class TokenScopePermission(permissions.BasePermission):
    """A `read` token may only use safe methods; other scopes are checked where admins are."""

    message = (
        "This token's scope is read: it may not change anything. "
        "Use a token with scope read+submit."
    )
    code = "token_scope"

    def has_permission(self, request: Request, view: Any) -> bool:
        # Imported here: DRF imports this module while it reads its settings.
        from portal.models import PersonalToken

        token = getattr(request, "auth", None)
        if not isinstance(token, PersonalToken) or request.method in permissions.SAFE_METHODS:
            return True
        return token.scope != PersonalToken.Scope.READ


class _LiveRates:
    """Read the rate from the settings at each request (DRF binds it at import)."""

    scope: str | None

    def get_rate(self) -> str | None:
        # Rates are strings ("30/min"); the stubs type the setting's values as numbers.
        rates = cast(dict[str, str | None], api_settings.DEFAULT_THROTTLE_RATES)
        return None if self.scope is None else rates.get(self.scope)


class AnonThrottle(_LiveRates, throttling.AnonRateThrottle):
    """Anonymous clients, by address (X-Forwarded-For as NUM_PROXIES allows)."""

    def get_ident(self, request: Request) -> str:
        return client_address(request)


class UserThrottle(_LiveRates, throttling.UserRateThrottle):
    """Signed-in users, by user id, whichever way they authenticated."""


class TokenThrottle(_LiveRates, throttling.SimpleRateThrottle):
    """API tokens, by token: a leaked token is slowed even while its user works in a browser."""

    scope = "token"

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        token = getattr(request, "auth", None)
        # The stored digest, so that the cache never holds a usable token.
        digest = getattr(token, "digest", None)
        if not digest:
            return None
        return self.cache_format % {"scope": self.scope, "ident": digest[:24]}


def exception_handler(exc: Exception, context: dict[str, Any]) -> HttpResponse | None:
    """Every error a view raises as RFC 9457 problem details (portal/lib/problems.py).

    None for an exception DRF does not know: Django answers it as a 500, which
    ApiProblemMiddleware turns into a problem too.
    """
    # Imported here: rest_framework.views reads REST_FRAMEWORK, which names this module.
    # (Importing it above fails whenever this module is imported first: axes calls
    # client_address on a fresh process's first login.)
    from rest_framework.views import exception_handler as drf_exception_handler

    if isinstance(exc, OperationalError | InterfaceError):
        return problems.problem_response(
            503,
            detail="The database cannot be reached; try again shortly.",
            code="database_unavailable",
            headers={"Retry-After": str(DATABASE_RETRY_AFTER_S)},
        )
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    headers = {k: str(v) for k, v in response.headers.items() if k != "Content-Type"}
    data = response.data
    if isinstance(exc, exceptions.ValidationError):
        errors = data if isinstance(data, dict) else {"non_field_errors": data}
        return problems.problem_response(
            response.status_code, code="invalid", errors=errors, headers=headers
        )
    detail = data.get("detail", "") if isinstance(data, dict) else ""
    code = getattr(detail, "code", "") or problems.code_for(response.status_code)
    return problems.problem_response(
        response.status_code, detail=str(detail), code=str(code), headers=headers
    )


def client_address(request: Any) -> str:
    """The client's address as the throttles see it: X-Forwarded-For's NUM_PROXIES-th hop from
    the right behind that many proxies (the chart's Ingress), else the socket's peer."""
    hops = api_settings.NUM_PROXIES
    if hops is not None and hops < 0:
        hops = 0
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
    if hops and forwarded:
        addrs: list[str] = [a.strip() for a in forwarded.split(",") if a.strip()]
        if addrs:
            return addrs[-min(hops, len(addrs))]
    return str(request.META.get("REMOTE_ADDR", ""))
