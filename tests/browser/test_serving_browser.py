"""A serving workload's page in a real browser: live request-path charts, rollover."""

from __future__ import annotations

import time

import pytest
from django.test import override_settings

from portal.backends import serving_replicas
from portal.models import SimulatedWorkload
from portal.services import serving_samples as serving_metrics
from portal.tick.run import run_tick
from tests.base import World, submit
from tests.browser import test_portal_browser as portal_browser
from tests.browser.test_portal_browser import login, shot

# The portal browser tests' fixtures: one Chromium for the module, a page on the live server.
browser = portal_browser.browser
page = portal_browser.page
world = portal_browser.world

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_serving_panel_draws_live_charts_and_rolls_over(
    page, world: World, monkeypatch
) -> None:  # noqa: ANN001
    monkeypatch.setattr("portal.services.requests._wake_scheduler", lambda: None)
    with override_settings(SIMULATED_SERVING_WARMUP_S=0.2, SIMULATED_SERVING_RPS=6):
        try:
            req = submit(
                world.bob,
                world.vision,
                cls="inference",
                pool_name="h100-mig",
                profile_kind="mig",
                mig_profile="1g.10gb",
                pods=2,
                kind="serving",
                model_name="llama",
                model_revision="r1",
                runtime="vllm",
                command=[],
                name="chat",
            )
            run_tick()
            for _ in range(4):
                time.sleep(1)
                serving_metrics.sample_serving()
            login(page, "bob")
            page.goto(f"/requests/{req.pk}/")
            panel = page.locator("#serving-panel svg")
            panel.first.wait_for()
            assert panel.count() == 5
            assert page.locator("#serving-panel polyline").count() >= 4
            assert "Health:" in page.locator("[data-testid=health]").inner_text()
            shot(page, "serving-panel")
            page.fill("input[name=model_revision]", "r2")
            page.click("text=Roll over")
            page.wait_for_url(f"**/requests/{req.pk}/")
            page.locator("[data-testid=revision]").wait_for()
            assert page.locator("[data-testid=revision]").inner_text() == "r2"
        finally:
            for spec in SimulatedWorkload.objects.values_list("spec", flat=True):
                serving_replicas.stop(spec.get("serving"))
