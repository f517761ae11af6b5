"""Reports for admins and auditors: estimates against reality, idle quota."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from portal import access
from portal.selectors import reports
from portal.views.base import AuthedRequest


def _days(request: AuthedRequest) -> int | None:
    raw = request.GET.get("days", "30")
    return int(raw) if raw.isdigit() and int(raw) in reports.WINDOWS else None


def _bad_days() -> HttpResponse:
    windows = ", ".join(str(d) for d in reports.WINDOWS)
    return HttpResponse(f"days: choose one of {windows}.", status=400, content_type="text/plain")


@login_required
@require_GET
def estimates(request: AuthedRequest) -> HttpResponse:
    access.require_admin_read(request.user)
    days = _days(request)
    if days is None:
        return _bad_days()
    return render(
        request,
        "portal/report_estimates.html",
        {
            "rows": reports.estimates_vs_reality(days),
            "days": days,
            "windows": reports.WINDOWS,
        },
    )


@login_required
@require_GET
def idle_quota(request: AuthedRequest) -> HttpResponse:
    access.require_admin_read(request.user)
    return render(request, "portal/report_idle_quota.html", {"rows": reports.idle_quota()})
