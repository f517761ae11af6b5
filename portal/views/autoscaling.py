"""The autoscaling page: what autoscaled pools wait for, asked for, added and gave back."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from portal import access
from portal.selectors.autoscaling import autoscaling as autoscaling_state
from portal.views.base import AuthedRequest


@login_required
@require_GET
def autoscaling(request: AuthedRequest) -> HttpResponse:
    access.require_admin_read(request.user)
    template = "portal/autoscaling.html"
    if request.htmx:
        template += "#autoscaling-body"
    return render(request, template, autoscaling_state(request.user))
