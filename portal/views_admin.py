"""Admin and lead pages: the audit log in words (with its CSV), confirmations with a reason,
and bulk actions. Every object of a bulk action is checked on the server, one by one."""

from __future__ import annotations

import csv
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from portal import access, selectors, services
from portal.audit_words import describe
from portal.forms import AuditFilterForm, BulkIdsForm, ReasonForm
from portal.models import GpuRequest

PAGE_SIZE = 50
#: rows the CSV fetches per query (describe() names each chunk's targets in bulk)
CSV_CHUNK = 2000
NODE_SERVICES = {
    "cordon": services.node_cordon,
    "drain": services.node_drain,
    "return": services.node_return,
}


def _next_url(request: HttpRequest, default: str) -> str:
    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        return target
    return default


# ---------------------------------------------------------------------------
# The audit log


def _audit_filters(request: HttpRequest) -> tuple[AuditFilterForm, dict[str, Any]]:
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
def audit_log(request: HttpRequest) -> HttpResponse:
    access.require_admin_read(request.user)
    form, filters = _audit_filters(request)
    qs = selectors.audit_list(**filters)
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
def audit_csv(request: HttpRequest) -> HttpResponse:
    """The filtered audit log as CSV, streamed in chunks; authorised like the page."""
    access.require_admin_read(request.user)
    form, filters = _audit_filters(request)
    if form.errors:
        return HttpResponse(
            "; ".join(f"{k}: {' '.join(v)}" for k, v in form.errors.items()),
            status=400,
            content_type="text/plain",
        )
    qs = selectors.audit_list(**filters)
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


# ---------------------------------------------------------------------------
# Confirmations with a reason


def confirm_page(
    request: HttpRequest, *, form: ReasonForm, title: str, action_url: str, hidden: dict[str, Any]
) -> HttpResponse:
    """The confirmation again, with the form's errors (400): a reason is required."""
    context = {"form": form, "title": title, "action_url": action_url, "hidden": hidden}
    return render(request, "portal/confirm.html", context, status=400)


def _cancel(request: HttpRequest, req: GpuRequest, reason: str) -> bool:
    """Cancel or stop one request; False where it had already ended."""
    try:
        services.gpu_request_cancel(
            user=request.user,  # type: ignore[arg-type]
            gpu_request=req,
            reason=reason,
        )
    except ValidationError:
        return False
    return True


@login_required
@require_POST
def requests_bulk_cancel(request: HttpRequest) -> HttpResponse:
    """Cancel the selected requests: each is authorised as a single cancel would be."""
    form = BulkIdsForm(request.POST)
    default = reverse("portal:home")
    if not form.is_valid():
        return confirm_page(
            request,
            form=form,
            title="Cancel the selected requests",
            action_url=reverse("portal:requests-bulk-cancel"),
            hidden={"next": _next_url(request, default)},
        )
    # All or nothing on access: one request the user may not cancel refuses the lot (404/403).
    reqs = [
        access.get_gpu_request_for_user(request.user, pk, write=True)
        for pk in sorted(set(form.cleaned_data["ids"]))
    ]
    done, over = [], []
    for req in reqs:
        (done if _cancel(request, req, form.cleaned_data["reason"]) else over).append(req.pk)
    text = f"Cancelled {len(done)} request{'s' if len(done) != 1 else ''}"
    if over:
        text += f"; {len(over)} had already ended"
    messages.success(request, text + ".")
    return redirect(_next_url(request, default))


@login_required
@require_POST
def nodes_bulk_action(request: HttpRequest) -> HttpResponse:
    """Cordon, drain or return the selected nodes (admins only), one reason for all."""
    access.require_admin(request.user)
    action = request.POST.get("action", "")
    if action not in NODE_SERVICES:
        return HttpResponse("action: choose cordon, drain or return.", status=400)
    form = BulkIdsForm(request.POST)
    default = reverse("portal:capacity")
    if not form.is_valid():
        return confirm_page(
            request,
            form=form,
            title=f"{action.capitalize()} the selected nodes",
            action_url=reverse("portal:nodes-bulk-action"),
            hidden={"next": _next_url(request, default), "action": action},
        )
    nodes = [
        access.get_node_for_admin(request.user, pk) for pk in sorted(set(form.cleaned_data["ids"]))
    ]
    for node in nodes:
        NODE_SERVICES[action](actor=request.user, node=node, reason=form.cleaned_data["reason"])  # type: ignore[operator]
    past = {"cordon": "Cordoned", "drain": "Drained", "return": "Returned"}[action]
    messages.success(request, f"{past} {len(nodes)} node{'s' if len(nodes) != 1 else ''}.")
    return redirect(_next_url(request, default))


@login_required
@require_POST
def node_action(request: HttpRequest, node_id: int, action: str) -> HttpResponse:
    """One node's cordon, drain or return (admins only), with its reason."""
    node = access.get_node_for_admin(request.user, node_id)
    form = ReasonForm(request.POST)
    default = reverse("portal:capacity")
    if not form.is_valid():
        return confirm_page(
            request,
            form=form,
            title=f"{action.capitalize()} node {node.name}",
            action_url=reverse("portal:node-action", args=[node.pk, action]),
            hidden={"next": _next_url(request, default)},
        )
    NODE_SERVICES[action](actor=request.user, node=node, reason=form.cleaned_data["reason"])  # type: ignore[operator]
    return redirect(_next_url(request, default))


@login_required
@require_POST
def request_cancel(request: HttpRequest, request_id: int) -> HttpResponse:
    """Cancel or stop one request, with its reason."""
    req = access.get_gpu_request_for_user(request.user, request_id, write=True)
    form = ReasonForm(request.POST)
    default = reverse("portal:request-detail", args=[req.pk])
    if not form.is_valid():
        return confirm_page(
            request,
            form=form,
            title=f"Cancel request #{req.pk}",
            action_url=reverse("portal:request-cancel", args=[req.pk]),
            hidden={"next": _next_url(request, default)},
        )
    # Already over: nothing to cancel, the page shows its final state.
    _cancel(request, req, form.cleaned_data["reason"])
    return redirect(_next_url(request, default))
