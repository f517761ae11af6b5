"""Error pages: 404 and 403 with the site's navigation (JSON under /api/)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """404 for a URL nothing serves: JSON under /api/ (as the API's own 404s), a page elsewhere."""
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "Not found."}, status=404)
    from django.views.defaults import page_not_found

    return page_not_found(request, exception or Exception())


def permission_denied(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """403 as a page with the site's navigation (JSON under /api/, as DRF answers)."""
    if request.path.startswith("/api/"):
        from django.http import JsonResponse

        return JsonResponse({"detail": str(exception or "Forbidden.")}, status=403)
    return render(request, "403.html", {"reason": str(exception or "")}, status=403)


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """A form sent without its CSRF token (a page open for long, or cookies blocked): say what
    to do, in a page of the portal (JSON under /api/)."""
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": f"CSRF check failed: {reason}"}, status=403)
    return render(request, "csrf_failure.html", {"reason": reason}, status=403)
