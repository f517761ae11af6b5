"""HTML pages. Function views: access check → form → one service or selector → render.

Each page that changes renders a named partial for HTMX polling
(`template += "#name"` when request.htmx); every hx-get also has a real href.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from portal import access, lifecycle_selectors, selectors, services
from portal.audit_words import describe
from portal.estimates import request_estimates
from portal.forms import (
    TEMPLATE_FIELDS,
    CapacityFilterForm,
    DecisionFilterForm,
    MemberAddForm,
    MemberCapForm,
    PolicyProfileForm,
    PoolForm,
    QueueFilterForm,
    QuotaForm,
    RequestFilterForm,
    SubmitForm,
    TeamCreateForm,
    TemplateSaveForm,
    WorkloadClassForm,
    initial_from_request,
)
from portal.models import (
    GpuRequest,
    Membership,
    Node,
    PolicyProfile,
    Pool,
    Quota,
    Team,
    WorkloadClass,
)
from portal.preview import gpu_request_preview

PAGE_SIZE = 50
NODES_PER_PAGE = 20


@require_GET
def healthz(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"ok": True})


def readiness() -> JsonResponse:
    """Ready to serve: the database answers and the Celery broker accepts a connection.

    200 with each check "ok", else 503 naming what failed. /healthz stays a
    liveness probe (the process answers) so that a database outage does not
    get every web pod restarted.
    """
    checks = {"database": _check_database(), "broker": _check_broker()}
    ok = all(v == "ok" for v in checks.values())
    return JsonResponse({"ok": ok, **checks}, status=200 if ok else 503)


def _check_database() -> str:
    from django.db import DatabaseError, connection

    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except DatabaseError as exc:
        return f"unreachable: {type(exc).__name__}"
    return "ok"


def _check_broker() -> str:
    from portal.celery import app

    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(
                max_retries=1, interval_start=0, interval_step=0.5, interval_max=0.5, timeout=2
            )
    except Exception as exc:  # kombu raises a transport's own errors
        return f"unreachable: {type(exc).__name__}"
    return "ok"


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """404 for a URL nothing serves: JSON under /api/ (as the API's own 404s), a page elsewhere."""
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "Not found."}, status=404)
    from django.views.defaults import page_not_found

    return page_not_found(request, exception or Exception())


class LoginView(auth_views.LoginView):
    """Password login beside single sign-on; with PASSWORD_LOGIN=false, only the SSO button."""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not settings.PASSWORD_LOGIN:
            raise PermissionDenied("Password login is switched off: sign in with single sign-on.")
        return super().post(request, *args, **kwargs)

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context.update(
            sso=settings.OIDC_ENABLED,
            sso_name=settings.OIDC_PROVIDER_NAME,
            sso_failed=self.request.GET.get("sso") == "failed",
            password_login=settings.PASSWORD_LOGIN,
        )
        return context


@require_GET
def readyz(request: HttpRequest) -> HttpResponse:
    """Served by ProbeMiddleware; a view so the URL resolves and reverses."""
    return readiness()


def _add_errors(form: Any, exc: ValidationError, rename: dict[str, str] | None = None) -> None:
    """Put a service's ValidationError on the form field it names (or on the form)."""
    for field, errors in exc.message_dict.items():
        name = (rename or {}).get(field, field)
        form.add_error(name if name in form.fields else None, errors)


def _refused(exc: ValidationError) -> HttpResponse:
    """A button's action the service refused: its reasons, as plain text."""
    return HttpResponse(" ".join(exc.messages), status=400, content_type="text/plain")


def _next_url(request: HttpRequest, default: str) -> str:
    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        return target
    return default


# ---------------------------------------------------------------------------
# Researcher


@login_required
@require_GET
def home(request: HttpRequest) -> HttpResponse:
    """My jobs (or, with ?scope=team, every request of my teams)."""
    scope = "team" if request.GET.get("scope") == "team" else "mine"
    filters = RequestFilterForm(request.GET or None, teams=access.teams_for(request.user))
    wanted = {k: v for k, v in filters.cleaned_data.items() if v} if filters.is_valid() else {}
    qs = selectors.request_list(request.user, mine=scope == "mine", with_counts=False, **wanted)
    page = Paginator(qs, PAGE_SIZE).get_page(request.GET.get("page"))
    rows = list(page.object_list)
    selectors.request_attempt_facts(rows)
    estimates = request_estimates(rows)
    for r in rows:
        r.estimate = estimates.get(r.pk)  # type: ignore[attr-defined]
        r.can_cancel = r.state not in GpuRequest.TERMINAL_STATES  # type: ignore[attr-defined]
    template = "portal/home.html"
    if request.htmx:
        template += "#request-table"
    query = request.GET.copy()
    query.pop("page", None)
    context = {
        "page": page,
        "rows": rows,
        "scope": scope,
        "query": query.urlencode(),
        "filters": filters,
        "templates": request.user.request_templates.all(),  # type: ignore[union-attr]
        "now": timezone.now(),
    }
    return render(request, template, context)


@login_required
@require_http_methods(["GET", "POST"])
def request_submit(request: HttpRequest) -> HttpResponse:
    teams = access.teams_for(request.user)
    if request.method == "GET" and request.htmx and "pool" in request.GET:
        # The pool changed: offer the device profiles it really has.
        form = SubmitForm(request.GET, teams=teams)
        # Only the choices change: the profile is not wrong for being unchosen yet.
        response = render(
            request, "portal/submit.html#profile-field", {"form": form, "profiles_only": True}
        )
        # The new profiles are in: the form asks for a fresh preview (not before, see submit.html).
        response["HX-Trigger-After-Swap"] = "qm-profiles"
        return response
    initial = _submit_initial(request) if request.method == "GET" else None
    form = SubmitForm(request.POST or None, teams=teams, initial=initial)
    save_as = TemplateSaveForm(request.POST if "save_template" in request.POST else None)
    if request.method == "POST" and "save_template" in request.POST:
        if save_as.is_valid():
            fields = {k: request.POST.get(k, "") for k in TEMPLATE_FIELDS}
            try:
                services.request_template_save(
                    user=request.user,  # type: ignore[arg-type]
                    name=save_as.cleaned_data["template_name"],
                    fields=fields,
                )
            except ValidationError as exc:
                _add_errors(save_as, exc)
            else:
                messages.success(
                    request, f"Saved as template “{save_as.cleaned_data['template_name']}”."
                )
        status = 400 if save_as.errors else 200
        context = {"form": form, "no_team": not teams.exists(), "save_as": save_as}
        return render(request, "portal/submit.html", context, status=status)
    if request.method == "POST" and form.is_valid():
        # What the preview says is rejected is refused here too, before anything is stored.
        verdict = gpu_request_preview(**form.preview_kwargs())
        if verdict.outcome == "rejected":
            form.add_error(None, f"This request would be rejected: {verdict.message}")
        else:
            try:
                req = services.gpu_request_submit(user=request.user, **form.service_kwargs())  # type: ignore[arg-type]
            except ValidationError as exc:
                _add_errors(form, exc)
            else:
                messages.success(
                    request,
                    f"Request {req.pk} submitted"
                    + (f" ({req.name})" if req.name else "")
                    + ": it is in the queue; this page follows it.",
                )
                return redirect("portal:request-detail", request_id=req.pk)
    status = 400 if form.errors else 200
    context = {"form": form, "no_team": not teams.exists(), "save_as": save_as}
    return render(request, "portal/submit.html", context, status=status)


def _submit_initial(request: HttpRequest) -> dict[str, Any] | None:
    """The form prefilled from `?from=<request>` (resubmit) or `?template=<id>` (saved)."""
    if request.GET.get("from"):
        return initial_from_request(
            access.get_gpu_request_for_user(request.user, request.GET["from"])
        )
    if request.GET.get("template"):
        tpl = access.get_template_for_user(request.user, request.GET["template"])
        return {k: v for k, v in tpl.fields.items() if k in TEMPLATE_FIELDS}
    return None


@login_required
@require_POST
def request_preview(request: HttpRequest) -> HttpResponse:
    """What would happen if this were submitted now. Reads only; POST so the env stays out of URLs."""
    form = SubmitForm(request.POST, teams=access.teams_for(request.user))
    preview = None
    if form.is_valid():
        preview = gpu_request_preview(**form.preview_kwargs())
    return render(request, "portal/submit.html#preview", {"form": form, "preview": preview})


@login_required
@require_GET
def request_detail(request: HttpRequest, request_id: int) -> HttpResponse:
    req = access.get_gpu_request_for_user(request.user, request_id)
    template = "portal/request_detail.html"
    if request.htmx:
        template += "#request-status"
    context = {
        "req": req,
        "estimate": request_estimates([req]).get(req.pk),
        "attempts": req.attempts.select_related("pool", "usage").order_by("-number"),
        "decisions": req.decisions.order_by("-created_at", "-id")[:50],
        "can_cancel": req.state not in GpuRequest.TERMINAL_STATES,
        "wait_split": selectors.request_wait_split(req),
    }
    return render(request, template, context)


@login_required
@require_GET
def decision_log(request: HttpRequest) -> HttpResponse:
    """Decisions of the user's teams (all for admins), filtered and paginated."""
    teams = access.teams_for(request.user)
    form = DecisionFilterForm(request.GET or None, teams=teams)
    filters: dict[str, Any] = {}
    if form.is_valid():
        d = form.cleaned_data
        filters = {
            "team": d["team"],
            "request_id": d["request"],
            "node": d["node"],
            "kind": d["kind"],
        }
    qs = selectors.decision_list(request.user, **filters).select_related("request")
    page = Paginator(qs, PAGE_SIZE).get_page(request.GET.get("page"))
    template = "portal/decisions.html"
    if request.htmx:
        template += "#decision-log"
    query = request.GET.copy()
    query.pop("page", None)
    return render(request, template, {"form": form, "page": page, "query": query.urlencode()})


@login_required
@require_GET
def queue(request: HttpRequest) -> HttpResponse:
    """Pending requests in scheduling order, by class, team and pool (scoped for non-admins)."""
    form = QueueFilterForm(request.GET or None, teams=access.teams_for(request.user))
    filters: dict[str, Any] = {}
    if form.is_valid():
        filters = {k: v for k, v in form.cleaned_data.items() if v}
    qs = selectors.queue_list(request.user, **filters)
    page = Paginator(qs, PAGE_SIZE).get_page(request.GET.get("page"))
    template = "portal/queue.html"
    if request.htmx:
        template += "#queue-table"
    query = request.GET.copy()
    query.pop("page", None)
    context = {
        "form": form,
        "page": page,
        "summary": selectors.queue_summary(request.user),
        "query": query.urlencode(),
    }
    return render(request, template, context)


# ---------------------------------------------------------------------------
# Team lead


@login_required
@require_GET
def team_list(request: HttpRequest) -> HttpResponse:
    teams = list(access.teams_for(request.user))
    admin = access.is_admin(request.user)
    if len(teams) == 1 and not admin:
        return redirect("portal:team-detail", team_id=teams[0].pk)
    form = TeamCreateForm() if admin else None
    return render(request, "portal/team_list.html", {"teams": teams, "form": form})


@login_required
@require_POST
def team_create(request: HttpRequest) -> HttpResponse:
    """Admins create teams; audited."""
    access.require_admin(request.user)
    form = TeamCreateForm(request.POST)
    if form.is_valid():
        try:
            team = services.team_create(actor=request.user, **form.cleaned_data)  # type: ignore[arg-type]
        except ValidationError as exc:
            _add_errors(form, exc)
        else:
            return redirect("portal:team-detail", team_id=team.pk)
    teams = list(access.teams_for(request.user))
    return render(request, "portal/team_list.html", {"teams": teams, "form": form}, status=400)


@login_required
@require_POST
def member_add(request: HttpRequest, team_id: int) -> HttpResponse:
    """Leads add members to their team (admins also choose the role); audited."""
    team = access.get_team_for_user(request.user, team_id, role=Membership.Role.LEAD)
    admin = access.is_admin(request.user)
    form = MemberAddForm(request.POST, admin=admin)
    if form.is_valid():
        role = form.cleaned_data.get("role") or Membership.Role.MEMBER
        try:
            services.membership_add(
                actor=request.user,  # type: ignore[arg-type]
                team=team,
                username=form.cleaned_data["username"],
                role=role,
            )
        except ValidationError as exc:
            _add_errors(form, exc)
        else:
            return redirect(reverse("portal:team-detail", args=[team.pk]) + "#members")
    context = _team_context(request, team)
    context["add_form"] = form
    return render(request, "portal/team.html", context, status=400)


@login_required
@require_POST
def member_remove(request: HttpRequest, team_id: int, membership_id: int) -> HttpResponse:
    """Leads remove members of their team (admins anyone): pending requests are cancelled."""
    team = access.get_team_for_user(request.user, team_id, role=Membership.Role.LEAD)
    membership = access.get_membership_for_lead(request.user, team, membership_id)
    if membership.role == Membership.Role.LEAD and not access.is_admin(request.user):
        raise PermissionDenied("Only platform admins remove a team's leads.")
    services.membership_remove(actor=request.user, membership=membership)  # type: ignore[arg-type]
    return redirect(reverse("portal:team-detail", args=[team.pk]) + "#members")


def _team_context(request: HttpRequest, team: Team) -> dict[str, Any]:
    role = access.role_in(request.user, team)
    admin = access.is_admin(request.user)
    can_edit = admin or role == Membership.Role.LEAD
    # Admins see every pool, so that they can grant a team a share of a new one.
    usage = selectors.team_usage(team, all_pools=admin)
    for u in usage:
        u.form = QuotaForm(
            initial=QuotaForm.initial_for(u.quota), admin=admin, prefix=f"pool{u.pool.pk}"
        )  # type: ignore[attr-defined]
    members = selectors.team_members(team)
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
        "audit": describe(list(selectors.audit_list(team=team)[:20]))
        if can_edit or access.sees_all(request.user)
        else [],
        "pending": GpuRequest.objects.filter(team=team, state=GpuRequest.State.PENDING).count(),
    }


@login_required
@require_GET
def team_detail(request: HttpRequest, team_id: int) -> HttpResponse:
    team = access.get_team_for_user(request.user, team_id)
    template = "portal/team.html"
    if request.htmx:
        template += "#team-usage"
    return render(request, template, _team_context(request, team))


@login_required
@require_POST
def quota_edit(request: HttpRequest, team_id: int, pool_id: int) -> HttpResponse:
    team = access.get_team_for_user(request.user, team_id, role=Membership.Role.LEAD)
    pool = access.get_pool(request.user, pool_id)
    admin = access.is_admin(request.user)
    form = QuotaForm(request.POST, admin=admin, prefix=f"pool{pool.pk}")
    if form.is_valid():
        try:
            services.quota_set(actor=request.user, team=team, pool=pool, **form.service_kwargs())  # type: ignore[arg-type]
        except ValidationError as exc:
            _add_errors(form, exc, QuotaForm.FIELD_FOR)
        else:
            return redirect(_next_url(request, reverse("portal:team-detail", args=[team.pk])))
    context = _team_context(request, team)
    for u in context["usage"]:
        if u.pool.pk == pool.pk:
            u.form = form
    if not any(u.pool.pk == pool.pk for u in context["usage"]):
        context["extra_form"] = (pool, form)
    return render(request, "portal/team.html", context, status=400)


@login_required
@require_POST
def member_edit(request: HttpRequest, team_id: int, membership_id: int) -> HttpResponse:
    team = access.get_team_for_user(request.user, team_id, role=Membership.Role.LEAD)
    membership = access.get_membership_for_lead(request.user, team, membership_id)
    admin = access.is_admin(request.user)
    form = MemberCapForm(request.POST, admin=admin, prefix=f"m{membership.pk}")
    if form.is_valid():
        cap = form.cleaned_data["gpu_cap"]
        role = form.cleaned_data.get("role") or membership.role
        try:
            services.membership_set(
                actor=request.user,  # type: ignore[arg-type]
                team=team,
                user=membership.user,
                role=role,
                gpu_cap_milli=None if cap is None else int(cap * 1000),
            )
        except ValidationError as exc:
            _add_errors(form, exc, {"gpu_cap_milli": "gpu_cap"})
        else:
            return redirect("portal:team-detail", team_id=team.pk)
    context = _team_context(request, team)
    for m in context["members"]:
        if m["membership"].pk == membership.pk:
            m["form"] = form
    return render(request, "portal/team.html", context, status=400)


# ---------------------------------------------------------------------------
# Platform admin


@login_required
@require_GET
def capacity(request: HttpRequest) -> HttpResponse:
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
    summaries = selectors.pool_summaries()
    # Node software from GFD labels: a pool whose nodes disagree is flagged (docs/lifecycle.md).
    drift = lifecycle_selectors.drift_by_pool()
    for s in summaries:
        s["drift"] = drift.get(s["pool"].pk, {}).get("fields", {})
    context = {
        "form": form,
        "page": page,
        "nodes": selectors.capacity_nodes(list(page.object_list)),
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
def device_clear_quarantine(request: HttpRequest, device_id: int) -> HttpResponse:
    """Admins return a quarantined device to service; audited."""
    device = access.get_device_for_admin(request.user, device_id)
    try:
        services.device_clear_quarantine(actor=request.user, device=device)  # type: ignore[arg-type]
    except ValidationError as exc:
        return _refused(exc)
    return redirect(_next_url(request, reverse("portal:capacity")))


@login_required
@require_GET
def settings_page(request: HttpRequest) -> HttpResponse:
    """Scheduling profiles, workload classes, pools and team guarantees, each editable by
    admins (auditors read them)."""
    access.require_admin_read(request.user)
    template = "portal/settings.html"
    if request.htmx:
        template += "#profiles"
    return render(request, template, _settings_context())


def _settings_context(override: dict[tuple[str, int], Any] | None = None) -> dict[str, Any]:
    override = override or {}
    classes = [
        (c, override.get(("class", c.pk)) or WorkloadClassForm(instance=c, prefix=f"c{c.pk}"))
        for c in WorkloadClass.objects.all()
    ]
    pools = [
        (p, override.get(("pool", p.pk)) or PoolForm(instance=p, prefix=f"p{p.pk}"))
        for p in Pool.objects.all()
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
    }


def _profiles_answer(
    request: HttpRequest, override: dict[tuple[str, int], Any] | None = None
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
def profile_create(request: HttpRequest) -> HttpResponse:
    access.require_admin(request.user)
    form = PolicyProfileForm(request.POST, with_name=True, prefix="pp-new")
    if form.is_valid():
        try:
            services.policy_profile_create(
                actor=request.user,  # type: ignore[arg-type]
                name=form.cleaned_data["name"],
                knobs=form.knobs(),
            )
        except ValidationError as exc:
            _add_errors(form, exc)
        else:
            return _profiles_answer(request)
    return _profiles_answer(request, {("profile", 0): form})


@login_required
@require_POST
def profile_edit(request: HttpRequest, profile_id: int) -> HttpResponse:
    row = access.get_policy_profile_for_admin(request.user, profile_id)
    form = PolicyProfileForm(request.POST, prefix=f"pp{row.pk}")
    if form.is_valid():
        try:
            services.policy_profile_update(actor=request.user, profile=row, knobs=form.knobs())  # type: ignore[arg-type]
        except ValidationError as exc:
            _add_errors(form, exc)
        else:
            return _profiles_answer(request)
    return _profiles_answer(request, {("profile", row.pk): form})


@login_required
@require_POST
def profile_activate(request: HttpRequest, profile_id: int) -> HttpResponse:
    row = access.get_policy_profile_for_admin(request.user, profile_id)
    try:
        services.policy_profile_activate(actor=request.user, profile=row)  # type: ignore[arg-type]
    except ValidationError as exc:
        return _refused(exc)
    return _profiles_answer(request)


@login_required
@require_POST
def workload_class_edit(request: HttpRequest, class_id: int) -> HttpResponse:
    wc = access.get_workload_class_for_admin(request.user, class_id)
    form = WorkloadClassForm(
        request.POST, instance=WorkloadClass.objects.get(pk=wc.pk), prefix=f"c{wc.pk}"
    )
    if form.is_valid():
        changes = {f: form.cleaned_data[f] for f in form.Meta.fields}
        try:
            services.workload_class_update(actor=request.user, workload_class=wc, **changes)  # type: ignore[arg-type]
        except ValidationError as exc:
            _add_errors(form, exc)
        else:
            return redirect(reverse("portal:settings") + "#classes")
    return render(
        request, "portal/settings.html", _settings_context({("class", wc.pk): form}), status=400
    )


@login_required
@require_POST
def pool_edit(request: HttpRequest, pool_id: int) -> HttpResponse:
    pool = access.get_pool_for_admin(request.user, pool_id)
    form = PoolForm(request.POST, instance=Pool.objects.get(pk=pool.pk), prefix=f"p{pool.pk}")
    if form.is_valid():
        changes = {f: form.cleaned_data[f] for f in form.Meta.fields}
        try:
            services.pool_update(actor=request.user, pool=pool, **changes)  # type: ignore[arg-type]
        except ValidationError as exc:
            _add_errors(form, exc)
        else:
            return redirect(reverse("portal:settings") + "#pools")
    return render(
        request, "portal/settings.html", _settings_context({("pool", pool.pk): form}), status=400
    )
