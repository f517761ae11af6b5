"""A new site: the admin's checklist on the home page; researchers are told there are no pools."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from portal.models import Membership, Pool
from portal.services.teams import team_create
from tests.base import World, make_world, submit

pytestmark = pytest.mark.django_db


def login(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_an_admin_of_an_empty_site_sees_the_checklist_not_empty_tables() -> None:
    admin = get_user_model().objects.create_user("root", is_staff=True)
    r = login(admin).get("/")
    assert r.status_code == 200
    html = r.content.decode()
    assert 'data-testid="first-run"' in html
    for step in ("Pools", "Workload classes", "Teams and quotas", "A first request"):
        assert step in html
    assert 'id="request-table"' not in html


def test_a_researcher_of_an_empty_site_is_told_to_ask_an_admin() -> None:
    user = get_user_model().objects.create_user("ann")
    team = team_create(actor=None, name="vision")
    Membership.objects.create(user=user, team=team)
    client = login(user)
    home = client.get("/").content.decode()
    assert "No pools yet — ask an admin" in home
    assert 'data-testid="first-run"' not in home
    r = client.get("/requests/new/")
    assert r.status_code == 200
    html = r.content.decode()
    assert "No pools yet — ask an admin." in html
    assert 'id="submit-form"' not in html


def test_the_checklist_goes_once_the_first_request_is_in() -> None:
    w: World = make_world()
    html = login(w.dave).get("/").content.decode()
    # the world has pools, classes and quotas: only the first request is left
    assert 'data-testid="first-run"' in html
    assert html.count("to do") == 1
    submit(w.bob, w.vision)
    html = login(w.dave).get("/").content.decode()
    assert 'data-testid="first-run"' not in html
    assert 'id="request-table"' in html
    assert Pool.objects.exists()
