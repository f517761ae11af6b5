"""What every page view shares: form errors, refusals, the page size and the one open-redirect guard."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.utils.http import url_has_allowed_host_and_scheme
from django_htmx.http import HttpResponseClientRedirect
from django_htmx.middleware import HtmxDetails


class AuthedRequest(HttpRequest):
    """A page request behind `login_required`: `user` is a signed-in `User`, and django-htmx's
    middleware has set `htmx`. Views annotate `request` with it instead of casting."""

    user: User
    htmx: HtmxDetails


PAGE_SIZE = 50


def add_errors(form: Any, exc: ValidationError, rename: dict[str, str] | None = None) -> None:
    """Put a service's ValidationError on the form field it names (or on the form)."""
    for field, errors in exc.message_dict.items():
        name = (rename or {}).get(field, field)
        form.add_error(name if name in form.fields else None, errors)


def refusal_response(exc: ValidationError) -> HttpResponse:
    """A button's action the service refused: its reasons, as plain text."""
    return HttpResponse(" ".join(exc.messages), status=400, content_type="text/plain")


def next_url(request: HttpRequest, default: str) -> str:
    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        return target
    return default


def htmx_redirect(request: HttpRequest, url: str) -> HttpResponse:
    """Where a form goes once saved: a redirect, or for a form htmx posted (its errors come
    back in place) a whole-page visit, so the new page and its flash message are shown."""
    if getattr(request, "htmx", False):
        return HttpResponseClientRedirect(url)
    return HttpResponseRedirect(url)
