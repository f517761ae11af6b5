"""Team pages for leads and admins: members, their caps and roles, quotas."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from portal import access
from portal.forms.teams import (
    MemberAddForm,
    MemberCapForm,
    QuotaForm,
    TeamCreateForm,
    TeamRetireForm,
)
from portal.models import GpuRequest, Membership, Team
from portal.selectors.audit import team_changes
from portal.selectors.audit_words import describe
from portal.selectors.teams import team_members, team_usage
from portal.services.teams import (
    membership_add,
    membership_remove,
    membership_set,
    quota_set,
    team_retire,
    team_retire_impact,
    team_retire_sentence,
)
from portal.services.teams import team_create as create_team
from portal.views.base import AuthedRequest, add_errors, htmx_redirect, next_url


@login_required
@require_GET
def team_list(request: AuthedRequest) -> HttpResponse:
    teams, retired = _teams_split(request)
    admin = access.is_admin(request.user)
    if len(teams) == 1 and not retired and not admin:
        return redirect("portal:team-detail", team_id=teams[0].pk)
    form = TeamCreateForm() if admin else None
    return render(
        request, "portal/team_list.html", {"teams": teams, "retired": retired, "form": form}
    )


def _teams_split(request: AuthedRequest) -> tuple[list[Team], list[Team]]:
    """The user's live teams, and apart the retired ones (kept for the logs)."""
    teams = list(access.teams_for(request.user))
    return [t for t in teams if t.retired_at is None], [t for t in teams if t.retired_at]


@login_required
@require_POST
def team_create(request: AuthedRequest) -> HttpResponse:
    """Admins create teams; audited."""
    access.require_admin(request.user)
    form = TeamCreateForm(request.POST)
    if form.is_valid():
        try:
            team = create_team(actor=request.user, **form.cleaned_data)
        except ValidationError as exc:
            add_errors(form, exc)
        else:
            messages.success(request, f"Team {team.name} created.")
            return redirect("portal:team-detail", team_id=team.pk)
    teams, retired = _teams_split(request)
    context = {"teams": teams, "retired": retired, "form": form}
    return render(request, "portal/team_list.html", context, status=400)


@login_required
@require_POST
def member_add(request: AuthedRequest, team_id: int) -> HttpResponse:
    """Leads add members to their team (admins also choose the role); audited."""
    team = access.get_team_for_user(request.user, team_id, role=Membership.Role.LEAD)
    admin = access.is_admin(request.user)
    form = MemberAddForm(request.POST, admin=admin)
    if form.is_valid():
        role = form.cleaned_data.get("role") or Membership.Role.MEMBER
        try:
            membership_add(
                actor=request.user,
                team=team,
                username=form.cleaned_data["username"],
                role=role,
            )
        except ValidationError as exc:
            add_errors(form, exc)
        else:
            messages.success(request, f"Added {form.cleaned_data['username']} to {team.name}.")
            return redirect(reverse("portal:team-detail", args=[team.pk]) + "#members")
    context = _team_context(request, team)
    context["add_form"] = form
    return render(request, "portal/team.html", context, status=400)


@login_required
@require_POST
def member_remove(request: AuthedRequest, team_id: int, membership_id: int) -> HttpResponse:
    """Leads remove members of their team (admins anyone): pending requests are cancelled."""
    team = access.get_team_for_user(request.user, team_id, role=Membership.Role.LEAD)
    membership = access.get_membership_for_lead(request.user, team, membership_id)
    if membership.role == Membership.Role.LEAD and not access.is_admin(request.user):
        raise PermissionDenied("Only platform admins remove a team's leads.")
    username = membership.user.get_username()
    cancelled = membership_remove(actor=request.user, membership=membership)
    text = f"Removed {username} from {team.name}"
    if cancelled:
        text += f"; {cancelled} pending request{'s' if cancelled != 1 else ''} cancelled"
    messages.success(request, text + ".")
    return redirect(reverse("portal:team-detail", args=[team.pk]) + "#members")


def _team_context(request: AuthedRequest, team: Team) -> dict[str, Any]:
    role = access.role_in(request.user, team)
    admin = access.is_admin(request.user)
    can_edit = admin or role == Membership.Role.LEAD
    # Admins see every pool, so that they can grant a team a share of a new one.
    usage = team_usage(team, all_pools=admin)
    for u in usage:
        u.form = QuotaForm(
            initial=QuotaForm.initial_for(u.quota), admin=admin, prefix=f"pool{u.pool.pk}"
        )
    members = team_members(team)
    for m in members:
        ms = m["membership"]
        m["form"] = MemberCapForm(
            initial={
                "gpu_cap": None if ms.gpu_cap_milli is None else ms.gpu_cap_milli / 1000,
                "role": ms.role,
            },
            admin=admin,
            prefix=f"m{ms.pk}",
        )
    return {
        "team": team,
        "role": role,
        "can_edit": can_edit,
        "add_form": MemberAddForm(admin=admin) if can_edit else None,
        "admin": admin,
        "usage": usage,
        "members": members,
        "auditor": access.is_read_only(request.user),
        "audit": describe(list(team_changes(team)[:20]))
        if can_edit or access.sees_all(request.user)
        else [],
        "pending": GpuRequest.objects.filter(team=team, state=GpuRequest.State.PENDING).count(),
    }


@login_required
@require_GET
def team_detail(request: AuthedRequest, team_id: int) -> HttpResponse:
    team = access.get_team_for_user(request.user, team_id)
    template = "portal/team.html"
    if request.htmx:
        template += "#team-usage"
    return render(request, template, _team_context(request, team))


@login_required
@require_POST
def quota_edit(request: AuthedRequest, team_id: int, pool_id: int) -> HttpResponse:
    team = access.get_team_for_user(request.user, team_id, role=Membership.Role.LEAD)
    pool = access.get_pool(request.user, pool_id)
    admin = access.is_admin(request.user)
    form = QuotaForm(request.POST, admin=admin, prefix=f"pool{pool.pk}")
    if form.is_valid():
        try:
            quota_set(actor=request.user, team=team, pool=pool, **form.service_kwargs())
        except ValidationError as exc:
            add_errors(form, exc, QuotaForm.FIELD_FOR)
        else:
            d = form.cleaned_data
            limit = (
                "without limit" if d.get("borrowing_limit") is None else f"{d['borrowing_limit']:g}"
            )
            messages.success(
                request,
                f"Quota of {team.name} in {pool.name} saved: {d['nominal']:g} GPUs guaranteed, "
                f"may borrow {limit}.",
            )
            return htmx_redirect(
                request, next_url(request, reverse("portal:team-detail", args=[team.pk]))
            )
    context = _team_context(request, team)
    for u in context["usage"]:
        if u.pool.pk == pool.pk:
            u.form = form
    if not any(u.pool.pk == pool.pk for u in context["usage"]):
        context["extra_form"] = (pool, form)
    return render(request, "portal/team.html", context, status=400)


@login_required
@require_POST
def member_edit(request: AuthedRequest, team_id: int, membership_id: int) -> HttpResponse:
    team = access.get_team_for_user(request.user, team_id, role=Membership.Role.LEAD)
    membership = access.get_membership_for_lead(request.user, team, membership_id)
    admin = access.is_admin(request.user)
    form = MemberCapForm(request.POST, admin=admin, prefix=f"m{membership.pk}")
    if form.is_valid():
        cap = form.cleaned_data["gpu_cap"]
        role = form.cleaned_data.get("role") or membership.role
        try:
            membership_set(
                actor=request.user,
                team=team,
                user=membership.user,
                role=role,
                gpu_cap_milli=None if cap is None else int(cap * 1000),
            )
        except ValidationError as exc:
            add_errors(form, exc, {"gpu_cap_milli": "gpu_cap"})
        else:
            messages.success(request, f"Saved {membership.user.get_username()}'s role and cap.")
            return redirect("portal:team-detail", team_id=team.pk)
    context = _team_context(request, team)
    for m in context["members"]:
        if m["membership"].pk == membership.pk:
            m["form"] = form
    return render(request, "portal/team.html", context, status=400)


@login_required
@require_POST
def team_retire_view(request: AuthedRequest, team_id: int) -> HttpResponse:
    """Admins retire a team, after a page that says what happens to its work."""
    team = access.get_team_for_user(request.user, team_id)
    access.require_admin(request.user)
    form = TeamRetireForm(request.POST)
    impact = team_retire_impact(team)
    context = {
        "what": f"team {team.name}",
        "form": form,
        "sentence": team_retire_sentence(team, impact),
        "back": reverse("portal:team-detail", args=[team.pk]),
        "error": "",
    }
    if not form.is_valid() or not form.cleaned_data["confirm"]:
        return render(request, "portal/retire.html", context)
    try:
        _, cancelled = team_retire(actor=request.user, team=team, confirm=True)
    except ValidationError as exc:
        context["error"] = " ".join(exc.messages)
        return render(request, "portal/retire.html", context, status=400)
    messages.success(
        request,
        f"Team {team.name} retired; {cancelled} waiting request{'s' if cancelled != 1 else ''} "
        "cancelled, running work runs to its end.",
    )
    return redirect("portal:team-list")
