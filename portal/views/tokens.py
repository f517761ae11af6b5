"""Personal access tokens on pages: each user's own (/me/tokens/), and every user's for admins."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from portal import access
from portal.forms.tokens import TokenCreateForm
from portal.selectors.tokens import token_list
from portal.services.tokens import token_create, token_revoke
from portal.views.base import AuthedRequest, add_errors, next_url

#: where a new secret waits in the session for the one page that shows it
SECRET_SESSION_KEY = "qm_new_token_secret"


@login_required
@require_http_methods(["GET", "POST"])
def my_tokens(request: AuthedRequest) -> HttpResponse:
    """List and create the user's tokens; a new secret is shown once, after the redirect."""
    form = TokenCreateForm(
        request.POST or None,
        admin=access.is_admin(request.user),
        read_only=access.is_read_only(request.user),
    )
    if request.method == "POST" and form.is_valid():
        try:
            token, secret = token_create(user=request.user, **form.cleaned_data)
        except ValidationError as exc:
            add_errors(form, exc)
        else:
            request.session[SECRET_SESSION_KEY] = {"id": token.pk, "secret": secret}
            messages.success(request, f"Token “{token.name}” created.")
            return redirect("portal:tokens")
    new = request.session.pop(SECRET_SESSION_KEY, None)
    return render(
        request,
        "portal/tokens.html",
        {
            "form": form,
            "tokens": token_list(user=request.user)[:200],
            "new": new,
            "can_revoke": True,
        },
        status=400 if form.errors else 200,
    )


@login_required
@require_POST
def token_revoke_view(request: AuthedRequest) -> HttpResponse:
    """Revoke one token (`token_id` posted): the user's own, or anyone's for an admin."""
    token_id = request.POST.get("token_id", "")
    if not token_id.isdigit():
        return HttpResponse(
            "token_id: say which token to revoke.", status=400, content_type="text/plain"
        )
    token = access.get_token_for_user(request.user, token_id, write=True)
    if token_revoke(token=token, actor=request.user, reason=request.POST.get("reason", "")):
        messages.success(request, f"Token “{token.name}” ({token.prefix}…) revoked.")
    else:
        messages.info(request, f"Token “{token.name}” was already revoked.")
    return redirect(next_url(request, "/me/tokens/"))


@login_required
def all_tokens(request: AuthedRequest) -> HttpResponse:
    """Every user's tokens, for admins (who may revoke any of them) and auditors."""
    access.require_admin_read(request.user)
    qs = token_list(user=None)
    username = request.GET.get("user", "").strip()
    if username:
        qs = qs.filter(user__username=username)
    return render(request, "portal/tokens_all.html", {"tokens": qs[:500], "username": username})
