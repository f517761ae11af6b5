"""The Content-Security-Policy in a real browser: Chromium loads every main page (and uses
htmx on the submit form) with no CSP violation, so the policy forbids inline script without
breaking a page.

Run: .venv/bin/pytest tests/browser/test_csp_browser.py -m browser
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.base import World, make_world, submit
from tests.browser.test_portal_browser import browser, login  # noqa: F401  (fixture)

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PAGES = [
    "/",
    "/requests/new/",
    "/queue/",
    "/decisions/",
    "/teams/",
    "/me/notifications/",
    "/ops/capacity/",
    "/ops/audit/",
    "/ops/settings/",
    "/ops/whatif/",
    "/ops/autoscaling/",
    "/ops/rollouts/",
    "/ops/reports/estimates/",
    "/ops/reports/idle-quota/",
    "/ops/profiles/compare/",
    "/api/docs/",
    "/admin/",
]


@pytest.fixture
def world() -> World:
    return make_world()


@pytest.fixture
def watched(browser: Any, live_server: Any) -> Iterator[tuple[Any, list[str]]]:  # noqa: F811
    """A page, and every CSP violation (console report or securitypolicyviolation event) or
    htmx error."""
    context = browser.new_context(base_url=live_server.url, viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    violations: list[str] = []

    def seen(msg: Any) -> None:
        # htmx reports what it may not do (an eval'd trigger filter, a bad trigger) as errors.
        if "Content Security Policy" in msg.text or msg.text.startswith(
            ("htmx:syntax", "htmx:evalDisallowed")
        ):
            violations.append(f"{page.url}: {msg.text}")

    page.on("console", seen)
    # Runs before the page's own script; an init script is not subject to the page's CSP.
    page.add_init_script(
        "document.addEventListener('securitypolicyviolation', e => console.error("
        "'Content Security Policy violation: ' + e.violatedDirective + ' ' + e.blockedURI));"
    )
    yield page, violations
    context.close()


def test_main_pages_load_without_a_csp_violation(
    watched: tuple[Any, list[str]], world: World
) -> None:
    page, violations = watched
    world.dave.is_superuser = True
    world.dave.save(update_fields=["is_superuser"])
    login(page, "dave")
    for url in PAGES:
        response = page.goto(url)
        assert response is not None and response.status == 200, url
        assert "script-src 'self'" in response.headers["content-security-policy"]
        page.wait_for_load_state("networkidle")
    assert violations == []


def test_htmx_and_the_pages_scripts_run_under_the_policy(
    watched: tuple[Any, list[str]], world: World
) -> None:
    page, violations = watched
    req = submit(world.bob, world.vision, name="csp-check")
    login(page, "bob")
    page.goto("/requests/new/")
    page.select_option("#id_workload_class", label="training")
    page.select_option("#id_pool", label="a100-train")
    # the pool's own request swaps in the profiles it offers
    page.wait_for_selector("#profile-field .help:text('this pool offers')")
    page.wait_for_selector("#id_profile option:text('whole GPU')", state="attached")
    page.select_option("#id_profile", label="whole GPU")
    page.dispatch_event("#id_count", "change")
    # The preview comes through htmx: script from a static file, swapped in by htmx.
    page.locator("[data-testid=preview]").wait_for()
    assert "fits now on pool a100-train" in page.locator("[data-testid=preview]").inner_text()
    page.goto(f"/requests/{req.pk}/")
    page.wait_for_load_state("networkidle")
    # The request table polls (every 3 s, paused by poll.js while a row is ticked).
    with page.expect_request(lambda r: r.headers.get("hx-request") == "true", timeout=8_000):
        page.goto("/")
    assert violations == []
