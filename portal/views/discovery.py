"""Discovery for admins: the cluster's GPU nodes by their labels, and a pool for each group."""

from __future__ import annotations

import yaml
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from portal import access
from portal.selectors.discovery import GROUP_LABELS, discovery, proposals_document
from portal.services.config import pool_fields_from_file
from portal.services.pools import pool_create
from portal.views.base import AuthedRequest


@login_required
@require_GET
def discover_page(request: AuthedRequest) -> HttpResponse:
    access.require_admin_read(request.user)
    groups = discovery()
    rows = [
        (
            g,
            [(k.split("/")[-1], g.labels[k]) for k in GROUP_LABELS if g.labels[k]],
            yaml.safe_dump({"pools": [g.proposal]}, sort_keys=False) if g.proposal else "",
        )
        for g in groups
    ]
    context = {
        "rows": rows,
        "all_yaml": yaml.safe_dump(proposals_document(groups), sort_keys=False),
        "proposed": any(g.proposal for g in groups),
    }
    return render(request, "portal/discover.html", context)


@login_required
@require_POST
def discover_create(request: AuthedRequest) -> HttpResponse:
    """Create the pool proposed for one group (named by the proposal's name), audited."""
    access.require_admin(request.user)
    name = request.POST.get("name", "")
    proposal = next(
        (g.proposal for g in discovery() if g.proposal and g.proposal["name"] == name), None
    )
    if proposal is None:
        messages.error(request, f"No pool {name!r} is proposed now; the cluster changed?")
        return redirect("portal:discover")
    try:
        pool = pool_create(actor=request.user, **pool_fields_from_file(proposal))
    except ValidationError as exc:
        messages.error(request, f"Pool {name} was not created: {' '.join(exc.messages)}")
        return redirect("portal:discover")
    messages.success(request, f"Pool {pool.name} created; its nodes join at the next sync.")
    return redirect("portal:discover")
