"""The form and preview journey, the log tail and My jobs on a phone, in a real browser.

Fixtures (browser, page, world, login, shot) come from test_portal_browser.py.
Run: .venv/bin/pytest tests/browser -m browser
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from portal.models import GpuRequest, SimulatedWorkload
from portal.tick import reconcile
from portal.tick import run as tick
from tests.base import World, submit
from tests.browser import test_portal_browser as base

# The fixtures of test_portal_browser.py, shared by name.
browser, page, world = base.browser, base.page, base.world
login, shot = base.login, base.shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _preview(page) -> str:  # noqa: ANN001
    return page.locator("[data-testid=preview]").inner_text()


def test_the_preview_follows_the_form_and_refuses_what_would_be_rejected(
    page,
    world: World,
    monkeypatch,  # noqa: ANN001
) -> None:
    monkeypatch.setattr("portal.services.requests._wake_scheduler", lambda: None)
    aborted: list[str] = []
    login(page, "bob")
    page.goto("/requests/new/")
    page.evaluate(
        # the pool's request for the profile list; a preview replaced by a newer one (the
        # form's hx-sync="this:replace", when the machine is slow) is aborted by design
        "document.body.addEventListener('htmx:sendAbort', e => { if (e.target.id === 'id_pool')"
        " window.__aborts = (window.__aborts||0)+1; })"
    )
    page.select_option("#id_workload_class", label="training")
    # The pool narrows the profiles: MIG slices only, named for people.
    page.select_option("#id_pool", label="h100-mig")
    # The unfiltered list has the MIG slices too: wait for the swap that drops the rest.
    page.wait_for_function(
        "() => { const o = [...document.querySelectorAll('#id_profile option')]"
        ".map(e => e.textContent);"
        " return o.some(t => t.startsWith('MIG 3g.40gb')) && !o.some(t => t.startsWith('whole GPU')); }"
    )
    labels = page.locator("#id_profile option").all_inner_texts()
    assert not any(label.startswith("whole GPU") for label in labels), labels
    page.select_option("#id_profile", label="MIG 1g.10gb: 1/7 of a GPU, 10 GB")
    page.wait_for_function(
        "document.querySelector('#preview').textContent.includes('fits now on pool h100-mig')"
    )
    aborted.append(page.evaluate("window.__aborts || 0"))
    assert aborted == [0]  # the preview no longer aborts the profile request
    # The ✓ is drawn by CSS, not a glyph a font may lack.
    assert page.locator("#preview .icon.ok").bounding_box()["width"] > 5
    shot(page, "people-preview-fits")

    # 16 whole GPUs in one pod: no node holds them. Said once; Submit goes off.
    page.select_option("#id_pool", label="a100-train")
    page.wait_for_selector("#id_profile option:text('whole GPU')", state="attached")
    page.select_option("#id_profile", label="whole GPU")
    page.fill("#id_count", "16")
    page.dispatch_event("#id_count", "change")
    page.wait_for_function(
        "document.querySelector('#preview').textContent.includes('would be rejected')"
    )
    text = _preview(page)
    assert text.count("rejected") == 1, text
    assert page.locator("#submit-button").is_disabled()
    shot(page, "people-preview-rejected")

    # An invalid field: no verdict stays on show and Submit stays off.
    page.fill("#id_count", "0")
    page.dispatch_event("#id_count", "change")
    page.wait_for_function("document.querySelector('#preview').dataset.outcome === 'invalid'")
    assert "fits now" not in page.locator("#preview").inner_text()
    assert page.locator("#submit-button").is_disabled()

    # Enough GPUs for the queue: it waits, with a spinner that is drawn, not an emoji box.
    for i in range(4):
        submit(world.alice, world.vision, count=8, name=f"held-{i}")
    tick.run_tick()
    page.fill("#id_count", "8")
    page.fill("#id_name", "resnet-browser")
    page.dispatch_event("#id_count", "change")
    page.wait_for_function("document.querySelector('#preview').textContent.includes('would wait')")
    spinner = page.locator("#preview .icon.wait")
    assert spinner.bounding_box()["width"] > 5
    assert page.evaluate(
        "getComputedStyle(document.querySelector('#preview .icon.wait')).animationName"
    ) in ("qm-spin", "none")
    assert not page.locator("#submit-button").is_disabled()
    shot(page, "people-preview-waits")
    page.click("#submit-button")
    page.wait_for_url("**/requests/*/")
    assert "submitted (resnet-browser)" in page.locator("[data-testid=message]").inner_text()
    shot(page, "people-submitted")


def test_the_request_page_follows_the_log_and_shows_events(page, world: World) -> None:  # noqa: ANN001
    req = submit(world.bob, world.vision, name="tail-me", estimated_runtime_s=36_000)
    tick.run_tick()
    time.sleep(1.2)  # the simulated workload starts a moment after it is created
    reconcile.reconcile()
    assert GpuRequest.objects.get(pk=req.pk).state == "running"
    login(page, "bob")
    page.goto(f"/requests/{req.pk}/")
    log = page.locator("[data-testid=log]")
    log.wait_for()
    page.wait_for_function(
        "document.querySelector('[data-testid=log]').textContent.includes('epoch 1 step')"
    )
    # Ten simulated seconds later the panel, polling, shows a later step without a reload.
    w = SimulatedWorkload.objects.get(name=req.attempts.get().workload_name)
    SimulatedWorkload.objects.filter(pk=w.pk).update(
        starts_at=w.starts_at - timedelta(seconds=10), ends_at=w.ends_at - timedelta(seconds=10)
    )
    page.wait_for_function(
        "document.querySelector('[data-testid=log]').textContent.includes('step 10 ')",
        timeout=15_000,
    )
    events = page.locator("[data-testid=events]").inner_text()
    assert "Scheduled" in events and "Started" in events
    href = page.locator("a:text('download the log')").first.get_attribute("href")
    assert href == f"/requests/{req.pk}/logs/download/"
    shot(page, "people-log-tail")


def test_my_jobs_fits_a_phone_with_a_long_name(browser, live_server, world: World) -> None:  # noqa: ANN001
    submit(world.bob, world.vision, name="n" * 100)
    context = browser.new_context(
        # Playwright evaluates wait_for_function strings and axe with eval, which the portal's
        # CSP refuses; tests/browser/test_csp_browser.py checks the pages under the policy.
        bypass_csp=True,
        base_url=live_server.url,
        viewport={"width": 390, "height": 844},
    )
    pg = context.new_page()
    try:
        login(pg, "bob")
        pg.goto("/")
        pg.wait_for_selector("#request-table tbody tr")
        width = pg.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, width  # the table scrolls inside its box; the page does not
        shot(pg, "people-my-jobs-phone")
        pg.goto("/queue/")
        pg.wait_for_selector("#queue-table")
        assert pg.evaluate("document.documentElement.scrollWidth") <= 390
        shot(pg, "people-queue-phone")
        pg.goto("/no-such-page/")
        assert "Nothing here" in pg.inner_text("main")
        shot(pg, "people-404")
    finally:
        context.close()


def test_a_researcher_makes_a_token_on_the_page_uses_it_and_revokes_it(
    page,
    live_server,
    world: World,  # noqa: ANN001
) -> None:
    import httpx

    login(page, "bob")
    page.click("text=API tokens")
    page.fill("#id_name", "laptop")
    page.select_option("#id_scope", "read")
    page.click("text=Create token")
    secret = page.locator("[data-testid=new-token-secret]").input_value()
    assert secret.startswith("qm_")
    shot(page, "token-created")
    api = httpx.Client(base_url=live_server.url, headers={"Authorization": f"Bearer {secret}"})
    assert api.get("/api/v1/requests/").status_code == 200
    # Shown once: gone on the next visit.
    page.reload()
    assert page.locator("[data-testid=new-token-secret]").count() == 0
    assert "laptop" in page.locator("#tokens").inner_text()
    page.click("[aria-label='Revoke token laptop']")
    assert "revoked" in page.locator("[data-testid=message]").inner_text()
    r = api.get("/api/v1/requests/")
    assert r.status_code == 401 and r.headers["content-type"] == "application/problem+json"
