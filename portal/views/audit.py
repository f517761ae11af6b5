"""The decision log and the audit log in words (with its CSV), and confirmations with a reason."""

from __future__ import annotations

import csv
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpResponse, StreamingHttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from portal import access
from portal.forms.fields import ReasonForm
from portal.forms.filters import AuditFilterForm, DecisionFilterForm
from portal.selectors.audit import audit_list, decision_list
from portal.selectors.audit_words import describe
from portal.views.base import PAGE_SIZE, AuthedRequest


@login_required
@require_GET
def decision_log(request: AuthedRequest) -> HttpResponse:
    """Decisions of the user's teams (all for admins), filtered and paginated."""
    teams = access.teams_for(request.user)
    form = DecisionFilterForm(request.GET or None, teams=teams)
    filters: dict[str, Any] = {}
    if form.is_valid():
        d = form.cleaned_data
        filters = {
            "team": d["team"],
            "request_id": d["request"],
            "node": d["node"],
            "kind": d["kind"],
        }
    qs = decision_list(request.user, **filters).select_related("request")
    page = Paginator(qs, PAGE_SIZE).get_page(request.GET.get("page"))
    template = "portal/decisions.html"
    if request.htmx:
        template += "#decision-log"
    query = request.GET.copy()
    query.pop("page", None)
    return render(request, template, {"form": form, "page": page, "query": query.urlencode()})


#: rows the CSV fetches per query (describe() names each chunk's targets in bulk)
CSV_CHUNK = 2000


def _audit_filters(request: AuthedRequest) -> tuple[AuditFilterForm, dict[str, Any]]:
    form = AuditFilterForm(request.GET or None)
    filters: dict[str, Any] = {
        # The old exact filters still work (links from other pages use them).
        "action": request.GET.get("action", "")[:50],
        "actor": request.GET.get("actor", "")[:150],
    }
    if form.is_valid():
        filters.update(form.bounds())
    return form, filters


@login_required
@require_GET
def audit_log(request: AuthedRequest) -> HttpResponse:
    access.require_admin_read(request.user)
    form, filters = _audit_filters(request)
    qs = audit_list(**filters)
    page = Paginator(qs, PAGE_SIZE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    template = "portal/audit.html"
    if request.htmx:
        template += "#audit-log"
    context = {
        "form": form,
        "page": page,
        "rows": describe(list(page.object_list)),
        "query": query.urlencode(),
    }
    return render(request, template, context, status=400 if form.errors else 200)


class _Echo:
    def write(self, value: str) -> str:
        return value


@login_required
@require_GET
def audit_csv(request: AuthedRequest) -> HttpResponse | StreamingHttpResponse:
    """The filtered audit log as CSV, streamed in chunks; authorised like the page."""
    access.require_admin_read(request.user)
    form, filters = _audit_filters(request)
    if form.errors:
        return HttpResponse(
            "; ".join(f"{k}: {' '.join(str(e) for e in v)}" for k, v in form.errors.items()),
            status=400,
            content_type="text/plain",
        )
    qs = audit_list(**filters)
    writer = csv.writer(_Echo())

    def rows() -> Any:
        yield writer.writerow(
            ["when (UTC)", "who", "action", "what", "target", "team", "changes", "reason"]
        )
        last = None
        while True:
            # Keyset pages over (created_at, id), newest first: no OFFSET scans.
            chunk_qs = qs
            if last is not None:
                chunk_qs = qs.filter(created_at__lte=last[0]).exclude(
                    created_at=last[0], id__gte=last[1]
                )
            chunk = list(chunk_qs[:CSV_CHUNK])
            if not chunk:
                return
            for row in describe(chunk):
                e = row.event
                yield writer.writerow(
                    [
                        e.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                        row.actor,
                        e.action,
                        row.what,
                        row.target,
                        e.team.name if e.team_id and e.team else "",
                        row.changes_text,
                        e.reason,
                    ]
                )
            last = (chunk[-1].created_at, chunk[-1].pk)

    response = StreamingHttpResponse(rows(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = 'attachment; filename="audit-log.csv"'
    return response


def confirm_page(
    request: AuthedRequest, *, form: ReasonForm, title: str, action_url: str, hidden: dict[str, Any]
) -> HttpResponse:
    """The confirmation again, with the form's errors (400): a reason is required."""
    context = {"form": form, "title": title, "action_url": action_url, "hidden": hidden}
    return render(request, "portal/confirm.html", context, status=400)
