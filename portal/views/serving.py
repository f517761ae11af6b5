"""Serving workloads' pages: the request-path panel, scale and revision."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from portal import access
from portal.lib import charts
from portal.models import GpuRequest
from portal.services import serving, serving_samples
from portal.views.base import AuthedRequest
from portal.views.history import chart_points

if TYPE_CHECKING:
    pass


def _panel_context(req: GpuRequest, window: str) -> dict[str, Any]:
    m = serving_samples.request_metrics(req, window_s=serving_samples.WINDOWS[window])
    s = m["series"]
    markers = [(c["at"], f"→ {c['after']}") for c in m["revision_changes"]]
    objective = m["slo"]["objective_seconds"]
    figures = [
        charts.line_chart(
            [
                ("p50", chart_points(s["ttft_p50_seconds"])),
                ("p95", chart_points(s["ttft_p95_seconds"])),
            ],
            title="Time to first token",
            unit="s",
            markers=markers,
            objective=objective,
        ),
        charts.line_chart(
            [("batch", chart_points(s["batch_size"])), ("queue", chart_points(s["queue_depth"]))],
            title="Batch size and queue depth",
            markers=markers,
        ),
        charts.line_chart(
            [("tokens/s", chart_points(s["tokens_per_second"]))],
            title="Tokens per second",
            markers=markers,
        ),
        charts.line_chart(
            [("GPU util", chart_points(s["gpu_utilization"]))],
            title="GPU utilization",
            unit="%",
            y_max=100,
            markers=markers,
        ),
        charts.line_chart(
            [("memory", chart_points(s["gpu_memory_used_mib"]))],
            title="GPU memory used",
            unit="MiB",
            markers=markers,
        ),
    ]
    return {
        "req": req,
        "m": m,
        "figures": figures,
        "window": window,
        "windows": list(serving_samples.WINDOWS),
        "can_change": req.state not in GpuRequest.TERMINAL_STATES,
    }


@login_required
@require_GET
def serving_panel(request: AuthedRequest, request_id: int) -> HttpResponse:
    """The request path beside the GPU: TTFT, batch, queue, tokens/s, utilization, memory."""
    req = access.get_gpu_request_for_user(request.user, request_id)
    window = request.GET.get("window", "1h")
    window = window if window in serving_samples.WINDOWS else "1h"
    return render(request, "portal/serving_panel.html", _panel_context(req, window))


@login_required
@require_POST
def serving_change(request: AuthedRequest, request_id: int) -> HttpResponse:
    """Scale (replicas) or change revision (model_revision) from the request page; bad
    input answers 400 with the panel and the error on its field."""
    req = access.get_gpu_request_for_user(request.user, request_id, write=True)
    try:
        if "model_revision" in request.POST:
            serving.serving_set_revision(
                user=request.user, gpu_request=req, revision=request.POST["model_revision"]
            )
            messages.success(request, "The replicas roll over to the new revision.")
        else:
            raw = request.POST.get("replicas", "")
            replicas: Any = int(raw) if raw.strip().isdigit() else raw
            serving.serving_scale(user=request.user, gpu_request=req, replicas=replicas)
            messages.success(request, "Replica count changed: the workload is placed again.")
    except ValidationError as exc:
        req.refresh_from_db()
        context = {**_panel_context(req, "1h"), "errors": exc.message_dict}
        return render(request, "portal/serving_change.html", context, status=400)
    return redirect(reverse("portal:request-detail", args=[req.pk]))
