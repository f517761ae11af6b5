"""Idle quota: guaranteed but unused GPU-hours per team and pool, and a guarantee to try."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from portal.models import Attempt, Pool, Quota, UsageRecord, WorkloadClass
from portal.selectors.reports import idle_quota
from tests.base import World, make_world, submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> World:
    return make_world()


def _used(world: World, gpus: int, start_days_ago: float, hours: float | None) -> None:
    """vision held `gpus` GPUs of a100-train from `start_days_ago` for `hours` (None: still)."""
    pool = Pool.objects.get(name="a100-train")
    now = timezone.now()
    req = submit(world.bob, world.vision, count=1)
    start = now - timedelta(days=start_days_ago)
    end = None if hours is None else start + timedelta(hours=hours)
    a = Attempt.objects.create(
        request=req,
        number=1,
        pool=pool,
        workload_name=f"qm-{req.pk}",
        namespace="team-vision",
        gpus_milli=gpus * 1000,
        admitted_at=start,
        started_at=start,
        ended_at=end,
        state="running" if end is None else "succeeded",
    )
    UsageRecord.objects.create(
        attempt=a,
        team=world.vision,
        workload_class=WorkloadClass.objects.get(name="training"),
        pool=pool,
        gpus_milli=gpus * 1000,
        started_at=start,
        ended_at=end,
    )


def test_it_counts_guaranteed_but_unused_gpu_hours_and_suggests_a_guarantee(world: World) -> None:
    Quota.objects.filter(team=world.vision, pool__name="a100-train").update(nominal_milli=8000)
    # 4 GPUs for 2 days, 20 days ago: in the 30 days, not in the 7
    _used(world, 4, 20, 48)
    # 2 GPUs from 10 days ago, still running: 7 days of it in the 7-day window
    _used(world, 2, 10, None)
    # long over, before the 30 days
    _used(world, 8, 40, 24)
    row = next(
        r
        for r in idle_quota()
        if r.quota.team.name == "vision" and r.quota.pool.name == "a100-train"
    )
    assert row.guaranteed_7d == 8 * 7 * 24 and row.guaranteed_30d == 8 * 30 * 24
    assert row.used_7d == pytest.approx(2 * 7 * 24, rel=1e-3)
    assert row.used_30d == pytest.approx(4 * 48 + 2 * 10 * 24, rel=1e-3)
    assert row.idle_7d == pytest.approx(8 * 7 * 24 - 2 * 7 * 24, rel=1e-3)
    # daily means: 4 on two days, 2 on ten, 0 on the rest; the 95th percentile of 30 days is
    # the 29th smallest: 4 GPUs, half the guarantee
    assert row.suggested_gpus == 4
    assert row.whatif == "quota.vision.a100-train=4"


def test_the_page_links_the_suggestion_to_a_prefilled_what_if(
    world: World, django_assert_max_num_queries
) -> None:  # noqa: ANN001
    Quota.objects.filter(team=world.vision, pool__name="a100-train").update(nominal_milli=8000)
    for i in range(5):
        _used(world, 1, 3 + i, 24)
    c = Client()
    c.force_login(world.dave)
    with django_assert_max_num_queries(10):
        page = c.get("/ops/reports/idle-quota/").content.decode()
    table = page[page.index('data-testid="idle-quota"') :]
    assert "vision" in table and "a100-train" in table
    pool = Pool.objects.get(name="a100-train")
    link = f"/ops/whatif/?team={world.vision.pk}&amp;pool={pool.pk}&amp;quota=1"
    assert link in table
    form = c.get(link.replace("&amp;", "&")).content.decode()
    assert f'<option value="{world.vision.pk}" selected>vision</option>' in form
    assert f'<option value="{pool.pk}" selected>a100-train</option>' in form
    assert 'name="quota" value="1"' in form
    bob = Client()
    bob.force_login(world.bob)
    assert bob.get("/ops/reports/idle-quota/").status_code == 403
