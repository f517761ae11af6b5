"""Pages that fit: no page scrolls sideways on a 390 px phone, the menu folds away there, and
at 1440 px My jobs breaks no ID or team name mid-word (element widths are measured)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from portal.models import Pool
from portal.tick import run as tick
from tests.base import World, submit
from tests.browser import test_portal_browser as base

browser, world = base.browser, base.world
login, shot = base.login, base.shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _page(browser, live_server, width: int) -> Iterator[object]:  # noqa: ANN001
    context = browser.new_context(
        base_url=live_server.url, bypass_csp=True, viewport={"width": width, "height": 900}
    )
    pg = context.new_page()
    pg.set_default_timeout(15_000)
    yield pg
    context.close()


@pytest.fixture
def phone(browser, live_server) -> Iterator[object]:  # noqa: ANN001
    yield from _page(browser, live_server, 390)


@pytest.fixture
def desktop(browser, live_server) -> Iterator[object]:  # noqa: ANN001
    yield from _page(browser, live_server, 1440)


def _overflow(pg) -> int:  # noqa: ANN001
    """How far the page scrolls sideways, in CSS pixels."""
    return int(pg.evaluate("() => document.documentElement.scrollWidth - window.innerWidth"))


def _wide_elements(pg) -> list[str]:  # noqa: ANN001
    """The innermost elements that reach past the right edge (what to fix)."""
    return pg.evaluate(
        """() => Array.from(document.querySelectorAll('body *'))
          .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)
          .filter(e => { for (let a = e.parentElement; a; a = a.parentElement) {
              if (['auto', 'scroll', 'hidden'].includes(getComputedStyle(a).overflowX)) return false; }
              return true; })
          .filter(e => !Array.from(e.children).some(
              c => c.getBoundingClientRect().right > window.innerWidth + 1))
          .slice(0, 8)
          .map(e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '')
               + (e.className && typeof e.className === 'string' ? '.' + e.className.split(' ').join('.') : '')
               + ' ' + Math.round(e.getBoundingClientRect().right))"""
    )


def test_no_page_scrolls_sideways_on_a_phone(phone, world: World) -> None:  # noqa: ANN001
    for i in range(3):
        submit(world.bob, world.vision, count=2, name=f"resnet50-imagenet-sweep-{i}")
    tick.run_tick()
    pool = Pool.objects.get(name="a100-train")
    pages = {
        "bob": ["/", "/requests/new/", f"/teams/{world.vision.pk}/", "/queue/"],
        "dave": ["/ops/capacity/", f"/ops/capacity/?pool={pool.pk}", "/ops/overview/"],
    }
    wide: dict[str, tuple[int, list[str]]] = {}
    for user, urls in pages.items():
        phone.context.clear_cookies()
        login(phone, user)
        for url in urls:
            phone.goto(url)
            phone.wait_for_load_state("networkidle")
            shot(phone, f"phone{url.split('?')[0].replace('/', '-').rstrip('-') or '-home'}")
            if (px := _overflow(phone)) > 0:
                wide[url] = (px, _wide_elements(phone))
    assert not wide, wide


def test_the_menu_folds_away_on_a_phone(phone, world: World) -> None:  # noqa: ANN001
    login(phone, "bob")
    menu = phone.locator("header.top nav")
    assert not menu.is_visible()
    phone.locator("header.top button:has-text('Menu')").click()
    assert menu.is_visible()
    phone.locator("nav a:has-text('Queue')").click()
    phone.wait_for_url("**/queue/")


def test_my_jobs_breaks_no_id_or_team_mid_word_at_1440(desktop, world: World) -> None:  # noqa: ANN001
    for i in range(4):
        submit(world.bob, world.vision, count=1, name=f"a-rather-long-job-name-{i}")
    tick.run_tick()
    login(desktop, "bob")
    desktop.goto("/")
    desktop.wait_for_selector("tr[data-request]")
    # a cell whose text wraps is taller than one line: IDs and team names are single words
    # the lines a cell's text takes: one client rectangle per line box of its text
    cells = desktop.evaluate(
        """() => Array.from(document.querySelectorAll('tr[data-request] td')).slice(0, 60)
            .filter(td => /^#?\\d+$|^vision$/.test(td.innerText.trim()))
            .map(td => { const r = document.createRange(); r.selectNodeContents(td);
              const tops = new Set(Array.from(r.getClientRects()).map(x => Math.round(x.top)));
              return {text: td.innerText.trim(), lines: tops.size}; })"""
    )
    assert cells, "no ID or team cells found"
    broken = [c for c in cells if c["lines"] > 1]
    assert not broken, broken
    shot(desktop, "desktop-my-jobs")
