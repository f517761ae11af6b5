"""What-if pages for admins: draft a change, watch the replay, compare, apply."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from portal import access
from portal.forms.whatif import WhatIfChangeForm
from portal.models import WhatIfRun
from portal.selectors import whatif as whatif_selectors
from portal.tick import whatif_runs
from portal.views.base import AuthedRequest

EXAMPLE = "quota.vision.a100-train=24\npolicy.preempt_after_s=120"


@login_required
@require_http_methods(["GET", "POST"])
def whatif_list(request: AuthedRequest) -> HttpResponse:
    """Recent what-ifs, and the form that drafts one: a guarantee, a knob or KEY=VALUE lines."""
    access.require_admin_read(request.user)
    errors: dict[str, list[str]] = {}
    days = "7"
    if request.method == "POST":
        access.require_admin(request.user)
        days = request.POST.get("days", "7")
        form = WhatIfChangeForm(request.POST)
        try:
            if not form.is_valid():
                raise ValidationError(form.errors)
            if not days.isdigit():
                raise ValidationError({"days": "A whole number of days."})
            run = whatif_runs.whatif_draft(
                actor=request.user,
                days=int(days),
                settings=whatif_runs.parse_settings(form.lines()),
            )
        except ValidationError as exc:
            errors = exc.message_dict
            for field, messages in errors.items():
                if field in form.fields and field not in form.errors:
                    form.add_error(field, messages)
        else:
            return redirect("portal:whatif-detail", run.pk)
    else:
        # a report's suggestion opens the form pre-filled (?team=&pool=&quota=, ?settings=)
        form = WhatIfChangeForm(initial={k: v for k, v in request.GET.items() if k != "days"})
    context = {
        "runs": WhatIfRun.objects.select_related("created_by")[:20],
        "errors": errors,
        "other_errors": errors.get("__all__", []),
        "days": days,
        "form": form,
        "example": EXAMPLE,
    }
    return render(request, "portal/whatif.html", context, status=400 if errors else 200)


@login_required
def whatif_detail(request: AuthedRequest, run_id: int) -> HttpResponse:
    """A what-if's progress (polled while it runs) or its comparison, per team and class."""
    access.require_admin_read(request.user)
    run = get_object_or_404(WhatIfRun, pk=run_id)
    template = "portal/whatif_detail.html"
    if request.htmx:
        template += "#whatif-result"
    return render(request, template, _detail_context(run))


def _detail_context(run: WhatIfRun, error: str = "") -> dict[str, Any]:
    return {
        "run": run,
        **whatif_selectors.comparison(run.result),
        "changes": whatif_selectors.change_words(run.changes),
        "error": error,
    }


@login_required
@require_POST
def whatif_apply(request: AuthedRequest, run_id: int) -> HttpResponse:
    access.require_admin(request.user)
    run = get_object_or_404(WhatIfRun, pk=run_id)
    try:
        whatif_runs.whatif_apply(actor=request.user, run=run)
    except ValidationError as exc:
        error = "; ".join(m for ms in exc.message_dict.values() for m in ms)
        context = _detail_context(run, error)
        return render(request, "portal/whatif_detail.html", context, status=400)
    return redirect("portal:whatif-detail", run.pk)
