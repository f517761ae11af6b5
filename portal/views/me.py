"""Pages of the signed-in user: sign-in, notification settings, saved request templates."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from portal import access
from portal.forms.requests import NotificationPreferenceForm
from portal.models import NotificationPreference
from portal.services.me import notification_preference_set, request_template_delete
from portal.views.base import AuthedRequest

if TYPE_CHECKING:
    pass


class LoginView(auth_views.LoginView):
    """Password login beside single sign-on; with PASSWORD_LOGIN=false, only the SSO button."""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not settings.PASSWORD_LOGIN:
            raise PermissionDenied("Password login is switched off: sign in with single sign-on.")
        return super().post(request, *args, **kwargs)

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


@login_required
@require_http_methods(["GET", "POST"])
def notification_settings(request: AuthedRequest) -> HttpResponse:
    pref = NotificationPreference.objects.filter(user=request.user).first()
    form = NotificationPreferenceForm(
        request.POST or None, instance=pref or NotificationPreference(user=request.user)
    )
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
    return render(
        request,
        "portal/notifications.html",
        {"form": form, "has_email": bool(getattr(request.user, "email", ""))},
        status=status,
    )


@login_required
@require_POST
def template_delete(request: AuthedRequest, template_id: int) -> HttpResponse:
    tpl = access.get_template_for_user(request.user, template_id)
    request_template_delete(user=request.user, template=tpl)
    messages.success(request, f"Template “{tpl.name}” deleted.")
    return redirect("portal:home")
