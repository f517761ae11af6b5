"""Probes: `/healthz` (the process answers) and `/readyz` (the database answers)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET


@require_GET
def healthz(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"ok": True})


def readiness() -> JsonResponse:
    """Ready to serve: the database answers.

    200 with each check "ok", else 503 naming what failed. Only what the web
    needs to answer is checked: Redis is not (the cache falls back to memory and
    a wake-up the broker refuses is done by beat's next tick), so a Redis outage
    keeps every web pod in the Service. /healthz stays a liveness probe (the
    process answers) so that a database outage does not get every web pod restarted.
    """
    checks = {"database": _check_database()}
    ok = all(v == "ok" for v in checks.values())
    return JsonResponse({"ok": ok, **checks}, status=200 if ok else 503)


def _check_database() -> str:
    from django.db import DatabaseError, connection

    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except DatabaseError as exc:
        return f"unreachable: {type(exc).__name__}"
    return "ok"


@require_GET
def readyz(request: HttpRequest) -> HttpResponse:
    """Served by ProbeMiddleware; a view so the URL resolves and reverses."""
    return readiness()
