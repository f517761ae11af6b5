"""Admin and lead journeys in a real browser (confirmations with a reason, bulk actions, the
audit log in words and its CSV), and axe-core on every page for every persona, in the light
and the dark colour scheme.

axe-core comes from npm (tests/browser/axe, `npm ci` in scripts/test) and is injected into
the same Chromium. Fixtures (browser, page, world, login, shot) come from test_portal_browser.py.
Run: .venv/bin/pytest tests/browser -m browser
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from portal.models import AuditEvent, GpuRequest, Node, Pool
from portal.services.nodes import node_cordon
from portal.services.teams import quota_set
from portal.tick import run as tick
from tests.base import World, submit
from tests.browser import test_portal_browser as base

browser, page, world = base.browser, base.page, base.world
login, shot = base.login, base.shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

AXE = Path(__file__).resolve().parent / "axe" / "node_modules" / "axe-core" / "axe.min.js"


def test_an_admin_confirms_with_a_reason_and_finds_it_in_the_audit_log(page, world: World) -> None:  # noqa: ANN001
    jobs = [submit(world.bob, world.vision, count=8, name=f"big-{i}") for i in range(3)]
    tick.run_tick()
    login(page, "bob")
    # Bulk cancel on My jobs: select two, give a reason, confirm.
    page.goto("/")
    for job in jobs[:2]:
        page.check(f"input[name=ids][value='{job.pk}']")
    page.fill("#bulk-cancel-reason", "wrong data set")
    shot(page, "researcher-bulk-cancel")
    page.click("#bulk-cancel button[type=submit]")
    page.wait_for_selector("[data-testid=message]:has-text('Cancelled 2 requests')")
    states = {r.pk: r.state for r in GpuRequest.objects.filter(pk__in=[j.pk for j in jobs])}
    assert [states[j.pk] for j in jobs] == ["cancelled", "cancelled", states[jobs[2].pk]]
    assert states[jobs[2].pk] != "cancelled"
    # One cancel asks first; for one's own request the reason may be left out.
    row = page.locator(f"tr[data-request='{jobs[2].pk}']")
    row.locator("summary").click()
    reason = row.locator("input[name=reason]")
    assert reason.get_attribute("placeholder") == "reason (optional)"
    assert reason.get_attribute("required") is None
    shot(page, "researcher-cancel-confirm")
    row.locator("button:has-text('Confirm cancel')").click()
    page.wait_for_selector(f"[data-testid=message]:has-text('Request #{jobs[2].pk}')")
    assert GpuRequest.objects.get(pk=jobs[2].pk).state == "cancelled"

    # An admin cordons one node with a reason, then two more in bulk.
    page.context.clear_cookies()
    login(page, "dave")
    page.goto("/ops/capacity/")
    node = page.locator(".node[data-node=a100-01]")
    node.locator("summary:has-text('Cordon')").click()
    node.locator("#reason-cordon-" + str(Node.objects.get(name="a100-01").pk)).fill("fan noise")
    shot(page, "admin-cordon-confirm")
    node.locator("button:has-text('Confirm cordon')").click()
    page.wait_for_selector(".node[data-node=a100-01] .badge:has-text('cordoned')")
    more = list(Node.objects.filter(pool__name="l4-shared").order_by("name")[:2])
    for n in more:
        page.check(f"input[name=ids][value='{n.pk}']")
    page.select_option("#bulk-nodes-action", "cordon")
    page.fill("#bulk-nodes-reason", "rack move")
    page.click("#bulk-nodes button[type=submit]")
    page.wait_for_selector("[data-testid=message]:has-text('Cordoned 2 nodes')")
    assert Node.objects.filter(cordoned=True).count() == 3

    # The audit log says it in words, finds it by pool name, and exports what it shows.
    page.goto("/ops/audit/")
    text = page.locator("#audit-log").inner_text()
    assert "cordoned a node: node a100-01 (pool a100-train)" in text
    assert "fan noise" in text and "wrong data set" in text
    page.fill("input[name=q]", "l4-shared")
    page.click("form.filters button[type=submit]")
    page.wait_for_url("**/ops/audit/?*q=l4-shared*")
    page.wait_for_function(
        "document.querySelectorAll('#audit-log tbody tr[data-action]').length === 2"
    )
    shot(page, "admin-audit-in-words")
    with page.expect_download() as info:
        page.click("[data-testid=audit-csv]")
    csv_text = Path(info.value.path()).read_text()
    lines = csv_text.strip().splitlines()
    assert len(lines) == 3 and all("rack move" in line for line in lines[1:])


def _personas(world: World) -> dict[str, str]:
    erin = get_user_model().objects.create_user("erin", password="pw-erin-123")
    erin.groups.add(Group.objects.get_or_create(name="auditors")[0])
    base.PASSWORDS.setdefault("erin", "pw-erin-123")
    return {"admin": "dave", "lead": "alice", "researcher": "bob", "auditor": "erin"}


def _urls(world: World, req: GpuRequest) -> list[str]:
    """Every page a person navigates to (the HTMX partials are parts of these pages)."""
    pool = Pool.objects.get(name="a100-train")
    return [
        "/",
        "/?scope=team",
        "/requests/new/",
        f"/requests/new/?from={req.pk}",
        f"/requests/{req.pk}/",
        f"/requests/{req.pk}/logs/",
        "/me/notifications/",
        "/me/tokens/",
        "/queue/",
        "/decisions/",
        "/teams/",
        f"/teams/{world.vision.pk}/",
        "/ops/overview/",
        "/ops/capacity/",
        f"/ops/capacity/?pool={pool.pk}",
        "/ops/audit/",
        "/ops/audit/?q=a100",
        "/ops/settings/",
        "/ops/tokens/",
        "/no-such-page/",
    ]


def test_an_admin_lands_on_the_overview(page, world: World) -> None:  # noqa: ANN001
    # more than the pool holds: the last ones wait (a submit wakes the tick at once here)
    for i in range(6):
        submit(world.carol, world.nlp, count=8, name=f"long-wait-{i}")
    node_cordon(actor=world.dave, node=Node.objects.get(name="a100-02"), reason="fan")
    login(page, "dave")
    assert page.url.endswith("/ops/overview/")
    page.wait_for_selector("[data-testid=overview-pools] td:has-text('a100-train')")
    assert "long-wait-5" in page.locator("[data-testid=overview-waits]").inner_text()
    assert "a100-02" in page.locator("[data-testid=overview-attention]").inner_text()
    # the admin pages sit in the bar's Admin menu: it is marked, and the page in it is current
    assert page.locator("nav details.menu > summary.on").inner_text() == "Admin"
    assert page.locator("nav a[aria-current=page]").text_content() == "Overview"
    shot(page, "admin-overview")


def test_an_admin_retires_a_team_after_being_told_what_happens(
    page,
    world: World,
    monkeypatch,  # noqa: ANN001
) -> None:
    # no tick: the request stays waiting
    monkeypatch.setattr("portal.services.requests._wake_scheduler", lambda: None)
    waiting = submit(world.carol, world.nlp, count=8, name="nlp-waits")
    login(page, "dave")
    page.goto(f"/teams/{world.nlp.pk}/")
    page.click("#team-retire button")
    assert (
        "1 waiting request(s) are cancelled"
        in page.locator("[data-testid=retire-impact]").inner_text()
    )
    shot(page, "admin-team-retire")
    page.click("button:has-text('Retire team nlp')")
    page.wait_for_url("**/teams/")
    assert "Team nlp retired; 1 waiting request cancelled" in page.content()
    assert "Retired: nlp" in page.locator("main").inner_text()
    world.nlp.refresh_from_db()
    waiting.refresh_from_db()
    assert world.nlp.retired_at is not None and waiting.state == GpuRequest.State.CANCELLED
    # gone from the submit form's teams
    page.goto("/requests/new/")
    assert "nlp" not in page.locator("#id_team option").all_inner_texts()


def _axe(pg) -> list[dict]:  # noqa: ANN001
    pg.add_script_tag(path=str(AXE))
    result = pg.evaluate(
        "async () => (await axe.run(document, {resultTypes: ['violations']})).violations"
    )
    return [v for v in result if v["impact"] in ("serious", "critical")]


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_axe_finds_no_serious_or_critical_violations_on_any_page(
    browser, live_server, world: World, scheme: str
) -> None:  # noqa: ANN001
    assert AXE.exists(), "run scripts/test (npm ci in tests/browser/axe) first"
    req = submit(world.bob, world.vision, count=2, name="axe-check")
    submit(world.carol, world.nlp, count=8, name="waiting")
    tick.run_tick()
    a100 = Pool.objects.get(name="a100-train")
    quota_set(actor=world.dave, team=world.vision, pool=a100, nominal_milli=12000, reason="axe")
    node_cordon(actor=world.dave, node=a100.nodes.first(), reason="axe")
    assert AuditEvent.objects.count() >= 3
    found: dict[str, list[str]] = {}
    walked = 0
    for persona, username in _personas(world).items():
        context = browser.new_context(
            # Playwright evaluates wait_for_function strings and axe with eval, which the portal's
            # CSP refuses; tests/browser/test_csp_browser.py checks the pages under the policy.
            bypass_csp=True,
            base_url=live_server.url,
            viewport={"width": 1400, "height": 900},
            color_scheme=scheme,
        )
        pg = context.new_page()
        pg.set_default_timeout(15_000)
        pg.goto("/accounts/login/")
        for v in _axe(pg):
            found.setdefault(f"{persona} /accounts/login/", []).append(_summary(v))
        login(pg, username)
        for url in _urls(world, req):
            pg.goto(url)
            pg.wait_for_load_state("networkidle")
            walked += 1
            if persona == "admin" and url in (
                "/",
                "/ops/overview/",
                "/ops/capacity/",
                "/ops/audit/",
                "/ops/settings/",
            ):
                shot(pg, f"axe-admin{url.replace('/', '-').rstrip('-') or '-home'}-{scheme}")
            for v in _axe(pg):
                found.setdefault(f"{persona} {url}", []).append(_summary(v))
        context.close()
    assert walked == 4 * len(_urls(world, req))
    assert not found, json.dumps(found, indent=1)


def _summary(v: dict) -> str:
    nodes = "; ".join(" ".join(n["target"]) for n in v["nodes"][:4])
    return f"{v['id']} ({v['impact']}): {v['help']} — {nodes}"
