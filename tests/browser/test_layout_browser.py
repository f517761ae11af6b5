"""Pages that fit: no page scrolls sideways on a 390 px phone, the menu folds away there, and
at 1440 px My jobs breaks no ID or team name mid-word; at 1280 px My jobs fits its box with
a reason column wide enough to read, and the queue's tables stand apart under their captions
(element widths and gaps are measured)."""

from __future__ import annotations

import datetime
import itertools
from collections.abc import Iterator

import pytest
from django.utils import timezone

from portal.models import GpuRequest, Pool
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
        "bob": [
            "/",
            "/requests/new/",
            f"/teams/{world.vision.pk}/",
            f"/teams/{world.vision.pk}/history/",
            "/queue/",
        ],
        "dave": [
            "/ops/capacity/",
            f"/ops/capacity/?pool={pool.pk}",
            "/ops/overview/",
            f"/pools/{pool.pk}/history/",
        ],
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


def _admin_pages(world: World) -> dict[str, list[str]]:
    """The admin pages added for issue 34, each with rows to show, and who opens them; Bob
    has jobs in every state (the screenshots of test_forms_browser.py reuse this)."""
    from portal.models import PolicyProfile, WhatIfRun
    from portal.services.profiles import policy_profile_create
    from portal.services.requests import gpu_request_cancel
    from tests.browser.test_forms_browser import _failed_request
    from tests.browser.test_reports_browser import _seed

    failed = _failed_request(world)
    # Bob's jobs in every state: one runs, big ones wait, one is cancelled, one failed.
    submit(world.bob, world.vision, count=2, name="resnet50-imagenet-sweep")
    for i in range(4):
        submit(world.bob, world.vision, count=8, name=f"llama-7b-finetune-{i}")
    dropped = submit(world.bob, world.vision, count=1, name="superseded-run")
    gpu_request_cancel(user=world.bob, gpu_request=dropped)
    tick.run_tick()
    _seed(world)
    policy_profile_create(actor=world.dave, name="patient", knobs={"preempt_after_s": 1200})
    a, b = PolicyProfile.objects.order_by("pk").values_list("pk", flat=True)[:2]
    row = {"requests": 10, "wait_p50_s": 600, "wait_p95_s": 7200, "wait_max_s": 7200,
           "utilization_pct": 70.0, "preemptions": 2, "gpu_hours_lost": 0.0, "never_started": 0}  # fmt: skip
    better = {**row, "wait_p50_s": 300, "wait_p95_s": 3900}
    run = WhatIfRun.objects.create(
        days=3, state="done", changes={"quota.vision.a100-train": "24"},
        result={"current": row, "proposed": better,
                "teams": {"vision": {"current": row, "proposed": better}}},
    )  # fmt: skip
    return {
        "dave": [
            "/ops/autoscaling/",
            "/ops/rollouts/",
            "/ops/reports/idle-quota/",
            "/ops/reports/estimates/",
            f"/ops/profiles/compare/?a={a}&b={b}",
            "/ops/whatif/",
            f"/ops/whatif/{run.pk}/",
            f"/requests/{failed.pk}/",
        ],
        "bob": ["/me/notifications/"],
    }


def _names_broken(pg) -> list[dict]:  # noqa: ANN001
    """Cells of one word (a name, an ID, a pool) whose text takes more than one line: the
    line boxes of its text nodes (an inline-block badge's own box would count twice). A
    td.parts (a GPU model) may wrap at its hyphens."""
    return pg.evaluate(
        """() => Array.from(document.querySelectorAll('main td:not(.parts)'))
            .filter(td => td.offsetParent && td.innerText.trim() && !/\\s/.test(td.innerText.trim()))
            .map(td => { const tops = new Set();
              const walk = document.createTreeWalker(td, NodeFilter.SHOW_TEXT);
              for (let n = walk.nextNode(); n; n = walk.nextNode()) { if (!n.textContent.trim()) continue;
                const r = document.createRange(); r.selectNodeContents(n);
                for (const x of r.getClientRects()) if (x.width > 0) tops.add(Math.round(x.top)); }
              return {text: td.innerText.trim(), lines: tops.size}; })
            .filter(c => c.lines > 1)"""
    )


def test_the_admin_pages_fit_a_phone_and_break_no_name_at_1440(phone, world: World) -> None:  # noqa: ANN001
    pages = _admin_pages(world)
    wide: dict[str, object] = {}
    broken: dict[str, object] = {}
    names = 0
    for user, urls in pages.items():
        phone.context.clear_cookies()
        login(phone, user)
        for url in urls:
            for width in (390, 1440):
                phone.set_viewport_size({"width": width, "height": 900})
                phone.goto(url)
                phone.wait_for_load_state("networkidle")
                if width == 390:
                    px = phone.evaluate(
                        "() => document.scrollingElement.scrollWidth - window.innerWidth"
                    )
                    if px > 0:
                        wide[url] = (px, _wide_elements(phone))
                    if url.startswith("/requests/"):
                        # the attempts and events tables keep their key columns only
                        hidden = phone.locator("main table .secondary")
                        assert hidden.count() >= 4
                        assert not any(c.is_visible() for c in hidden.all())
                        assert phone.locator("[data-testid=attempts] td").first.is_visible()
                else:
                    names += phone.locator("td.pool, td.team, td.class, td.id").count()
                    if found := _names_broken(phone):
                        broken[url] = found
    assert not wide, wide
    assert not broken, broken
    assert names > 10  # the pages had rows to measure


def _bobs_jobs(world: World) -> None:
    """Bob's jobs with long reasons (borrowing, over quota) and names as long as sweeps get:
    four run, filling the pool, and one waits."""
    submit(world.bob, world.vision, count=2, name="resnet50-imagenet-sweep")
    for i in range(4):
        submit(world.bob, world.vision, count=8, name=f"llama-7b-finetune-{i}")
    tick.run_tick()


def _tables(pg, selector: str) -> list[dict]:  # noqa: ANN001
    """Each table under `selector`, in page order: its caption and its box (caption included)."""
    return pg.evaluate(
        """(sel) => Array.from(document.querySelectorAll(sel)).map(t => {
            const r = t.getBoundingClientRect();
            return {caption: t.caption ? t.caption.innerText.trim() : '', top: r.top, bottom: r.bottom}; })""",
        selector,
    )


def test_the_queue_tables_stand_apart_each_under_its_caption(desktop, world: World) -> None:  # noqa: ANN001
    # the summary, the queue-time promise (the test world's classes promise one) and the list
    _bobs_jobs(world)
    login(desktop, "bob")
    for width in (1280, 390):
        desktop.set_viewport_size({"width": width, "height": 900})
        desktop.goto("/queue/")
        desktop.wait_for_selector("#queue-table tr[data-request]")
        tables = _tables(desktop, "#queue-table table")
        assert len(tables) == 3, tables
        assert all(t["caption"] for t in tables), tables
        # visible space (.75rem at least) between one table's last row and the next caption
        gaps = [round(b["top"] - a["bottom"]) for a, b in itertools.pairwise(tables)]
        assert min(gaps) >= 12, (width, gaps)
        shot(desktop, f"queue-{width}")


def test_the_queue_breaks_no_number_class_or_pool_mid_word_at_1280(desktop, world: World) -> None:  # noqa: ANN001
    # A laptop's width: the reason column takes the room, the one-word columns keep theirs,
    # with reasons and waits as long as a busy pool gives them.
    _bobs_jobs(world)
    for i in range(3):
        submit(world.bob, world.vision, count=8, name=f"llama-7b-finetune-more-{i}")
    waiting = GpuRequest.objects.filter(state=GpuRequest.State.PENDING)
    assert waiting.count() >= 3
    waiting.update(
        created_at=timezone.now() - datetime.timedelta(hours=3, minutes=46),
        status_message=(
            "waiting: no node in pool a100-train has 8 whole GPUs free right now; "
            "a100-01 is held back for it"
        ),
    )
    login(desktop, "bob")
    desktop.set_viewport_size({"width": 1280, "height": 800})
    desktop.goto("/queue/")
    desktop.wait_for_selector("#queue-table tr[data-request]")
    assert not _names_broken(desktop)
    assert desktop.locator("#queue-table tr[data-request] td.class").count() > 0


def test_my_jobs_wraps_the_why_column_within_its_box(desktop, world: World) -> None:  # noqa: ANN001
    _bobs_jobs(world)
    login(desktop, "bob")
    measure = """() => { const t = document.querySelector('table.jobs'), box = t.parentElement;
        const why = Array.from(t.querySelectorAll('tbody td.why')).map(td => {
          const r = document.createRange(); r.selectNodeContents(td);
          const tops = new Set(Array.from(r.getClientRects()).map(x => Math.round(x.top)));
          return {width: td.getBoundingClientRect().width, lines: tops.size}; });
        return {over: t.getBoundingClientRect().right - box.getBoundingClientRect().right,
                scrolls: box.scrollWidth - box.clientWidth,
                page: document.scrollingElement.scrollWidth - window.innerWidth, why}; }"""
    for width, why_min in ((1280, 14 * 16), (1440, 11 * 16), (390, 10 * 16)):
        desktop.set_viewport_size({"width": width, "height": 900})
        desktop.goto("/")
        desktop.wait_for_selector("tr[data-request] td.why")
        got = desktop.evaluate(measure)
        assert got["page"] <= 0, (width, got)
        # a reason has room for a few words a line, and its longest one takes several lines
        assert min(w["width"] for w in got["why"]) >= why_min - 1, (width, got)
        assert max(w["lines"] for w in got["why"]) > 1, (width, got)
        if width >= 1280:
            # on a desktop the whole table fits: nothing to scroll sideways inside its box
            assert got["over"] <= 1 and got["scrolls"] <= 1, (width, got)
        shot(desktop, f"my-jobs-{width}")
