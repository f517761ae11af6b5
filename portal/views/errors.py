"""Error pages: 404, 403 and 500 with the site's navigation (problem details under /api/)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from portal.lib import problems


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """404 for a URL nothing serves: a problem under /api/ (as the API's own 404s), a page
    elsewhere."""
    if request.path.startswith("/api/"):
        return problems.problem_response(404, detail="No such API endpoint: see /api/docs/.")
    from django.views.defaults import page_not_found

    return page_not_found(request, exception or Exception())


def permission_denied(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """403 as a page with the site's navigation (a problem under /api/, as DRF answers)."""
    if request.path.startswith("/api/"):
        return problems.problem_response(403, detail=str(exception or "Forbidden."))
    return render(request, "403.html", {"reason": str(exception or "")}, status=403)


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """A form sent without its CSRF token (a page open for long, or cookies blocked): say what
    to do, in a page of the portal (a problem under /api/)."""
    if request.path.startswith("/api/"):
        return problems.problem_response(403, detail=f"CSRF check failed: {reason}")
    return render(request, "csrf_failure.html", {"reason": reason}, status=403)


def server_error(request: HttpRequest) -> HttpResponse:
    """500: a problem under /api/ (never the page, never a traceback), Django's page elsewhere."""
    if request.path.startswith("/api/"):
        return problems.problem_response(
            500, detail="The server failed to answer this request; it has been logged."
        )
    from django.views.defaults import server_error as page

    return page(request)
