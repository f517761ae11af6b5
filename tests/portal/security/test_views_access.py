"""Every URL, walked as someone who must not get in.

The patterns come from the resolver, so a new URL cannot be forgotten: it is
walked as carol (team nlp) with ids of team vision's objects and of admin-only
objects, and must answer 404 or 403 (405 for a method the view does not take),
change nothing, and leak nothing. Pages without ids must not show vision's data.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from portal.models import (
    AuditEvent,
    Decision,
    Device,
    GpuRequest,
    Membership,
    Node,
    NotificationPreference,
    PersonalToken,
    PolicyProfile,
    Pool,
    Quota,
    RequestTemplate,
    Team,
    WhatIfRun,
    WorkloadClass,
)
from portal.services.rollouts import rollout_start
from portal.services.tokens import token_create
from portal.services.validations import validation_start
from portal.tick import run as tick
from tests.base import World, api_secret, make_world, submit

# Not walked, and why:
SKIPPED = {
    "admin/": "Django admin: staff-only by Django's own checks",
    "static/": "static files",
    "accounts/login/": "must be reachable without an account",
    "accounts/logout/": "ends the caller's own session only",
    "oidc/": "single sign-on redirects, 404 while off (test_sso.py, tests/browser/test_sso_oidc.py)",
    "api/schema/": "the OpenAPI schema: no data, signed-in users only (tested in test_api.py)",
    "api/docs/": "Swagger UI page: no data (tested in test_api_contract.py)",
    "healthz": "liveness probe, no data",
    "readyz": "readiness probe: whether the database answers, no data",
    "metrics": "Prometheus scrape endpoint, aggregate numbers only",
}
# Node-agent endpoints authenticate the agent by its token, not a user: tested with the agent.
SKIPPED_WORDS = ("agent",)

MARKER = "vision-secret-7f3a"
ANSWERS = {403, 404}


def _walk(patterns: list, prefix: str = "") -> Iterator[tuple[str, str]]:
    for p in patterns:
        route = prefix + str(p.pattern)
        if isinstance(p, URLResolver):
            yield from _walk(p.url_patterns, route)
        elif isinstance(p, URLPattern):
            yield route, p.name or ""


def _skipped(route: str, name: str) -> bool:
    return any(route.startswith(s) for s in SKIPPED) or any(
        w in route or w in name for w in SKIPPED_WORDS
    )


ROUTES = sorted({r for r, n in _walk(get_resolver().url_patterns) if not _skipped(r, n)})
PARAM = re.compile(r"<(?:(?P<conv>[^>:]+):)?(?P<name>\w+)>")


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker) -> Iterator[dict]:  # noqa: ANN001
    """One world for the whole module, rolled back at the end (each test adds its own savepoint)."""
    with django_db_blocker.unblock(), transaction.atomic():
        w: World = make_world()
        req = submit(w.bob, w.vision, name=MARKER, image=f"registry.example.com/{MARKER}/train:1")
        big = [submit(w.bob, w.vision, count=8, name=f"{MARKER}-{i}") for i in range(5)]
        tick.run_tick()
        running = next(r for r in big if GpuRequest.objects.get(pk=r.pk).state == "admitted")
        quarantined = Device.objects.filter(node__name="a100-02").order_by("index").first()
        Device.objects.filter(pk=quarantined.pk).update(quarantined=True)
        ids = {
            "request_id": req.pk,
            "team_id": w.vision.pk,
            "pool_id": Pool.objects.get(name="a100-train").pk,
            "membership_id": Membership.objects.get(user=w.bob, team=w.vision).pk,
            "class_id": WorkloadClass.objects.get(name="training").pk,
            "node_id": Node.objects.get(name="a100-01").pk,
            "device_id": quarantined.pk,
            # A workload's checkpoint report: a user's session is not the attempt's token.
            "attempt_id": running.attempts.get().pk,
            "profile_id": PolicyProfile.objects.get(active=True).pk,
            "action": "drain",
            # bob's saved request template: only bob may use or delete it.
            "template_id": RequestTemplate.objects.create(
                user=w.bob, name=MARKER, fields={"name": MARKER}
            ).pk,
            # bob's API token: only bob (and admins) may see or revoke it.
            "token_id": token_create(user=w.bob, name=MARKER, scope="read")[0].pk,
            # Admins' and auditors' only; a node's burn-in reports with its own token.
            "rollout_id": rollout_start(
                actor=w.dave, pool=Pool.objects.get(name="l4-shared"), kind="driver", target="1"
            ).pk,
            "validation_id": validation_start(actor=w.dave, node=Node.objects.get(name="l4-01")).pk,
            # a finished what-if an admin could apply
            "run_id": WhatIfRun.objects.create(
                days=1,
                changes={"policy.preempt_after_s": "60"},
                state="done",
                result={"current": {}, "proposed": {}, "teams": {}},
            ).pk,
        }
        yield {"world": w, "ids": ids, "running": running}
        transaction.set_rollback(True)


def fill(route: str, ids: dict) -> str:
    def sub(m: re.Match) -> str:
        name = m.group("name")
        assert name in ids, f"{route}: add an object for <{name}> to the walker's ids"
        return str(ids[name])

    assert not route.startswith("^"), f"{route}: regex routes need a case in the walker"
    return "/" + PARAM.sub(sub, route)


def state() -> tuple:
    """Everything a stray write could touch."""
    return (
        AuditEvent.objects.count(),
        Decision.objects.count(),
        sorted(GpuRequest.objects.values_list("id", "state", "status_code")),
        sorted(
            Quota.objects.values_list(
                "id", "nominal_milli", "borrowing_limit_milli", "granted_milli"
            )
        ),
        sorted(Node.objects.values_list("id", "cordoned", "draining")),
        sorted(WorkloadClass.objects.values_list("id", "band")),
        sorted(Pool.objects.values_list("id", "lifecycle")),
        sorted(Membership.objects.values_list("id", "role", "gpu_cap_milli")),
        sorted(Device.objects.filter(quarantined=True).values_list("id", flat=True)),
        sorted(PersonalToken.objects.values_list("id", "revoked_at")),
        sorted(Team.objects.values_list("id", "name")),
        sorted(RequestTemplate.objects.values_list("id", "name")),
        # carol (the outsider) may save her own notification settings; nobody else's change.
        sorted(
            NotificationPreference.objects.exclude(user__username="carol").values_list(
                "user_id", "email", "webhook_url"
            )
        ),
        sorted(PolicyProfile.objects.values_list("id", "version", "active", "knobs")),
    )


def test_it_walks_routes() -> None:
    # The walker sees the portal, the API and the HTMX endpoints.
    assert "requests/<int:request_id>/" in ROUTES
    assert "api/v1/requests/<int:request_id>/cancel/" in ROUTES
    assert "requests/preview/" in ROUTES
    assert len(ROUTES) >= 25


@pytest.mark.django_db
@pytest.mark.parametrize("route", ROUTES)
def test_it_keeps_other_teams_out(world: dict, route: str) -> None:
    w: World = world["world"]
    client = Client()
    client.force_login(w.carol)
    url = fill(route, world["ids"])
    before = state()
    statuses = {}
    for method in ("get", "post", "put", "patch", "delete"):
        data = {"team": w.vision.pk, "nominal_milli": 0} if method != "get" else {}
        if method in ("put", "patch"):
            r = getattr(client, method)(url, data, content_type="application/json")
        else:
            r = getattr(client, method)(url, data)
        statuses[method] = r.status_code
        assert r.status_code != 500, (url, method)
        assert MARKER not in r.content.decode(errors="replace"), (
            f"{method} {url} leaks vision's request"
        )
        if PARAM.search(route):
            assert r.status_code in ANSWERS | {405}, (url, method, r.status_code)
        else:
            # No ids in the path: the caller's own view (200), admin-only (403), or bad input (400).
            assert r.status_code in {200, 302, 400, 403, 405}, (url, method, r.status_code)
    if PARAM.search(route):
        assert ANSWERS & set(statuses.values()), (url, statuses)
    after = state()
    # carol's own submit may add carol's rows; nothing of vision's or the platform's changes.
    assert before == after, (url, statuses)


@pytest.mark.django_db
@pytest.mark.parametrize("route", ROUTES)
def test_it_asks_anonymous_users_to_sign_in(world: dict, route: str) -> None:
    url = fill(route, world["ids"])
    for method in ("get", "post"):
        r = getattr(Client(), method)(url)
        if route.startswith("api/"):
            assert r.status_code in {401, 403, 405}, (url, method, r.status_code)
        else:
            assert r.status_code in {302, 405}, (url, method, r.status_code)
            if r.status_code == 302:
                assert r["Location"].startswith("/accounts/login/")


def answers(url: str) -> set[int]:
    """What a GET may answer: the log download of a request that never ran says so with a 404."""
    return {200, 302, 405, 404} if url.endswith("/logs/download/") else {200, 302, 405}


@pytest.mark.django_db
def test_it_changes_nothing_on_get(world: dict) -> None:
    """Admins can reach everything: a GET of every URL still writes nothing."""
    client = Client()
    client.force_login(world["world"].dave)
    before = state()
    for route in ROUTES:
        url = fill(route, world["ids"])
        r = client.get(url)
        assert r.status_code in answers(url), (url, r.status_code)
        r = client.get(url, HTTP_HX_REQUEST="true")
        assert r.status_code in answers(url), (url, r.status_code)
    assert state() == before


@pytest.mark.django_db
def test_it_keeps_members_from_lead_and_admin_actions(world: dict) -> None:
    """bob is in vision but not its lead: quota and member changes answer 403."""
    w: World = world["world"]
    ids = world["ids"]
    client = Client()
    client.force_login(w.bob)
    before = state()
    for route in ROUTES:
        if not any(
            k in route
            for k in ("quotas", "members", "ops/", "nodes", "capacity", "audit", "profiles")
        ):
            continue
        url = fill(route, ids)
        r = client.post(url, {"nominal_milli": 0})
        r2 = client.put(url, {"nominal_milli": 0}, content_type="application/json")
        assert {r.status_code, r2.status_code} <= {403, 405}, (url, r.status_code, r2.status_code)
    assert state() == before


@pytest.mark.django_db
def test_it_enforces_csrf_on_every_state_change(world: dict) -> None:
    w: World = world["world"]
    ids = world["ids"]
    client = Client(enforce_csrf_checks=True)
    client.force_login(w.dave)
    before = state()
    for route in ROUTES:
        url = fill(route, ids)
        for method in ("post", "put", "patch", "delete"):
            r = (
                getattr(client, method)(url, {}, content_type="application/json")
                if method != "post"
                else client.post(url, {})
            )
            assert r.status_code in {403, 405}, (url, method, r.status_code)
            if r.status_code == 403 and not route.startswith("api/"):
                assert b"CSRF" in r.content, url
    assert state() == before


@pytest.mark.django_db
def test_it_accepts_the_htmx_csrf_header(world: dict) -> None:
    """The page puts the token in hx-headers on <body>; sending it as X-CSRFToken works."""
    w: World = world["world"]
    client = Client(enforce_csrf_checks=True)
    client.force_login(w.bob)
    page = client.get("/").content.decode()
    token = re.search(r'hx-headers=\'\{"X-CSRFToken": "([^"]+)"\}\'', page).group(1)
    req = GpuRequest.objects.get(name=MARKER)
    r = client.post(f"/requests/{req.pk}/cancel/", {"reason": "done"}, HTTP_X_CSRFTOKEN=token)
    assert r.status_code == 302
    req.refresh_from_db()
    assert req.state == "cancelled"
    # The API with the session also needs the token.
    r = client.post(
        "/api/v1/requests/",
        {"workload_class": "training", "image": "registry.example.com/x/y:1"},
        content_type="application/json",
    )
    assert r.status_code == 403


@pytest.mark.django_db
def test_it_lets_auditors_read_everything_and_change_nothing(world: dict, settings) -> None:  # noqa: ANN001
    """An auditor (no team, not staff) reads every page and partial an admin reads; every
    write answers 403, by session (pages and API) and by API token alike."""
    auditor = get_user_model().objects.create_user("erin", password="pw-erin-123")
    auditor.groups.add(Group.objects.get_or_create(name=settings.AUDITOR_GROUP)[0])
    # A token wider than the auditor may create (one adopted from before personal tokens):
    # the role still refuses every write.
    secret = api_secret(auditor, scope="read+submit")
    session = Client()
    session.force_login(auditor)
    by_token = Client(HTTP_AUTHORIZATION=f"Bearer {secret}")
    before = state()
    writes = titles = 0
    for route in ROUTES:
        url = fill(route, world["ids"])
        workload_report = "checkpoint" in route or route.endswith("/result")
        if not workload_report:
            for headers in ({}, {"HTTP_HX_REQUEST": "true"}):
                r = session.get(url, **headers)
                assert r.status_code in answers(url), (url, r.status_code)
                # A page's title is text: a block left open in it swallows the page's markup.
                if (
                    r.status_code == 200
                    and not headers
                    and r["Content-Type"].startswith("text/html")
                ):
                    title = re.search(rb"<title>(.*?)</title>", r.content, re.S)
                    assert title is None or b"<" not in title[1], (url, title[1][:80])
                    titles += title is not None
        clients = [session, by_token] if route.startswith("api/") else [session]
        for client in clients:
            for method in ("post", "put", "patch", "delete"):
                r = (
                    getattr(client, method)(
                        url,
                        {"nominal_milli": 0, "username": "carol"},
                        content_type="application/json",
                    )
                    if method != "post" or route.startswith("api/")
                    else client.post(url, {"nominal_milli": 0, "username": "carol", "name": "x"})
                )
                # A workload's checkpoint (or burn-in) report takes only POST and authenticates
                # no user.
                expected = {403, 405} if workload_report and client is by_token else {403}
                if route in ("me/tokens/", "me/tokens/revoke/") and client is session:
                    # An auditor keeps their own read tokens (this input is incomplete: 400).
                    expected = {400, 405}
                assert r.status_code in expected, (url, method, r.status_code)
                writes += 1
    assert writes > 100
    assert titles > 20
    assert state() == before
    # What admins read, the auditor reads: vision's request, the audit log, capacity, settings.
    assert MARKER in session.get(f"/requests/{world['ids']['request_id']}/").content.decode()
    assert b"node.cordon" not in session.get("/ops/audit/").content  # nothing cordoned yet
    assert session.get("/ops/audit/").status_code == 200
    assert session.get("/ops/capacity/").status_code == 200
    page = session.get("/ops/settings/").content.decode()
    assert "<fieldset disabled" in page
    assert "Cordon</button>" not in session.get("/ops/capacity/").content.decode()
    # The people pages: any team's log and events; their own notification settings shown,
    # not saved (the walker above got 403 for the POST and no preference row was made).
    request_id = world["ids"]["request_id"]
    assert session.get(f"/requests/{request_id}/logs/").status_code == 200
    # Past the access check: the request never ran, and the answer says so (not a 403).
    download = session.get(f"/requests/{request_id}/logs/download/")
    assert download.status_code == 404
    assert b"has not run yet" in download.content
    prefs = session.get("/me/notifications/").content.decode()
    assert '<fieldset disabled class="read-only">' in prefs
    assert not NotificationPreference.objects.filter(user=auditor).exists()
    jobs = session.get("/?scope=team").content.decode()
    assert MARKER in jobs and ">Cancel</button>" not in jobs and "Resubmit" not in jobs
    assert by_token.get("/api/v1/audit/").status_code == 200
    assert by_token.get("/api/v1/capacity/").status_code == 200
    decisions = by_token.get("/api/v1/decisions/").json()
    assert {d["team"] for d in decisions["results"]} >= {"vision"}
