"""The portal in a real browser: Playwright drives Debian's Chromium against a live server.

Each test saves a full-page screenshot of every main page it visits under test-results/.
Run: .venv/bin/pytest tests/browser -m browser
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from portal.models import GpuRequest, Pool, Quota
from portal.services.nodes import node_cordon
from portal.tick import reconcile
from portal.tick import run as tick
from tests.base import World, make_world, submit

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CHROMIUM = "/usr/bin/chromium"
RESULTS = Path(__file__).resolve().parents[2] / "test-results"
PASSWORDS = {
    "alice": "pw-alice-123",
    "bob": "pw-bob-123",
    "carol": "pw-carol-123",
    "dave": "pw-dave-123",
}


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not Path(CHROMIUM).exists():
        pytest.skip("no /usr/bin/chromium (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        yield b
        b.close()


@pytest.fixture
def world() -> World:
    return make_world()


@pytest.fixture
def page(browser, live_server) -> Iterator[object]:  # noqa: ANN001
    context = browser.new_context(
        # Playwright evaluates wait_for_function strings and axe with eval, which the portal's
        # CSP refuses; tests/browser/test_csp_browser.py checks the pages under the policy.
        bypass_csp=True,
        base_url=live_server.url,
        viewport={"width": 1400, "height": 900},
    )
    pg = context.new_page()
    pg.set_default_timeout(15_000)
    yield pg
    context.close()


def shot(page, name: str) -> None:  # noqa: ANN001
    RESULTS.mkdir(exist_ok=True)
    page.screenshot(path=str(RESULTS / f"{name}.png"), full_page=True)


def login(page, username: str) -> None:  # noqa: ANN001
    page.goto("/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORDS[username])
    page.click("button[type=submit]")
    page.wait_for_url("**/")


def test_a_researcher_submits_and_sees_it_queued_then_running(
    page, world: World, monkeypatch
) -> None:  # noqa: ANN001
    # The test drives the tick itself, as beat would a few seconds later.
    monkeypatch.setattr("portal.services.requests._wake_scheduler", lambda: None)
    login(page, "bob")
    page.goto("/requests/new/")
    page.select_option("#id_workload_class", label="training")
    page.select_option("#id_pool", label="a100-train")
    # Wait for the pool's own request to swap in its profiles: choosing one in the old list
    # races the swap, which then leaves no profile chosen.
    page.wait_for_selector("#profile-field .help:text('this pool offers')")
    page.wait_for_selector("#id_profile option:text('whole GPU')", state="attached")
    page.select_option("#id_profile", label="whole GPU")
    page.fill("#id_name", "resnet-browser")
    page.fill("#id_count", "2")
    page.fill("#id_env", "EPOCHS=3")
    page.dispatch_event("#id_count", "change")
    preview = page.locator("[data-testid=preview]")
    preview.wait_for()
    assert "fits now on pool a100-train" in preview.inner_text()
    shot(page, "researcher-submit")
    page.click("#submit-form button[type=submit]")
    page.wait_for_url("**/requests/*/")
    state = page.locator("[data-testid=state]")
    assert state.inner_text() == "pending"
    assert "queued" in page.locator("[data-testid=reason]").inner_text()
    shot(page, "researcher-request-queued")

    tick.run_tick()
    # The status section polls every 3 s and swaps in the new state without a reload.
    page.wait_for_function(
        "document.querySelector('[data-testid=state]').textContent === 'admitted'"
    )
    time.sleep(1.5)  # the simulated workload starts a moment after it is created
    reconcile.reconcile()
    page.wait_for_function(
        "document.querySelector('[data-testid=state]').textContent === 'running'"
    )
    assert "running on a100-" in page.locator("[data-testid=reason]").inner_text()
    shot(page, "researcher-request-running")

    page.goto("/")
    row = page.locator("tr", has_text="resnet-browser")
    assert "running" in row.inner_text()
    shot(page, "researcher-my-jobs")


def test_a_lead_changes_a_quota_and_sees_it_in_the_audit_log(page, world: World) -> None:  # noqa: ANN001
    submit(world.bob, world.vision, count=4, name="vision-train")
    tick.run_tick()
    login(page, "alice")
    page.click("text=Team")
    page.wait_for_url("**/teams/*/")
    assert "a100-train" in page.locator("#team-usage").inner_text()
    form = page.locator("form.quota-form[data-pool=a100-train]")
    form.locator("input[name$=-nominal]").fill("12")
    form.locator("input[name$=-borrowing_limit]").fill("2")
    form.locator("input[name$=-reason]").fill("a new project")
    form.locator("button[type=submit]").click()
    page.wait_for_selector("#team-audit tr[data-action='quota.set']")
    audit = page.locator("#team-audit").inner_text()
    assert "alice" in audit and "guaranteed: 16 GPUs → 12 GPUs" in audit
    assert "a new project" in audit
    q = Quota.objects.get(team=world.vision, pool__name="a100-train")
    assert (q.nominal_milli, q.borrowing_limit_milli) == (12000, 2000)
    # Beyond what admins granted: the form says why, nothing changes.
    form = page.locator("form.quota-form[data-pool=a100-train]")
    form.locator("input[name$=-nominal]").fill("40")
    form.locator("input[name$=-reason]").fill("more")
    form.locator("button[type=submit]").click()
    page.wait_for_selector("text=were granted to vision")
    shot(page, "lead-team-page")


def test_an_admin_filters_decisions_and_sees_the_capacity_map(page, world: World) -> None:  # noqa: ANN001
    for i in range(5):
        submit(world.bob, world.vision, count=8, name=f"big-{i}")
    submit(
        world.carol,
        world.nlp,
        pool_name="h100-mig",
        profile_kind="mig",
        mig_profile="3g.40gb",
        cls="inference",
    )
    submit(
        world.carol,
        world.nlp,
        pool_name="l4-shared",
        profile_kind="shared",
        milli=500,
        gpu_memory_mib=10240,
        cls="interactive",
    )
    tick.run_tick()
    node_cordon(actor=world.dave, node=Pool.objects.get(name="l4-shared").nodes.last())
    login(page, "dave")

    page.goto("/decisions/")
    assert page.locator("#decision-log tbody tr").count() >= 7
    shot(page, "admin-decisions")
    page.select_option("select[name=kind]", "wait")
    page.click("#decision-filters button[type=submit]")
    page.wait_for_url("**/decisions/?*kind=wait*")
    page.wait_for_function(
        "[...document.querySelectorAll('#decision-log tbody tr td:nth-child(2)')].every(td => td.textContent.trim() === 'wait')"
    )
    assert (
        page.locator("#decision-log tbody tr").count()
        == GpuRequest.objects.filter(state="pending").count()
    )
    shot(page, "admin-decisions-filtered")

    page.click("[data-testid=admin-menu] > summary")
    page.click("[data-testid=admin-menu] a:has-text('Capacity')")
    page.wait_for_selector("#capacity-map .cell.allocated")
    assert page.locator(".node[data-node=a100-01] .cell.allocated").count() == 8
    assert (
        page.locator(".cell.fragmented").count() >= 1
    )  # the MIG and shared slices next to used ones
    assert page.locator(".cell.cordoned").count() >= 1
    shot(page, "admin-capacity")

    page.goto("/queue/")
    assert page.locator("#queue-table tbody tr").count() >= 1
    shot(page, "admin-queue")
    page.goto("/ops/audit/")
    assert "cordoned a node" in page.locator("#audit-log").inner_text()
    shot(page, "admin-audit")
    page.goto("/ops/settings/")
    shot(page, "admin-settings")


def test_the_request_form_loads_without_htmx_or_console_errors(page, world: World) -> None:  # noqa: ANN001
    """Its trigger `from:#submit-form input[type=number]` was an htmx:syntax:error: a selector
    with a space must be in parentheses."""
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    # counted from the first parse of the page's triggers on
    page.add_init_script(
        "window.__syntax = 0; document.addEventListener("
        "'htmx:syntax:error', () => window.__syntax++, true)"
    )
    login(page, "bob")
    page.goto("/requests/new/")
    page.select_option("#id_workload_class", label="training")
    page.select_option("#id_pool", label="a100-train")
    page.wait_for_selector("#profile-field .help:text('this pool offers')")
    page.wait_for_selector("#id_profile option:text('whole GPU')", state="attached")
    page.select_option("#id_profile", label="whole GPU")
    # with the syntax error, no trigger of the form worked and no preview came
    page.locator("[data-testid=preview]").wait_for(state="attached")
    assert page.evaluate("() => window.__syntax") == 0
    assert not errors, errors


def test_a_form_button_is_disabled_while_its_request_is_in_flight(page, world: World) -> None:  # noqa: ANN001
    # What the button is a moment after the submit, noted where it outlives the page.
    page.add_init_script(
        "document.addEventListener('submit', e => setTimeout(() => {"
        " const b = e.target.querySelector('button[type=submit], button:not([type])');"
        " sessionStorage.setItem('qm-disabled', b ? String(b.disabled) : 'none'); }, 50), true)"
    )
    login(page, "alice")
    held: list = []
    # the save is held here: it stays in flight until the test answers it (204: the page stays)
    page.route("**/members/**", lambda route: held.append(route))
    page.goto(f"/teams/{world.vision.pk}/")
    page.locator("form[action*='/members/'] button:has-text('Save')").first.click(
        no_wait_after=True
    )
    page.wait_for_timeout(500)
    assert held, "the save was not sent"
    for route in held:
        route.fulfill(status=204)
    page.wait_for_timeout(200)
    assert page.evaluate("() => sessionStorage.getItem('qm-disabled')") == "true"
