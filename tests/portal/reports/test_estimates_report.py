"""Estimates against reality: per team and class, what submitters estimated against what ran."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from portal.models import Attempt, GpuRequest, Pool
from portal.selectors.reports import estimates_vs_reality
from tests.base import World, make_world, submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> World:
    return make_world()


def _finished(
    world: World, team: str, runs: list[tuple[int, list[int]]], ago_days: int = 1
) -> None:
    """One finished request per (estimate, [minutes each attempt ran])."""
    who = world.bob if team == "vision" else world.carol
    end = timezone.now() - timedelta(days=ago_days)
    pool = Pool.objects.get(name="a100-train")
    for estimate, minutes in runs:
        req = submit(who, getattr(world, team), count=1, estimated_runtime_s=estimate)
        for n, m in enumerate(minutes):
            Attempt.objects.create(
                request=req,
                number=n + 1,
                pool=pool,
                workload_name=f"qm-{req.pk}-{n}",
                namespace="team-x",
                gpus_milli=1000,
                admitted_at=end,
                state="succeeded" if n == len(minutes) - 1 else "preempted",
                started_at=end - timedelta(minutes=m),
                ended_at=end,
            )
        GpuRequest.objects.filter(pk=req.pk).update(state="succeeded")


def test_it_compares_estimates_with_what_ran_per_team_and_class(world: World) -> None:
    # vision estimated an hour each: ran 30 min, 50 min, 90 min (two attempts), 10 min
    _finished(world, "vision", [(3600, [30]), (3600, [50]), (3600, [60, 30]), (3600, [10])])
    _finished(world, "nlp", [(600, [20])])
    # too old for 30 days
    _finished(world, "nlp", [(600, [1])], ago_days=40)
    rows = {r.team: r for r in estimates_vs_reality(30)}
    vision, nlp = rows["vision"], rows["nlp"]
    assert vision.requests == 4 and vision.workload_class == "training"
    assert vision.estimate_median_s == 3600 and vision.actual_median_s == 30 * 60
    assert vision.ratio_median == pytest.approx(0.5) and vision.ratio_p90 == pytest.approx(1.5)
    assert vision.overran == pytest.approx(0.25) and vision.under_a_third == pytest.approx(0.25)
    assert nlp.requests == 1 and nlp.ratio_median == pytest.approx(2.0) and nlp.overran == 1.0
    assert {r.team for r in estimates_vs_reality(90)} == {"vision", "nlp"}
    assert next(r for r in estimates_vs_reality(90) if r.team == "nlp").requests == 2


def test_the_page_reads_it_in_bounded_queries(world: World, django_assert_max_num_queries) -> None:  # noqa: ANN001
    _finished(world, "vision", [(3600, [30])] * 6)
    c = Client()
    c.force_login(world.dave)
    with django_assert_max_num_queries(10):
        page = c.get("/ops/reports/estimates/?days=7").content.decode()
    table = page[page.index('data-testid="estimates"') :]
    assert "vision" in table and "<td>6</td>" in table and "0.50" in table and "0 %" in table
    assert 'href="/ops/reports/estimates/" class="on" aria-current="page">Reports' in page


def test_it_refuses_a_window_it_does_not_offer_and_strangers(world: World) -> None:
    c = Client()
    c.force_login(world.dave)
    r = c.get("/ops/reports/estimates/?days=5")
    assert r.status_code == 400 and "days" in r.content.decode()
    assert (
        "No request finished in the last 30 days"
        in c.get("/ops/reports/estimates/").content.decode()
    )
    bob = Client()
    bob.force_login(world.bob)
    assert bob.get("/ops/reports/estimates/").status_code == 403
