"""Probes: `/healthz` (the process answers) and `/readyz` (the database and the broker answer)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET


@require_GET
def healthz(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"ok": True})


def readiness() -> JsonResponse:
    """Ready to serve: the database answers and the Celery broker accepts a connection.

    200 with each check "ok", else 503 naming what failed. /healthz stays a
    liveness probe (the process answers) so that a database outage does not
    get every web pod restarted.
    """
    checks = {"database": _check_database(), "broker": _check_broker()}
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


def _check_broker() -> str:
    from portal.celery import app

    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(
                max_retries=1, interval_start=0, interval_step=0.5, interval_max=0.5, timeout=2
            )
    except Exception as exc:  # kombu raises a transport's own errors
        return f"unreachable: {type(exc).__name__}"
    return "ok"


@require_GET
def readyz(request: HttpRequest) -> HttpResponse:
    """Served by ProbeMiddleware; a view so the URL resolves and reverses."""
    return readiness()
