from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from portal import access, services
from portal.forms import SubmitForm
from portal.models import GpuRequest


@require_GET
def healthz(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"ok": True})


@login_required
@require_GET
def home(request: HttpRequest) -> HttpResponse:
    requests = access.requests_visible(request.user).order_by("-created_at")[:50]
    template = "portal/home.html"
    if request.htmx:
        template += "#request-table"
    return render(request, template, {"requests": requests})


@login_required
@require_http_methods(["GET", "POST"])
def request_submit(request: HttpRequest) -> HttpResponse:
    teams = access.teams_for(request.user)
    form = SubmitForm(request.POST or None, teams=teams)
    if request.method == "POST" and form.is_valid():
        try:
            req = services.gpu_request_submit(user=request.user, **form.service_kwargs())  # type: ignore[arg-type]
        except ValidationError as exc:
            for field, errors in exc.message_dict.items():
                form.add_error(field if field in form.fields else None, errors)
        else:
            return redirect("portal:request-detail", pk=req.pk)
    return render(request, "portal/submit.html", {"form": form}, status=400 if form.errors else 200)


@login_required
@require_GET
def request_detail(request: HttpRequest, pk: int) -> HttpResponse:
    req = access.get_gpu_request_for_user(request.user, pk)
    template = "portal/request_detail.html"
    if request.htmx:
        template += "#request-status"
    context = {
        "req": req,
        "attempts": req.attempts.select_related("pool").order_by("-number"),
        "decisions": req.decisions.order_by("-created_at", "-id")[:50],
        "can_cancel": req.state not in GpuRequest.TERMINAL_STATES,
    }
    return render(request, template, context)


@login_required
@require_POST
def request_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    req = access.get_gpu_request_for_user(request.user, pk, write=True)
    try:
        services.gpu_request_cancel(user=request.user, gpu_request=req)  # type: ignore[arg-type]
    except ValidationError:
        pass
    return redirect("portal:request-detail", pk=req.pk)
