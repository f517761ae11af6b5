"""Policy knobs in words with their names as hints, and two profiles compared side by side."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from portal.models import PolicyProfile
from portal.services.profiles import policy_profile_create
from scheduling import profile as scheduling_profile
from tests.base import World, make_world

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> World:
    return make_world()


def test_every_knob_has_words_and_the_settings_show_them_with_the_name(world: World) -> None:
    assert all(k.label and k.label != k.name for k in scheduling_profile.KNOBS.values())
    c = Client()
    c.force_login(world.dave)
    page = c.get("/ops/settings/").content.decode()
    # the label in words, then the required mark the form gives every knob
    assert re.search(
        r"Preempt only after waiting \(seconds\)( <span class=\"req\"[^>]*>\*</span>)?</label>",
        page,
    )
    assert "preempt_after_s: An entitled request preempts only after" in page
    assert 'data-testid="profile-compare-link"' in page


def test_it_shows_only_the_knobs_that_differ(world: World) -> None:
    active = PolicyProfile.objects.active_profile()
    other = policy_profile_create(
        actor=world.dave, name="patient", knobs={"preempt_after_s": 1200, "max_reservations": 9}
    )
    same = policy_profile_create(actor=world.dave, name="same", knobs=dict(active.knobs))
    active_row = PolicyProfile.objects.get(active=True)
    c = Client()
    c.force_login(world.dave)
    page = c.get(f"/ops/profiles/compare/?a={active_row.pk}&b={other.pk}").content.decode()
    table = page[page.index('data-testid="profile-diff"') :]
    assert table.count("<tr>") == 3  # the head and two knobs
    assert "Preempt only after waiting" in table and "<code" in table and "preempt_after_s" in table
    assert "<td>1200</td>" in table and "<td>9</td>" in table
    assert "usage_half_life_s" not in table
    page = c.get(f"/ops/profiles/compare/?a={active_row.pk}&b={same.pk}").content.decode()
    assert 'data-testid="profile-diff-none"' in page and "No difference" in page


def test_it_names_the_field_that_is_wrong_and_admits_only_admins_and_auditors(
    world: World,
) -> None:
    pk = PolicyProfile.objects.get(active=True).pk
    c = Client()
    c.force_login(world.dave)
    r = c.get(f"/ops/profiles/compare/?a={pk}&b={pk}")
    assert r.status_code == 400 and "Pick another profile than the first." in r.content.decode()
    r = c.get(f"/ops/profiles/compare/?a={pk}&b=999999")
    assert r.status_code == 400 and 'id="id_b"' in r.content.decode()
    assert c.get("/ops/profiles/compare/").status_code == 200
    bob = Client()
    bob.force_login(world.bob)
    assert bob.get(f"/ops/profiles/compare/?a={pk}&b={pk}").status_code == 403
