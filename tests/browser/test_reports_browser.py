"""The autoscaling page, the rollouts list, the two reports and the notifications list in a
real browser: each loads with what it should show, reached from the menu, and axe-core finds
no serious or critical violation on it. Fixtures come from test_portal_browser.py.
Run: .venv/bin/pytest tests/browser -m browser
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from portal.models import Attempt, NodeProvision, Pool, Rollout
from portal.services.profiles import policy_profile_create
from tests.base import World, submit
from tests.browser import test_admin_browser as admin
from tests.browser import test_portal_browser as base

browser, page, world = base.browser, base.page, base.world
login, shot = base.login, base.shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _seed(world: World) -> None:
    pool = Pool.objects.get(name="a100-train")
    Pool.objects.filter(pk=pool.pk).update(autoscaled=True, min_nodes=1, max_nodes=6)
    req = submit(world.bob, world.vision, count=1, name="finished-early")
    NodeProvision.objects.create(pool=pool, name="qm-ask-1", nodes=2, request_ids=[req.pk])
    Rollout.objects.create(pool=pool, kind="driver", target="550.90", created_by=world.dave)
    end = timezone.now() - timedelta(hours=1)
    Attempt.objects.update_or_create(
        request=req,
        number=1,
        defaults={
            "pool": pool,
            "workload_name": f"qm-{req.pk}",
            "namespace": "team-vision",
            "gpus_milli": 1000,
            "admitted_at": end - timedelta(minutes=20),
            "started_at": end - timedelta(minutes=20),
            "ended_at": end,
            "state": "succeeded",
        },
    )
    req.state = "succeeded"
    req.save(update_fields=["state"])


def test_the_new_pages_load_from_the_menu_and_axe_finds_nothing(page, world: World) -> None:  # noqa: ANN001
    assert admin.AXE.exists(), "run scripts/test (npm ci in tests/browser/axe) first"
    _seed(world)
    found: dict[str, list[str]] = {}

    def check(name: str) -> None:
        page.wait_for_load_state("networkidle")
        shot(page, name)
        for v in admin._axe(page):
            found.setdefault(page.url, []).append(admin._summary(v))

    login(page, "dave")
    page.click("[data-testid=overview-autoscaling]")
    page.wait_for_selector("[data-testid=autoscaling-provisions] td:has-text('qm-ask-1')")
    # the menu is closed: its text, not its rendered (hidden) text
    assert page.locator("[data-testid=admin-menu] a.on").text_content() == "Autoscaling"
    check("admin-autoscaling")
    page.click("[data-testid=admin-menu] > summary")
    page.click("[data-testid=admin-menu] a:has-text('Rollouts')")
    page.wait_for_selector("[data-testid=rollouts] td:has-text('550.90')")
    check("admin-rollouts")
    page.click("[data-testid=admin-menu] > summary")
    page.click("[data-testid=admin-menu] a:has-text('Reports')")
    page.wait_for_selector("[data-testid=estimates] td:has-text('vision')")
    check("admin-report-estimates")
    page.click("[data-testid=report-nav] >> text=idle quota")
    page.wait_for_selector("[data-testid=idle-quota] td:has-text('vision')")
    check("admin-report-idle-quota")
    page.locator("[data-testid=idle-quota] a:has-text('try it in a what-if')").first.click()
    assert page.locator("#id_quota").input_value() == "0"
    assert page.locator("#id_team option:checked").inner_text() in ("nlp", "speech", "vision")
    check("admin-whatif-form")
    # two profiles side by side, from the settings page
    policy_profile_create(actor=world.dave, name="patient", knobs={"preempt_after_s": 1200})
    page.click("[data-testid=admin-menu] > summary")
    page.click("[data-testid=admin-menu] a:has-text('Settings')")
    page.click("[data-testid=profile-compare-link]")
    page.select_option("#id_a", label="patient v1")
    page.select_option("#id_b", index=1)
    page.click("#profile-compare button[type=submit]")
    page.wait_for_selector("[data-testid=profile-diff] td:has-text('Preempt only after waiting')")
    check("admin-profile-compare")

    page.context.clear_cookies()
    login(page, "bob")
    page.click("nav >> text=Notifications")
    page.wait_for_selector("[data-testid=happenings] li:has-text('finished-early')")
    assert page.locator("[data-testid=happenings] li").count() == 2
    assert not page.locator("#id_email").is_checked()
    check("researcher-notifications")
    assert not found, json.dumps(found, indent=1)
