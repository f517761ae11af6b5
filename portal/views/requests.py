"""Researchers' pages: submit (with preview), a request's page, logs and cancel, the queue."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import HttpResponse, HttpResponseBadRequest
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from portal import access
from portal.forms.fields import BulkIdsForm, ReasonForm
from portal.forms.filters import QueueFilterForm, RequestFilterForm
from portal.forms.requests import (
    TEMPLATE_FIELDS,
    SubmitForm,
    TemplateSaveForm,
    initial_from_request,
)
from portal.models import GpuRequest
from portal.selectors.config import first_run_pending, pools_live
from portal.selectors.queue import queue_list, queue_promise, queue_summary, request_wait_split
from portal.selectors.requests import (
    LOG_DOWNLOAD_LINES,
    NoSuchPod,
    request_attempt_facts,
    request_list,
)
from portal.selectors.requests import request_logs as request_logs_
from portal.services.me import request_template_save
from portal.services.requests import gpu_request_cancel, gpu_request_submit
from portal.tick.estimates import request_estimates
from portal.tick.preview import gpu_request_preview
from portal.views.audit import confirm_page
from portal.views.base import PAGE_SIZE, AuthedRequest, add_errors, htmx_redirect, next_url


@login_required
@require_GET
def home(request: AuthedRequest) -> HttpResponse:
    """My jobs (or, with ?scope=team, every request of my teams)."""
    scope = "team" if request.GET.get("scope") == "team" else "mine"
    filters = RequestFilterForm(request.GET or None, teams=access.teams_for(request.user))
    wanted = {k: v for k, v in filters.cleaned_data.items() if v} if filters.is_valid() else {}
    qs = request_list(request.user, mine=scope == "mine", with_counts=False, **wanted)
    page = Paginator(qs, PAGE_SIZE).get_page(request.GET.get("page"))
    rows = list(page.object_list)
    request_attempt_facts(rows)
    estimates = request_estimates(rows)
    for r in rows:
        r.estimate = estimates.get(r.pk)
        r.can_cancel = r.state not in GpuRequest.TERMINAL_STATES
    template = "portal/home.html"
    if request.htmx:
        template += "#request-table"
    query = request.GET.copy()
    query.pop("page", None)
    context = {
        "page": page,
        "rows": rows,
        "scope": scope,
        "query": query.urlencode(),
        "filters": filters,
        "templates": request.user.request_templates.all(),
        "now": timezone.now(),
        # a new site: the admin's checklist, the others' "ask an admin" (instead of empty tables)
        "first_run": first_run_pending() if access.is_admin(request.user) else None,
        "no_pools": not pools_live(),
    }
    return render(request, template, context)


@login_required
@require_http_methods(["GET", "POST"])
def request_submit(request: AuthedRequest) -> HttpResponse:
    teams = access.teams_for(request.user)
    if request.method == "GET" and request.htmx and "pool" in request.GET:
        # The pool changed: offer the device profiles it really has.
        form = SubmitForm(request.GET, teams=teams)
        # Only the choices change: the profile is not wrong for being unchosen yet.
        response = render(
            request, "portal/submit.html#profile-field", {"form": form, "profiles_only": True}
        )
        # The new profiles are in: the form asks for a fresh preview (not before, see submit.html).
        # (after the settle: htmx puts the swapped field's own attributes back then, which
        # would wipe the marks a preview puts on it)
        response["HX-Trigger-After-Settle"] = "qm-profiles"
        return response
    initial = _submit_initial(request) if request.method == "GET" else None
    form = SubmitForm(request.POST or None, teams=teams, initial=initial)
    save_as = TemplateSaveForm(request.POST if "save_template" in request.POST else None)
    if request.method == "POST" and "save_template" in request.POST:
        if save_as.is_valid():
            fields = {k: request.POST.get(k, "") for k in TEMPLATE_FIELDS}
            try:
                request_template_save(
                    user=request.user,
                    name=save_as.cleaned_data["template_name"],
                    fields=fields,
                )
            except ValidationError as exc:
                add_errors(save_as, exc)
            else:
                messages.success(
                    request, f"Saved as template “{save_as.cleaned_data['template_name']}”."
                )
        status = 400 if save_as.errors else 200
        context = {
            "form": form,
            "no_team": not teams.exists(),
            "no_pools": not pools_live(),
            "save_as": save_as,
        }
        return render(request, "portal/submit.html", context, status=status)
    if request.method == "POST" and form.is_valid():
        # What the preview says is rejected is refused here too, before anything is stored.
        verdict = gpu_request_preview(**form.preview_kwargs())
        if verdict.outcome == "rejected":
            # A class that does not take the request names the field to change.
            form.add_error(
                verdict.field or None, f"This request would be rejected: {verdict.message}"
            )
        else:
            try:
                req = gpu_request_submit(user=request.user, **form.service_kwargs())
            except ValidationError as exc:
                add_errors(form, exc)
            else:
                messages.success(
                    request,
                    f"Request {req.pk} submitted"
                    + (f" ({req.name})" if req.name else "")
                    + ": it is in the queue; this page follows it.",
                )
                return htmx_redirect(request, reverse("portal:request-detail", args=[req.pk]))
    status = 400 if form.errors else 200
    context = {
        "form": form,
        "no_team": not teams.exists(),
        "no_pools": not pools_live(),
        "save_as": save_as,
    }
    return render(request, "portal/submit.html", context, status=status)


def _submit_initial(request: AuthedRequest) -> dict[str, Any] | None:
    """The form prefilled from `?from=<request>` (resubmit) or `?template=<id>` (saved)."""
    if request.GET.get("from"):
        return initial_from_request(
            access.get_gpu_request_for_user(request.user, request.GET["from"])
        )
    if request.GET.get("template"):
        tpl = access.get_template_for_user(request.user, request.GET["template"])
        return {k: v for k, v in tpl.fields.items() if k in TEMPLATE_FIELDS}
    return None


@login_required
@require_POST
def request_preview(request: AuthedRequest) -> HttpResponse:
    """What would happen if this were submitted now. Reads only; POST so the env stays out of URLs."""
    form = SubmitForm(request.POST, teams=access.teams_for(request.user))
    preview = None
    if form.is_valid():
        preview = gpu_request_preview(**form.preview_kwargs())
    return render(request, "portal/submit.html#preview", {"form": form, "preview": preview})


@login_required
@require_GET
def request_detail(request: AuthedRequest, request_id: int) -> HttpResponse:
    req = access.get_gpu_request_for_user(request.user, request_id)
    template = "portal/request_detail.html"
    if request.htmx:
        template += "#request-status"
    context = {
        "req": req,
        "estimate": request_estimates([req]).get(req.pk),
        "attempts": req.attempts.select_related("pool", "usage").order_by("-number"),
        "decisions": req.decisions.order_by("-created_at", "-id")[:50],
        "can_cancel": req.state not in GpuRequest.TERMINAL_STATES,
        "wait_split": request_wait_split(req),
    }
    return render(request, template, context)


@login_required
@require_GET
def queue(request: AuthedRequest) -> HttpResponse:
    """Pending requests in scheduling order, by class, team and pool (scoped for non-admins)."""
    form = QueueFilterForm(request.GET or None, teams=access.teams_for(request.user))
    filters: dict[str, Any] = {}
    if form.is_valid():
        filters = {k: v for k, v in form.cleaned_data.items() if v}
    qs = queue_list(request.user, **filters)
    page = Paginator(qs, PAGE_SIZE).get_page(request.GET.get("page"))
    template = "portal/queue.html"
    if request.htmx:
        template += "#queue-table"
    query = request.GET.copy()
    query.pop("page", None)
    context = {
        "form": form,
        "page": page,
        "summary": queue_summary(request.user),
        "promise": queue_promise(request.user),
        "query": query.urlencode(),
    }
    return render(request, template, context)


def _cancel(request: AuthedRequest, req: GpuRequest, reason: str) -> bool:
    """Cancel or stop one request; False where it had already ended."""
    try:
        gpu_request_cancel(
            user=request.user,
            gpu_request=req,
            reason=reason,
        )
    except ValidationError:
        return False
    return True


@login_required
@require_POST
def requests_bulk_cancel(request: AuthedRequest) -> HttpResponse:
    """Cancel the selected requests: each is authorised as a single cancel would be."""
    form = BulkIdsForm(request.POST)
    default = reverse("portal:home")
    if not form.is_valid():
        return confirm_page(
            request,
            form=form,
            title="Cancel the selected requests",
            action_url=reverse("portal:requests-bulk-cancel"),
            hidden={"next": next_url(request, default)},
        )
    # All or nothing on access: one request the user may not cancel refuses the lot (404/403).
    reqs = [
        access.get_gpu_request_for_user(request.user, pk, write=True)
        for pk in sorted(set(form.cleaned_data["ids"]))
    ]
    done: list[int] = []
    over: list[int] = []
    for req in reqs:
        (done if _cancel(request, req, form.cleaned_data["reason"]) else over).append(req.pk)
    text = f"Cancelled {len(done)} request{'s' if len(done) != 1 else ''}"
    if over:
        text += f"; {len(over)} had already ended"
    messages.success(request, text + ".")
    return redirect(next_url(request, default))


@login_required
@require_POST
def request_cancel(request: AuthedRequest, request_id: int) -> HttpResponse:
    """Cancel or stop one request, with its reason."""
    req = access.get_gpu_request_for_user(request.user, request_id, write=True)
    data = request.POST.copy()
    if req.submitted_by_id == request.user.pk and not data.get("reason", "").strip():
        # one's own request: no one else needs to be told why
        data["reason"] = "cancelled by the submitter"
    form = ReasonForm(data)
    default = reverse("portal:request-detail", args=[req.pk])
    if not form.is_valid():
        return confirm_page(
            request,
            form=form,
            title=f"Cancel request #{req.pk}",
            action_url=reverse("portal:request-cancel", args=[req.pk]),
            hidden={"next": next_url(request, default)},
        )
    # Already over: nothing to cancel, the page shows its final state.
    if _cancel(request, req, form.cleaned_data["reason"]):
        req.refresh_from_db(fields=["state"])
        stopping = req.state not in (GpuRequest.State.CANCELLED, GpuRequest.State.PENDING)
        messages.success(
            request, f"Request #{req.pk} {'is stopping' if stopping else 'cancelled'}."
        )
    else:
        messages.info(request, f"Request #{req.pk} had already ended.")
    return redirect(next_url(request, default))


@login_required
@require_GET
def request_logs(request: AuthedRequest, request_id: int) -> HttpResponse:
    """The latest attempt's log tail and events; the panel polls this while the attempt runs.

    Authorized like the request page (its team, leads, admins): the log may hold secrets
    of the team's work.
    """
    req = access.get_gpu_request_for_user(request.user, request_id)
    raw = request.GET.get("pod", "0")
    try:
        # a gang's pods each have their own log: ?pod=<rank>
        pod = int(raw) if raw.isdigit() else -1
        view = request_logs_(req, pod=pod)
    except NoSuchPod as exc:
        return HttpResponseBadRequest(f"pod: {exc}", content_type="text/plain; charset=utf-8")
    template = "portal/request_logs.html"
    if request.htmx:
        template += "#log-panel"
    # Followed until the request is over: a pending one's log appears once it starts.
    follow = req.state not in GpuRequest.TERMINAL_STATES
    context = {"req": req, "logs": view, "follow": follow, "pod": pod, "ranks": range(view.pods)}
    return render(request, template, context)


@login_required
@require_GET
def request_logs_download(request: AuthedRequest, request_id: int) -> HttpResponse:
    req = access.get_gpu_request_for_user(request.user, request_id)
    raw = request.GET.get("pod", "0")
    try:
        pod = int(raw) if raw.isdigit() else -1
        view = request_logs_(req, tail_lines=LOG_DOWNLOAD_LINES, events=False, pod=pod)
    except NoSuchPod as exc:
        return HttpResponseBadRequest(f"pod: {exc}", content_type="text/plain; charset=utf-8")
    if view.attempt is None or (view.attempt.started_at is None and not view.text.strip()):
        # Said in words rather than an empty file that looks like a silent workload.
        return HttpResponse(
            f"Request #{req.pk} has not run yet, so it has no log.\n",
            status=404,
            content_type="text/plain; charset=utf-8",
        )
    name = view.attempt.workload_name + (f"-pod{pod}" if view.pods > 1 else "")
    response = HttpResponse(view.text, content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{name}.log"'
    return response
