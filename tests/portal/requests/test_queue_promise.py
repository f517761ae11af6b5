"""The queue-time promise per class: the selector, `/metrics` and the queue page."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from portal.models import Attempt, GpuRequest
from portal.selectors.queue import promise_by_class
from scheduling.slo import Promise
from tests.base import World, make_world, submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> World:
    return make_world()


def _aged(req: GpuRequest, waited_s: int, admitted: bool) -> None:
    """Make `req` submitted `waited_s` ago, and admitted now if `admitted`."""
    now = timezone.now()
    GpuRequest.objects.filter(pk=req.pk).update(created_at=now - timedelta(seconds=waited_s))
    if admitted:
        Attempt.objects.create(
            request=req,
            number=1,
            pool=req.pool,
            workload_name=f"qm-{req.pk}-1",
            namespace=req.team.namespace,
            gpus_milli=1000,
            admitted_at=now,
        )
        GpuRequest.objects.filter(pk=req.pk).update(state=GpuRequest.State.ADMITTED)


def _interactive(world: World) -> GpuRequest:
    return submit(world.bob, world.vision, cls="interactive")


def make_waits(world: World) -> None:
    """interactive promises 1,800 s (tests.base.CLASSES): kept, broken by 1,800 s when
    admitted, broken by 5,400 s while still pending, and pending within it (not counted)."""
    _aged(_interactive(world), 600, admitted=True)
    _aged(_interactive(world), 3600, admitted=True)
    _aged(_interactive(world), 7200, admitted=False)
    _aged(_interactive(world), 300, admitted=False)
    # submitted 8 days ago: outside the 7-day window
    _aged(_interactive(world), 8 * 86400, admitted=True)


def test_it_counts_admissions_and_pending_requests_past_the_promise(world: World) -> None:
    make_waits(world)
    got = promise_by_class(GpuRequest.objects.all())
    # training promises nothing (max_queue_s 0); inference has no requests
    assert set(got) == {"inference", "interactive"}
    interactive = got["interactive"]
    assert (interactive.requests, interactive.kept) == (3, 1)
    assert interactive.overrun_max_s == pytest.approx(5400, abs=5)
    assert got["inference"] == Promise()


def test_the_exporter_reports_it_per_class(world: World) -> None:
    make_waits(world)
    body = Client().get("/metrics").content.decode()
    ratio = 'quartermaster_queue_promise_attainment_ratio{class="interactive"} 0.333'
    assert ratio in body
    assert 'quartermaster_queue_promise_overrun_max_seconds{class="interactive"} 54' in body
    # all time: the admission after 3,600 s and the one after 8 days
    assert 'quartermaster_queue_promise_broken_total{class="interactive"} 2.0' in body


def test_the_queue_page_shows_attainment_per_class(world: World) -> None:
    make_waits(world)
    c = Client()
    c.force_login(world.bob)
    body = c.get(reverse("portal:queue")).content.decode()
    assert 'data-testid="queue-promise"' in body
    row = body.split('<tr data-class="interactive">')[1].split("</tr>")[0]
    assert "33.3 %" in row and "30 min" in row


def test_the_queue_page_counts_only_what_the_user_may_see(world: World) -> None:
    # carol (nlp) sees none of vision's requests: nothing counted, nothing claimed
    make_waits(world)
    c = Client()
    c.force_login(world.carol)
    body = c.get(reverse("portal:queue")).content.decode()
    row = body.split('<tr data-class="interactive">')[1].split("</tr>")[0]
    assert "<td>0</td>" in row and "%" not in row
