"""Pages of the signed-in user: sign-in, notification settings, saved request templates."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from axes.models import AccessAttempt
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from portal import access
from portal.forms.requests import NotificationPreferenceForm
from portal.models import NotificationPreference
from portal.selectors.notifications import happenings
from portal.services.me import notification_preference_set, request_template_delete
from portal.views.base import AuthedRequest

if TYPE_CHECKING:
    pass


#: announce the attempts left before a lockout once this few remain
WARN_ATTEMPTS_LEFT = 3


class LoginView(auth_views.LoginView):
    """Password login beside single sign-on; with PASSWORD_LOGIN=false, only the SSO button."""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not settings.PASSWORD_LOGIN:
            raise PermissionDenied("Password login is switched off: sign in with single sign-on.")
        return super().post(request, *args, **kwargs)

    def form_invalid(self, form: Any) -> HttpResponse:
        # django-axes has counted this failure already (on the login-failed signal)
        username = form.data.get("username", "")
        failures = (
            AccessAttempt.objects.filter(
                username=username, ip_address=getattr(self.request, "axes_ip_address", None)
            )
            .values_list("failures_since_start", flat=True)
            .first()
        )
        left = settings.AXES_FAILURE_LIMIT - (failures or 0)
        if failures and 0 < left <= WARN_ATTEMPTS_LEFT:
            form.add_error(
                None,
                f"{left} attempt{'' if left == 1 else 's'} left: then logins as {username} from "
                f"this address are refused for {_cooloff_words()}.",
            )
        return super().form_invalid(form)

    def get_default_redirect_url(self) -> str:
        # admins and auditors land on the overview; everyone else on their jobs
        if access.sees_all(self.request.user):
            return reverse("portal:overview")
        return super().get_default_redirect_url()

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context.update(
            sso=settings.OIDC_ENABLED,
            sso_name=settings.OIDC_PROVIDER_NAME,
            sso_failed=self.request.GET.get("sso") == "failed",
            password_login=settings.PASSWORD_LOGIN,
            demo_logins=settings.DEMO_LOGINS if settings.PASSWORD_LOGIN else [],
            demo_password=settings.DEMO_PASSWORD,
        )
        return context


class LogoutView(auth_views.LogoutView):
    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        response = super().post(request, *args, **kwargs)
        messages.info(request, "You have been logged out.")
        return response


def _cooloff_seconds() -> int:
    return int(float(settings.AXES_COOLOFF_TIME) * 3600)


def _cooloff_words() -> str:
    minutes = _cooloff_seconds() // 60
    return f"{minutes} minutes" if minutes != 1 else "1 minute"


def locked_out(
    request: HttpRequest, original_response: HttpResponse | None = None, credentials: Any = None
) -> HttpResponse:
    """django-axes' lockout: a page of the portal that says how long to wait (and Retry-After)."""
    response = render(
        request,
        "registration/locked_out.html",
        {"cooloff": _cooloff_words(), "limit": settings.AXES_FAILURE_LIMIT},
        status=settings.AXES_HTTP_RESPONSE_CODE,
    )
    response["Retry-After"] = str(_cooloff_seconds())
    return response


@login_required
@require_http_methods(["GET", "POST"])
def notification_settings(request: AuthedRequest) -> HttpResponse:
    pref = NotificationPreference.objects.filter(user=request.user).first()
    form = NotificationPreferenceForm(
        request.POST or None, instance=pref or NotificationPreference(user=request.user)
    )
    has_email = bool(getattr(request.user, "email", ""))
    if not has_email:
        # Nothing can be mailed without an address: the box is neither ticked nor tickable.
        form.fields["email"].disabled = True
        form.initial["email"] = False
    if request.method == "POST" and form.is_valid():
        try:
            notification_preference_set(
                user=request.user,
                **{k: form.cleaned_data[k] for k in form.Meta.fields},
            )
        except ValidationError as exc:
            for field, errors in exc.message_dict.items():
                form.add_error(field if field in form.fields else None, errors)
        else:
            messages.success(request, "Notification settings saved.")
            return redirect("portal:notifications")
    status = 400 if form.errors else 200
    template = "portal/notifications.html"
    if request.htmx and request.method == "GET":
        template += "#happenings"
    return render(
        request,
        template,
        {
            "form": form,
            "has_email": has_email,
            "page": happenings(request.user, request.GET.get("page")),
        },
        status=status,
    )


@login_required
@require_POST
def template_delete(request: AuthedRequest, template_id: int) -> HttpResponse:
    tpl = access.get_template_for_user(request.user, template_id)
    request_template_delete(user=request.user, template=tpl)
    messages.success(request, f"Template “{tpl.name}” deleted.")
    return redirect("portal:home")
