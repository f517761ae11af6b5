"""Pages for the people who use the portal: a request's logs and events, notification
preferences, saved request templates, and the error pages. (Same rules as portal/views.py.)"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from portal import access, selectors, services
from portal.forms import NotificationPreferenceForm
from portal.models import GpuRequest, NotificationPreference


@login_required
@require_GET
def request_logs(request: HttpRequest, request_id: int) -> HttpResponse:
    """The latest attempt's log tail and events; the panel polls this while the attempt runs.

    Authorized like the request page (its team, leads, admins): the log may hold secrets
    of the team's work.
    """
    req = access.get_gpu_request_for_user(request.user, request_id)
    view = selectors.request_logs(req)
    template = "portal/request_logs.html"
    if request.htmx:
        template += "#log-panel"
    # Followed until the request is over: a pending one's log appears once it starts.
    follow = req.state not in GpuRequest.TERMINAL_STATES
    return render(request, template, {"req": req, "logs": view, "follow": follow})


@login_required
@require_GET
def request_logs_download(request: HttpRequest, request_id: int) -> HttpResponse:
    req = access.get_gpu_request_for_user(request.user, request_id)
    view = selectors.request_logs(req, tail_lines=selectors.LOG_DOWNLOAD_LINES, events=False)
    name = view.attempt.workload_name if view.attempt else f"request-{req.pk}"
    response = HttpResponse(view.text, content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{name}.log"'
    return response


@login_required
@require_http_methods(["GET", "POST"])
def notification_settings(request: HttpRequest) -> HttpResponse:
    pref = NotificationPreference.objects.filter(user=request.user).first()
    form = NotificationPreferenceForm(
        request.POST or None, instance=pref or NotificationPreference(user=request.user)
    )
    if request.method == "POST" and form.is_valid():
        try:
            services.notification_preference_set(
                user=request.user,  # type: ignore[arg-type]
                **{k: form.cleaned_data[k] for k in form.Meta.fields},
            )
        except ValidationError as exc:
            for field, errors in exc.message_dict.items():
                form.add_error(field if field in form.fields else None, errors)
        else:
            messages.success(request, "Notification settings saved.")
            return redirect("portal:notifications")
    status = 400 if form.errors else 200
    return render(
        request,
        "portal/notifications.html",
        {"form": form, "has_email": bool(getattr(request.user, "email", ""))},
        status=status,
    )


@login_required
@require_POST
def template_delete(request: HttpRequest, template_id: int) -> HttpResponse:
    tpl = access.get_template_for_user(request.user, template_id)
    services.request_template_delete(user=request.user, template=tpl)  # type: ignore[arg-type]
    messages.success(request, f"Template “{tpl.name}” deleted.")
    return redirect("portal:home")


def permission_denied(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """403 as a page with the site's navigation (JSON under /api/, as DRF answers)."""
    if request.path.startswith("/api/"):
        from django.http import JsonResponse

        return JsonResponse({"detail": str(exception or "Forbidden.")}, status=403)
    return render(request, "403.html", {"reason": str(exception or "")}, status=403)
