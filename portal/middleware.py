"""Probe endpoints that answer whatever the Host header says.

Kubelet probes and Prometheus reach pods by IP; Django's host check would
answer 400 before the view runs. This sits first in MIDDLEWARE and serves
/healthz, /readyz and /metrics itself. /metrics asks for a bearer token when
METRICS_TOKEN is set, whatever the method: the token is checked before the
method, so OPTIONS or TRACE learn nothing either.
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, JsonResponse

from portal.lib import problems
from portal.metrics.collector import metrics_guarded


class ProbeMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path == "/metrics":
            return metrics_guarded(request)
        if request.method not in ("GET", "HEAD"):
            return self.get_response(request)
        if request.path == "/healthz":
            return JsonResponse({"ok": True})
        if request.path == "/readyz":
            from portal.views.health import readiness

            return readiness()
        return self.get_response(request)


class ApiProblemMiddleware:
    """Under /api/, every error answer is RFC 9457 problem details, whoever made it: Django's
    404 for an unknown URL, its 500 for an unhandled exception, a 405 of a function view, the
    middleware's own refusals. The API's views answer problems already (api/guards.py)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if (
            response.status_code >= 400
            and request.path.startswith("/api/")
            and not problems.is_problem(response)
        ):
            return problems.from_response(response)
        return response


class BadInputMiddleware:
    """400 for a NUL byte in a header, a cookie, the query string or a form field, before any
    view or query sees it (PostgreSQL refuses NUL in text: a session cookie holding one made
    the session lookup fail on every URL).

    A database that cannot be reached answers 503 with Retry-After, pages and API alike.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        bad = _nul_header(request) or _nul_field(request.GET)
        if not bad and request.method == "POST" and _is_form(request):
            bad = _nul_field(request.POST)
        if bad:
            return _bad_request(request, bad, "NUL bytes are not accepted")
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse | None:
        from django.db import InterfaceError, OperationalError

        if isinstance(exc, OperationalError | InterfaceError):
            from portal.api.guards import DATABASE_RETRY_AFTER_S

            return JsonResponse(
                {"detail": "The database cannot be reached; try again shortly."},
                status=503,
                headers={"Retry-After": str(DATABASE_RETRY_AFTER_S)},
            )
        return None


class SecurityHeadersMiddleware:
    """Content-Security-Policy and Permissions-Policy on every answer (settings.py has both).

    The pages load script only from the portal's own static files: no inline script or
    event handler anywhere (tests check the templates), so no XSS can run one either.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        from django.conf import settings

        self.get_response = get_response
        self.csp = "; ".join(f"{k} {v}" for k, v in settings.CONTENT_SECURITY_POLICY.items())
        self.permissions = ", ".join(f"{k}=({v})" for k, v in settings.PERMISSIONS_POLICY.items())

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        response.headers.setdefault("Content-Security-Policy", self.csp)
        response.headers.setdefault("Permissions-Policy", self.permissions)
        return response


def _is_form(request: HttpRequest) -> bool:
    return request.content_type in ("application/x-www-form-urlencoded", "multipart/form-data")


def _nul_header(request: HttpRequest) -> str:
    for key, value in request.META.items():
        if key.startswith("HTTP_") and isinstance(value, str) and "\x00" in value:
            return "header " + key[5:].replace("_", "-").title()
    # Cookies again once parsed: the parser unquotes an escaped NUL ("\\000") into one.
    for name, value in request.COOKIES.items():
        if "\x00" in name or "\x00" in value:
            return "cookie " + name.replace("\x00", "\\0")
    return ""


def _nul_field(data: object) -> str:
    for key, values in data.lists():  # type: ignore[attr-defined]
        if "\x00" in key or any("\x00" in v for v in values if isinstance(v, str)):
            return key.replace("\x00", "\\0") or "query"
    return ""


def _bad_request(request: HttpRequest, field: str, message: str) -> HttpResponse:
    if request.path.startswith("/api/"):
        return JsonResponse({field: [message]}, status=400)
    return HttpResponse(f"{field}: {message}\n", status=400, content_type="text/plain")
