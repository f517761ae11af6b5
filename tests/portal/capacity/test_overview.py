"""The admins' overview: where the platform needs a person, and admins land on it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from portal.models import GpuRequest, Node, WorkloadClass
from portal.services.nodes import node_cordon
from portal.tick import run as tick
from tests.base import World, make_world, submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> World:
    return make_world()


def test_it_shows_pools_the_longest_wait_against_its_promise_and_nodes(world: World) -> None:
    WorkloadClass.objects.filter(name="training").update(max_queue_s=1800)
    late = submit(world.bob, world.vision, count=8, name="too-long")
    GpuRequest.objects.filter(pk=late.pk).update(created_at=timezone.now() - timedelta(hours=2))
    node_cordon(actor=world.dave, node=Node.objects.get(name="a100-03"), reason="fan noise")
    c = Client()
    c.force_login(world.dave)
    page = c.get("/ops/overview/").content.decode()
    assert 'data-testid="overview-pools"' in page and "a100-train" in page
    assert "too-long" in page and "1 past the class promise" in page and "2 h" in page
    assert "a100-03</a>" in page and "cordoned" in page


def test_admins_land_on_it_and_others_may_not_read_it(world: World) -> None:
    c = Client()
    r = c.post("/accounts/login/", {"username": "dave", "password": "pw-dave-123"})
    assert r.status_code == 302 and r["Location"] == "/ops/overview/"
    r = Client().post("/accounts/login/", {"username": "bob", "password": "pw-bob-123"})
    assert r["Location"] == "/"
    bob = Client()
    bob.force_login(world.bob)
    assert bob.get("/ops/overview/").status_code == 403
    assert bob.get("/ops/overview/", HTTP_HX_REQUEST="true").status_code == 403


def test_its_refresh_is_the_body_alone(world: World) -> None:
    submit(world.bob, world.vision, count=1)
    tick.run_tick()
    c = Client()
    c.force_login(world.dave)
    part = c.get("/ops/overview/", HTTP_HX_REQUEST="true").content.decode()
    assert part.lstrip().startswith('<div id="overview-body"') and "<html" not in part
