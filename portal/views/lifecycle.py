"""Pool lifecycle pages: a pool's software inventory, validations and rollouts; a rollout's
capacity impact before it starts and its progress after (docs/lifecycle.md)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from portal import access
from portal.lib import lifecycle
from portal.models import Pool, Rollout
from portal.selectors import lifecycle as lifecycle_selectors
from portal.services import mig_relayout
from portal.services.rollouts import mig_relayout_start, rollout_plan, rollout_start
from portal.services.rollouts import rollout_halt as rollout_halt_
from portal.services.validations import pool_validate as pool_validate_
from portal.services.validations import rollout_active_for, validation_start
from portal.views.base import AuthedRequest, add_errors, refusal_response


class RolloutForm(forms.Form):
    kind = forms.ChoiceField(choices=Rollout.Kind.choices)
    target = forms.CharField(
        max_length=63,
        help_text="driver, operator or device plugin version, or a config name",
    )
    canary_nodes = forms.IntegerField(min_value=0, max_value=1000, initial=1)
    wave_percent = forms.IntegerField(min_value=1, max_value=100, initial=25)
    max_failed_nodes = forms.IntegerField(
        min_value=0, max_value=1000, initial=0, help_text="more failed nodes halt the rollout"
    )
    drain_timeout_s = forms.IntegerField(min_value=0, max_value=7 * 86400, initial=3600)
    apply_timeout_s = forms.IntegerField(min_value=1, max_value=86400, initial=900)
    nccl_busbw_gbps = forms.FloatField(
        min_value=0,
        # The site's floor (VALIDATION_NCCL_MIN_BUSBW_GBPS), read when the form is shown.
        initial=lambda: float(settings.VALIDATION_NCCL_MIN_BUSBW_GBPS),
        label="NCCL bus bandwidth at least (GB/s)",
    )
    warmup_max_s = forms.FloatField(
        min_value=0,
        initial=lifecycle.DEFAULT_THRESHOLDS["warmup_max_s"],
        label="model warm-up at most (s)",
    )
    dcgm_diag_level = forms.IntegerField(
        min_value=1,
        max_value=4,
        # Left out: the site's level (VALIDATION_DCGM_DIAG_LEVEL).
        required=False,
        initial=lambda: int(settings.VALIDATION_DCGM_DIAG_LEVEL),
        label="DCGM diagnostics level (1-4)",
        help_text="levels 2 and up run dcgmi diag with SYS_ADMIN and take longer",
        error_messages={
            k: "DCGM diagnostics level: a whole number from 1 to 4."
            for k in ("invalid", "min_value", "max_value")
        },
    )


def _pool_for_read(user: Any, pool_id: int) -> Pool:
    access.require_admin_read(user)
    return access.get_pool(user, pool_id)


def _pool_context(
    pool: Pool, form: RolloutForm, plan: list[dict[str, Any]] | None
) -> dict[str, Any]:
    return {
        "pool": pool,
        "software": lifecycle_selectors.pool_software(pool),
        "rollouts": lifecycle_selectors.rollout_list(pool)[:20],
        "validations": lifecycle_selectors.validation_list(pool),
        "running": rollout_active_for(pool),
        "form": form,
        "plan": plan,
        "mig": mig_relayout.proposal_for(pool),
    }


@login_required
@require_GET
def pool_detail(request: AuthedRequest, pool_id: int) -> HttpResponse:
    pool = _pool_for_read(request.user, pool_id)
    form = RolloutForm()
    _, plan = rollout_plan(pool, canary_nodes=1, wave_percent=25)
    return render(request, "portal/pool_lifecycle.html", _pool_context(pool, form, plan))


@login_required
@require_POST
def rollout_create(request: AuthedRequest, pool_id: int) -> HttpResponse:
    """Start a rollout, or (`preview`) show its waves and capacity impact without starting."""
    pool = access.get_pool_for_admin(request.user, pool_id)
    form = RolloutForm(request.POST)
    plan = None
    if form.is_valid():
        data = dict(form.cleaned_data)
        thresholds = {k: data.pop(k) for k in ("nccl_busbw_gbps", "warmup_max_s")}
        level = data.pop("dcgm_diag_level")
        if level is not None:
            thresholds["dcgm_diag_level"] = level
        _, plan = rollout_plan(
            pool,
            canary_nodes=data["canary_nodes"],
            wave_percent=data["wave_percent"],
            kind=data["kind"],
        )
        if "preview" not in request.POST:
            try:
                rollout = rollout_start(
                    actor=request.user,
                    pool=pool,
                    thresholds=thresholds,
                    **data,
                )
            except ValidationError as exc:
                add_errors(form, exc)
            else:
                return redirect(reverse("portal:rollout-detail", args=[rollout.pk]))
    status = 200 if form.is_valid() and "preview" in request.POST else 400
    return render(
        request, "portal/pool_lifecycle.html", _pool_context(pool, form, plan), status=status
    )


@login_required
@require_POST
def node_validate(request: AuthedRequest, node_id: int) -> HttpResponse:
    node = access.get_node_for_admin(request.user, node_id)
    try:
        validation_start(actor=request.user, node=node)
    except ValidationError as exc:
        return refusal_response(exc)
    return redirect(reverse("portal:pool-detail", args=[node.pool_id]))


@login_required
@require_GET
def rollout_index(request: AuthedRequest) -> HttpResponse:
    """Every rollout of every pool, newest first (before, reachable only from a pool's page)."""
    access.require_admin_read(request.user)
    page = Paginator(lifecycle_selectors.rollout_list(), 50).get_page(request.GET.get("page"))
    return render(request, "portal/rollouts.html", {"page": page})


@login_required
@require_GET
def rollout_detail(request: AuthedRequest, rollout_id: int) -> HttpResponse:
    rollout = access.get_rollout(request.user, rollout_id, read_only=True)
    context = {"rollout": rollout, "progress": lifecycle_selectors.rollout_progress(rollout)}
    template = "portal/rollout_detail.html"
    if request.htmx:
        template += "#rollout-progress"
    return render(request, template, context)


@login_required
@require_POST
def pool_mig_relayout(request: AuthedRequest, pool_id: int) -> HttpResponse:
    """Roll the proposed MIG layout out (one canary node, then waves of 25 %)."""
    pool = access.get_pool_for_admin(request.user, pool_id)
    try:
        rollout = mig_relayout_start(actor=request.user, pool=pool)
    except ValidationError as exc:
        return refusal_response(exc)
    return redirect(reverse("portal:rollout-detail", args=[rollout.pk]))


@login_required
@require_POST
def pool_validate(request: AuthedRequest, pool_id: int) -> HttpResponse:
    """Validate every idle node of the pool."""
    pool = access.get_pool_for_admin(request.user, pool_id)
    try:
        pool_validate_(actor=request.user, pool=pool)
    except ValidationError as exc:
        return refusal_response(exc)
    return redirect(reverse("portal:pool-detail", args=[pool.pk]))


@login_required
@require_POST
def rollout_halt(request: AuthedRequest, rollout_id: int) -> HttpResponse:
    rollout = access.get_rollout(request.user, rollout_id)
    try:
        rollout_halt_(
            actor=request.user,
            rollout=rollout,
            reason=request.POST.get("reason", ""),
        )
    except ValidationError as exc:
        return refusal_response(exc)
    return redirect(reverse("portal:rollout-detail", args=[rollout.pk]))
