"""The notifications page lists what happened to one's own requests, and leaves email unticked
for an account without an address."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from portal.models import Attempt, NotificationPreference
from portal.selectors import notifications
from portal.tick.run import run_tick
from tests.base import World, make_world, submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> World:
    return make_world()


def _happened(world: World) -> list[int]:
    """bob: one request finished, one failed, one preempted; carol: one of hers started."""
    reqs = [submit(world.bob, world.vision, count=1, name=f"job-{i}") for i in range(3)]
    theirs = submit(world.carol, world.nlp, count=1, name="carols")
    run_tick()
    t0 = timezone.now() - timedelta(hours=3)
    for i, (req, state) in enumerate(zip(reqs, ["succeeded", "failed", "preempted"], strict=True)):
        Attempt.objects.filter(request=req).update(
            started_at=t0 + timedelta(minutes=i),
            ended_at=t0 + timedelta(hours=1, minutes=i),
            state=state,
            end_reason="exited with code 3" if state == "failed" else "",
        )
    Attempt.objects.filter(request=theirs).update(started_at=t0)
    return [r.pk for r in reqs]


def test_it_lists_what_happened_newest_first(world: World, django_assert_max_num_queries) -> None:  # noqa: ANN001
    ids = _happened(world)
    c = Client()
    c.force_login(world.bob)
    with django_assert_max_num_queries(12):
        page = c.get("/me/notifications/").content.decode()
    listed = page[page.index('data-testid="happenings"') : page.index("</ul>")]
    lines = [line for line in listed.split("<li>")[1:]]
    assert len(lines) == 6
    assert "job-2" in lines[0] and "was preempted" in lines[0]
    assert "job-1" in lines[1] and "failed" in lines[1] and "exited with code 3" in lines[1]
    assert "job-0" in lines[2] and "finished" in lines[2]
    assert all("started" in line for line in lines[3:])
    assert f'href="/requests/{ids[0]}/"' in lines[2]
    # nobody else's requests
    assert "carols" not in page


def test_it_pages_and_a_page_is_its_list_alone(world: World, monkeypatch) -> None:  # noqa: ANN001
    _happened(world)
    monkeypatch.setattr(notifications, "PER_PAGE", 4)
    c = Client()
    c.force_login(world.bob)
    part = c.get("/me/notifications/?page=2", HTTP_HX_REQUEST="true").content.decode()
    assert part.lstrip().startswith('<div id="happenings">') and "<html" not in part
    assert part.count("<li>") == 2 and "page 2 of 2 · 6 in all" in part


def test_it_says_so_when_nothing_happened(world: World) -> None:
    c = Client()
    c.force_login(world.bob)
    assert (
        "Nothing has happened to your requests yet" in c.get("/me/notifications/").content.decode()
    )


def test_email_is_not_ticked_without_an_address(world: World) -> None:
    c = Client()
    c.force_login(world.bob)
    assert not world.bob.email
    page = c.get("/me/notifications/").content.decode()
    box = page[page.index('name="email"') - 80 : page.index('name="email"') + 80]
    assert "checked" not in box and "disabled" in box
    assert "add an email address to get email" in page
    # saving leaves it off, whatever is posted
    r = c.post("/me/notifications/", {"email": "on", "on_end": "on", "webhook_format": "auto"})
    assert r.status_code == 302
    assert NotificationPreference.objects.get(user=world.bob).email is False
    world.bob.email = "bob@example.org"
    world.bob.save()
    page = c.get("/me/notifications/").content.decode()
    box = page[page.index('name="email"') - 80 : page.index('name="email"') + 80]
    assert "disabled" not in box
