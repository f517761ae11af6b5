"""The admins' overview: pools, the longest waits against their promise, nodes, rollouts."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from portal import access
from portal.selectors.overview import admin_overview
from portal.views.base import AuthedRequest


@login_required
@require_GET
def overview(request: AuthedRequest) -> HttpResponse:
    access.require_admin_read(request.user)
    template = "portal/overview.html"
    if request.htmx:
        template += "#overview-body"
    return render(request, template, admin_overview())
