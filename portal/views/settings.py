"""The settings page for admins: pools, workload classes and scheduling profiles."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from portal import access
from portal.forms.settings import (
    PolicyProfileForm,
    PoolCreateForm,
    PoolForm,
    ProfileDiffForm,
    RetireForm,
    WorkloadClassCreateForm,
    WorkloadClassForm,
)
from portal.models import PolicyProfile, Pool, Quota, Team, WorkloadClass
from portal.selectors.gangs import gang_launch
from portal.selectors.profiles import profile_diff
from portal.services.pools import (
    RetireImpact,
    pool_create,
    pool_retire,
    pool_retire_impact,
    pool_update,
    workload_class_create,
    workload_class_retire,
    workload_class_retire_impact,
    workload_class_update,
)
from portal.services.profiles import (
    policy_profile_activate,
    policy_profile_create,
    policy_profile_update,
)
from portal.views.base import AuthedRequest, add_errors, refusal_response


@login_required
@require_GET
def settings_page(request: AuthedRequest) -> HttpResponse:
    """Scheduling profiles, workload classes, pools and team guarantees, each editable by
    admins (auditors read them)."""
    access.require_admin_read(request.user)
    template = "portal/settings.html"
    if request.htmx:
        template += "#profiles"
    return render(request, template, _settings_context())


@login_required
@require_GET
def profile_compare(request: AuthedRequest) -> HttpResponse:
    """Two profiles side by side: only the knobs that differ."""
    access.require_admin_read(request.user)
    form = ProfileDiffForm(request.GET if "a" in request.GET else None)
    rows = None
    if form.is_bound and form.is_valid():
        rows = profile_diff(form.cleaned_data["a"], form.cleaned_data["b"])
    context = {"form": form, "rows": rows}
    return render(request, "portal/profile_diff.html", context, status=400 if form.errors else 200)


def _settings_context(override: dict[tuple[str, int], Any] | None = None) -> dict[str, Any]:
    override = override or {}
    classes = [
        (c, override.get(("class", c.pk)) or WorkloadClassForm(instance=c, prefix=f"c{c.pk}"))
        for c in WorkloadClass.objects.filter(retired_at=None)
    ]
    pools = [
        (p, override.get(("pool", p.pk)) or PoolForm(instance=p, prefix=f"p{p.pk}"))
        for p in Pool.objects.filter(retired_at=None)
    ]
    quotas = Quota.objects.select_related("team", "pool").order_by("team__name", "pool__name")
    profiles = [
        (
            p,
            override.get(("profile", p.pk))
            or PolicyProfileForm(initial=dict(p.profile().knobs), prefix=f"pp{p.pk}"),
        )
        for p in PolicyProfile.objects.select_related("updated_by").order_by("-active", "name")
    ]
    new_profile = override.get(("profile", 0)) or PolicyProfileForm(
        initial=PolicyProfile.objects.active_profile().knobs, with_name=True, prefix="pp-new"
    )
    return {
        "classes": classes,
        "pools": pools,
        "quotas": quotas,
        "teams": Team.objects.all(),
        "profiles": profiles,
        "new_profile": new_profile,
        "new_pool": override.get(("pool", 0)) or PoolCreateForm(prefix="p-new"),
        "new_class": override.get(("class", 0)) or WorkloadClassCreateForm(prefix="c-new"),
        "retired_pools": Pool.objects.exclude(retired_at=None),
        "retired_classes": WorkloadClass.objects.exclude(retired_at=None),
        "gang_launch": gang_launch(),
    }


def _profiles_answer(
    request: AuthedRequest, override: dict[tuple[str, int], Any] | None = None
) -> HttpResponse:
    """After a profile change: the profiles section for HTMX, else the page (400 with the
    form's errors, or a redirect after a change)."""
    status = 400 if override else 200
    if request.htmx:
        return render(
            request, "portal/settings.html#profiles", _settings_context(override), status=status
        )
    if override:
        return render(request, "portal/settings.html", _settings_context(override), status=400)
    return redirect(reverse("portal:settings") + "#profiles")


@login_required
@require_POST
def profile_create(request: AuthedRequest) -> HttpResponse:
    access.require_admin(request.user)
    form = PolicyProfileForm(request.POST, with_name=True, prefix="pp-new")
    if form.is_valid():
        try:
            policy_profile_create(
                actor=request.user,
                name=form.cleaned_data["name"],
                knobs=form.knobs(),
            )
        except ValidationError as exc:
            add_errors(form, exc)
        else:
            return _profiles_answer(request)
    return _profiles_answer(request, {("profile", 0): form})


@login_required
@require_POST
def profile_edit(request: AuthedRequest, profile_id: int) -> HttpResponse:
    row = access.get_policy_profile_for_admin(request.user, profile_id)
    form = PolicyProfileForm(request.POST, prefix=f"pp{row.pk}")
    if form.is_valid():
        try:
            policy_profile_update(actor=request.user, profile=row, knobs=form.knobs())
        except ValidationError as exc:
            add_errors(form, exc)
        else:
            return _profiles_answer(request)
    return _profiles_answer(request, {("profile", row.pk): form})


@login_required
@require_POST
def profile_activate(request: AuthedRequest, profile_id: int) -> HttpResponse:
    row = access.get_policy_profile_for_admin(request.user, profile_id)
    try:
        policy_profile_activate(actor=request.user, profile=row)
    except ValidationError as exc:
        return refusal_response(exc)
    return _profiles_answer(request)


def _save_form(
    request: AuthedRequest,
    form: Any,
    save: Callable[[dict[str, Any]], object],
    *,
    section: str,
    key: tuple[str, int],
) -> HttpResponse:
    """Validate an admin's pool or class form and save it: a redirect to its section of the
    settings page, or the page again (400) with the form's errors."""
    if form.is_valid():
        try:
            save({f: form.cleaned_data[f] for f in form.Meta.fields})
        except ValidationError as exc:
            add_errors(form, exc)
        else:
            return redirect(reverse("portal:settings") + f"#{section}")
    return render(request, "portal/settings.html", _settings_context({key: form}), status=400)


@login_required
@require_POST
def workload_class_edit(request: AuthedRequest, class_id: int) -> HttpResponse:
    wc = access.get_workload_class_for_admin(request.user, class_id)
    form = WorkloadClassForm(
        request.POST, instance=WorkloadClass.objects.get(pk=wc.pk), prefix=f"c{wc.pk}"
    )
    return _save_form(
        request,
        form,
        lambda changes: workload_class_update(actor=request.user, workload_class=wc, **changes),
        section="classes",
        key=("class", wc.pk),
    )


@login_required
@require_POST
def pool_edit(request: AuthedRequest, pool_id: int) -> HttpResponse:
    pool = access.get_pool_for_admin(request.user, pool_id)
    form = PoolForm(request.POST, instance=Pool.objects.get(pk=pool.pk), prefix=f"p{pool.pk}")
    return _save_form(
        request,
        form,
        lambda changes: pool_update(actor=request.user, pool=pool, **changes),
        section="pools",
        key=("pool", pool.pk),
    )


@login_required
@require_POST
def pool_new(request: AuthedRequest) -> HttpResponse:
    access.require_admin(request.user)
    form = PoolCreateForm(request.POST, prefix="p-new")
    return _save_form(
        request,
        form,
        lambda fields: pool_create(actor=request.user, **fields),
        section="pools",
        key=("pool", 0),
    )


@login_required
@require_POST
def workload_class_new(request: AuthedRequest) -> HttpResponse:
    access.require_admin(request.user)
    form = WorkloadClassCreateForm(request.POST, prefix="c-new")
    return _save_form(
        request,
        form,
        lambda fields: workload_class_create(actor=request.user, **fields),
        section="classes",
        key=("class", 0),
    )


def _retire_answer(
    request: AuthedRequest, *, what: str, form: RetireForm, impact: RetireImpact, error: str = ""
) -> HttpResponse:
    """The question before retiring (what happens to its work); 400 with what was wrong."""
    context = {"what": what, "form": form, "sentence": impact.sentence(what), "error": error}
    return render(request, "portal/retire.html", context, status=400 if error else 200)


def _retire(
    request: AuthedRequest,
    *,
    what: str,
    live: QuerySet[Any],
    impact: RetireImpact,
    retire: Callable[[bool, Any], object],
    section: str,
) -> HttpResponse:
    """Retire a pool or class once the admin confirmed and chose where its work moves."""
    form = RetireForm(request.POST, choices=live)
    if not form.is_valid() or not form.cleaned_data["confirm"]:
        return _retire_answer(request, what=what, form=form, impact=impact)
    try:
        retire(form.cleaned_data["confirm"], form.cleaned_data["move_to"])
    except ValidationError as exc:
        message = "" if "confirm" in exc.message_dict else " ".join(exc.messages)
        return _retire_answer(request, what=what, form=form, impact=impact, error=message)
    return redirect(reverse("portal:settings") + f"#{section}")


@login_required
@require_POST
def pool_retire_view(request: AuthedRequest, pool_id: int) -> HttpResponse:
    pool = access.get_pool_for_admin(request.user, pool_id)
    return _retire(
        request,
        what=f"pool {pool.name}",
        live=Pool.objects.filter(retired_at=None).exclude(pk=pool.pk),
        impact=pool_retire_impact(pool),
        retire=lambda confirm, move_to: pool_retire(
            actor=request.user, pool=pool, confirm=confirm, move_to=move_to
        ),
        section="pools",
    )


@login_required
@require_POST
def workload_class_retire_view(request: AuthedRequest, class_id: int) -> HttpResponse:
    wc = access.get_workload_class_for_admin(request.user, class_id)
    return _retire(
        request,
        what=f"class {wc.name}",
        live=WorkloadClass.objects.filter(retired_at=None).exclude(pk=wc.pk),
        impact=workload_class_retire_impact(wc),
        retire=lambda confirm, move_to: workload_class_retire(
            actor=request.user, workload_class=wc, confirm=confirm, move_to=move_to
        ),
        section="classes",
    )
