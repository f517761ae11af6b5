"""Utilization history pages of pools, nodes and teams, drawn as server-side SVG."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from portal import access
from portal.lib import charts
from portal.models import GpuRequest, Node
from portal.services import serving_samples, utilization
from portal.views.base import AuthedRequest

SPANS = tuple(utilization.RANGES)


def _span(request: AuthedRequest) -> str:
    span = request.GET.get("range", "24h")
    return span if span in utilization.RANGES else "24h"


def chart_points(series: list[list[Any]]) -> list[tuple[float, float | None]]:
    return [(float(t), v) for t, v in series]


def _history(scope: str, key: str, span: str) -> Any:
    pts = utilization.history(scope, key, span)
    return charts.line_chart(
        [
            ("mean", [(t, avg) for t, avg, _ in pts]),
            ("peak", [(t, peak) for t, _, peak in pts]),
        ],
        title=f"GPU utilization, last {span}",
        unit="%",
        y_max=100,
        width=720,
    )


def _history_page(
    request: AuthedRequest, title: str, scope: str, key: str, serving: Any = ()
) -> HttpResponse:
    span = _span(request)
    context = {
        "title": title,
        "chart": _history(scope, key, span),
        "span": span,
        "spans": SPANS,
        # busy is not healthy: each serving workload's utilization against its latency
        "serving": [
            (r, serving_samples.request_metrics(r, window_s=3600)["health"]) for r in serving
        ],
    }
    return render(request, "portal/history.html", context)


def _serving_in(**where: Any) -> Any:
    return (
        GpuRequest.objects.filter(
            kind=GpuRequest.Kind.SERVING, state=GpuRequest.State.RUNNING, **where
        )
        .select_related("workload_class")
        .order_by("pk")[:50]
    )


@login_required
@require_GET
def pool_history(request: AuthedRequest, pool_id: int) -> HttpResponse:
    # Beside the capacity map: which pools run hot is for admins and auditors.
    access.require_admin_read(request.user)
    pool = access.get_pool(request.user, pool_id)
    serving = _serving_in(attempts__pool=pool, attempts__state__in=["admitted", "running"])
    return _history_page(request, f"Pool {pool.name}", "pool", pool.name, serving)


@login_required
@require_GET
def node_history(request: AuthedRequest, node_id: int) -> HttpResponse:
    access.require_admin_read(request.user)
    node = Node.objects.filter(pk=node_id).first()
    if node is None:
        return HttpResponse("No such node.", status=404)
    return _history_page(request, f"Node {node.name}", "node", node.name)


@login_required
@require_GET
def team_history(request: AuthedRequest, team_id: int) -> HttpResponse:
    team = access.get_team_for_user(request.user, team_id)
    return _history_page(request, f"Team {team.name}", "team", team.name, _serving_in(team=team))
