"""The capacity map: pools, nodes and devices; node actions (cordon, drain, return) for admins."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from portal import access
from portal.forms.fields import BulkIdsForm, ReasonForm
from portal.forms.filters import CapacityFilterForm
from portal.models import Node
from portal.selectors import lifecycle
from portal.selectors.capacity import capacity_nodes, pool_summaries
from portal.services.nodes import device_clear_quarantine as clear_quarantine
from portal.services.nodes import node_cordon, node_drain, node_return
from portal.views.audit import confirm_page
from portal.views.base import AuthedRequest, next_url, refusal_response

NODES_PER_PAGE = 20


@login_required
@require_GET
def capacity(request: AuthedRequest) -> HttpResponse:
    """Pool → node → device → slot, coloured free / team / fragmented / unhealthy."""
    access.require_admin_read(request.user)
    form = CapacityFilterForm(request.GET or None)
    nodes = Node.objects.select_related("pool").order_by("pool__name", "name")
    if form.is_valid():
        if form.cleaned_data["pool"]:
            nodes = nodes.filter(pool=form.cleaned_data["pool"])
        if form.cleaned_data["node"]:
            nodes = nodes.filter(name__contains=form.cleaned_data["node"])
    page = Paginator(nodes, NODES_PER_PAGE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    summaries = pool_summaries()
    # Node software from GFD labels: a pool whose nodes disagree is flagged (docs/lifecycle.md).
    drift = lifecycle.drift_by_pool()
    for s in summaries:
        s["drift"] = drift.get(s["pool"].pk, {}).get("fields", {})
    context = {
        "form": form,
        "page": page,
        "nodes": capacity_nodes(list(page.object_list)),
        "summaries": summaries,
        "query": query.urlencode(),
        "drifted": {n for d in drift.values() for n in d["odd"]},
    }
    template = "portal/capacity.html"
    if request.htmx:
        template += "#capacity-map"
    return render(request, template, context)


@login_required
@require_POST
def device_clear_quarantine(request: AuthedRequest, device_id: int) -> HttpResponse:
    """Admins return a quarantined device to service; audited."""
    device = access.get_device_for_admin(request.user, device_id)
    try:
        clear_quarantine(actor=request.user, device=device)
    except ValidationError as exc:
        return refusal_response(exc)
    return redirect(next_url(request, reverse("portal:capacity")))


NODE_SERVICES = {
    "cordon": node_cordon,
    "drain": node_drain,
    "return": node_return,
}


@login_required
@require_POST
def nodes_bulk_action(request: AuthedRequest) -> HttpResponse:
    """Cordon, drain or return the selected nodes (admins only), one reason for all."""
    access.require_admin(request.user)
    action = request.POST.get("action", "")
    if action not in NODE_SERVICES:
        return HttpResponse("action: choose cordon, drain or return.", status=400)
    form = BulkIdsForm(request.POST)
    default = reverse("portal:capacity")
    if not form.is_valid():
        return confirm_page(
            request,
            form=form,
            title=f"{action.capitalize()} the selected nodes",
            action_url=reverse("portal:nodes-bulk-action"),
            hidden={"next": next_url(request, default), "action": action},
        )
    nodes = [
        access.get_node_for_admin(request.user, pk) for pk in sorted(set(form.cleaned_data["ids"]))
    ]
    for node in nodes:
        NODE_SERVICES[action](actor=request.user, node=node, reason=form.cleaned_data["reason"])
    past = {"cordon": "Cordoned", "drain": "Drained", "return": "Returned"}[action]
    messages.success(request, f"{past} {len(nodes)} node{'s' if len(nodes) != 1 else ''}.")
    return redirect(next_url(request, default))


@login_required
@require_POST
def node_action(request: AuthedRequest, node_id: int, action: str) -> HttpResponse:
    """One node's cordon, drain or return (admins only), with its reason."""
    node = access.get_node_for_admin(request.user, node_id)
    form = ReasonForm(request.POST)
    default = reverse("portal:capacity")
    if not form.is_valid():
        return confirm_page(
            request,
            form=form,
            title=f"{action.capitalize()} node {node.name}",
            action_url=reverse("portal:node-action", args=[node.pk, action]),
            hidden={"next": next_url(request, default)},
        )
    NODE_SERVICES[action](actor=request.user, node=node, reason=form.cleaned_data["reason"])
    return redirect(next_url(request, default))
