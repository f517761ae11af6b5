"""Team management over the API: admins create teams; leads add, cap and remove members.

alice leads vision, bob is a member of vision, carol is in nlp, dave is an admin.
"""

from __future__ import annotations

import pytest
from django.test import Client

from portal.models import AuditEvent, GpuRequest, Membership, Team
from tests.base import World, make_world, submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> World:
    return make_world()


def client_for(user) -> Client:  # noqa: ANN001
    c = Client()
    c.force_login(user)
    return c


def post(client: Client, url: str, data: dict) -> object:
    return client.post(url, data, content_type="application/json")


def test_admins_create_teams_audited(world: World) -> None:
    r = post(client_for(world.dave), "/api/v1/teams/", {"name": "robotics", "weight": 2})
    assert r.status_code == 201, r.content
    team = Team.objects.get(name="robotics")
    assert r.json() == {
        "id": team.pk,
        "name": "robotics",
        "display_name": "robotics",
        "namespace": "qm-robotics",
        "weight": 2,
        "retired_at": None,
    }
    event = AuditEvent.objects.get(action="team.create", object_id=str(team.pk))
    assert event.actor == world.dave


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"name": "vision"}, "name"),  # taken
        ({"name": "Not A Slug"}, "name"),
        ({"name": "ok", "namespace": "qm-vision"}, "namespace"),  # vision's namespace
        ({"name": "ok", "weight": 0}, "weight"),
        ({"name": "ok", "nodeName": "x"}, "nodeName"),
        ({}, "name"),
    ],
)
def test_it_refuses_a_bad_team_naming_the_field(world: World, data: dict, field: str) -> None:
    before = Team.objects.count()
    r = post(client_for(world.dave), "/api/v1/teams/", data)
    assert r.status_code == 400 and field in r.json()["errors"], r.content
    assert Team.objects.count() == before


def test_only_admins_create_teams(world: World) -> None:
    for user in (world.alice, world.bob):
        assert post(client_for(user), "/api/v1/teams/", {"name": "x"}).status_code == 403
    assert not Team.objects.filter(name="x").exists()


def test_a_lead_adds_a_member_audited(world: World) -> None:
    url = f"/api/v1/teams/{world.vision.pk}/members/"
    r = post(client_for(world.alice), url, {"username": "carol", "gpu_cap_milli": 2000})
    assert r.status_code == 201, r.content
    m = Membership.objects.get(user=world.carol, team=world.vision)
    assert r.json() == {
        "id": m.pk,
        "username": "carol",
        "role": "member",
        "gpu_cap_milli": 2000,
        "source": "manual",
        "holding_milli": 0,
        "pending": 0,
    }
    events = AuditEvent.objects.filter(action="membership.set", object_id=str(m.pk)).order_by("id")
    assert [(e.actor, e.before, e.after["gpu_cap_milli"]) for e in events][0] == (
        world.alice,
        None,
        None,
    )
    assert events.last().before["gpu_cap_milli"] is None
    assert events.last().after["gpu_cap_milli"] == 2000
    listed = client_for(world.bob).get(url).json()
    assert {row["username"] for row in listed["results"]} == {"alice", "bob", "carol"}


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"username": "nobody"}, "username"),
        ({"username": "bob"}, "username"),  # already in vision
        ({"username": "carol", "role": "lead"}, "role"),  # leads add members only
        ({"username": "carol", "role": "owner"}, "role"),
        ({"username": "carol", "gpu_cap_milli": -1}, "gpu_cap_milli"),
        ({"username": "carol", "team": "nlp"}, "team"),
    ],
)
def test_it_refuses_a_bad_member_naming_the_field(world: World, data: dict, field: str) -> None:
    before = sorted(Membership.objects.values_list("id", "team_id", "role"))
    r = post(client_for(world.alice), f"/api/v1/teams/{world.vision.pk}/members/", data)
    assert r.status_code == 400 and field in r.json()["errors"], r.content
    assert sorted(Membership.objects.values_list("id", "team_id", "role")) == before


def test_a_lead_sets_a_members_cap_audited_old_to_new(world: World) -> None:
    m = Membership.objects.get(user=world.bob, team=world.vision)
    url = f"/api/v1/teams/{world.vision.pk}/members/{m.pk}/"
    alice = client_for(world.alice)
    r = alice.patch(url, {"gpu_cap_milli": 4000}, content_type="application/json")
    assert r.status_code == 200 and r.json()["gpu_cap_milli"] == 4000
    r = alice.patch(url, {"gpu_cap_milli": 1500}, content_type="application/json")
    event = AuditEvent.objects.filter(action="membership.set", object_id=str(m.pk)).first()
    assert (event.actor, event.before["gpu_cap_milli"], event.after["gpu_cap_milli"]) == (
        world.alice,
        4000,
        1500,
    )
    # A lead does not change roles; an admin does.
    r = alice.patch(url, {"role": "lead"}, content_type="application/json")
    assert r.status_code == 400 and "role" in r.json()["errors"]
    r = client_for(world.dave).patch(url, {"role": "lead"}, content_type="application/json")
    assert r.status_code == 200 and r.json()["role"] == "lead"
    # Clearing the cap.
    r = client_for(world.dave).patch(url, {"gpu_cap_milli": None}, content_type="application/json")
    assert r.json()["gpu_cap_milli"] is None


def test_a_lead_removes_a_member_and_their_pending_requests_are_cancelled(world: World) -> None:
    pending = submit(world.bob, world.vision, name="bob-pending")
    m = Membership.objects.get(user=world.bob, team=world.vision)
    r = client_for(world.alice).delete(f"/api/v1/teams/{world.vision.pk}/members/{m.pk}/")
    assert r.status_code == 200 and r.json() == {"cancelled_requests": 1}
    assert not Membership.objects.filter(pk=m.pk).exists()
    assert GpuRequest.objects.get(pk=pending.pk).state == "cancelled"
    event = AuditEvent.objects.get(action="membership.remove", object_id=str(m.pk))
    assert event.actor == world.alice and event.before["user"] == "bob"


def test_only_admins_remove_a_lead(world: World) -> None:
    m = Membership.objects.get(user=world.alice, team=world.vision)
    url = f"/api/v1/teams/{world.vision.pk}/members/{m.pk}/"
    assert client_for(world.alice).delete(url).status_code == 403
    assert Membership.objects.filter(pk=m.pk).exists()
    assert client_for(world.dave).delete(url).status_code == 200


def test_a_lead_of_one_team_cannot_touch_another(world: World) -> None:
    """alice leads vision: nlp's members are out of reach by API and page, partials included."""
    carol = Membership.objects.get(user=world.carol, team=world.nlp)
    bob = Membership.objects.get(user=world.bob, team=world.vision)
    alice = client_for(world.alice)
    nlp = world.nlp.pk
    before = sorted(Membership.objects.values_list("id", "role", "gpu_cap_milli"))
    answers = [
        post(alice, f"/api/v1/teams/{nlp}/members/", {"username": "bob"}).status_code,
        alice.get(f"/api/v1/teams/{nlp}/members/").status_code,
        alice.patch(
            f"/api/v1/teams/{nlp}/members/{carol.pk}/",
            {"gpu_cap_milli": 0},
            content_type="application/json",
        ).status_code,
        alice.delete(f"/api/v1/teams/{nlp}/members/{carol.pk}/").status_code,
        # nlp's membership through vision's URL
        alice.delete(f"/api/v1/teams/{world.vision.pk}/members/{carol.pk}/").status_code,
        alice.post(f"/teams/{nlp}/members/{carol.pk}/remove/").status_code,
        alice.post(f"/teams/{world.vision.pk}/members/{carol.pk}/remove/").status_code,
        alice.post(f"/teams/{nlp}/members/add/", {"username": "bob"}).status_code,
        alice.post(
            f"/teams/{nlp}/members/{carol.pk}/",
            {f"m{carol.pk}-gpu_cap": "1"},
            HTTP_HX_REQUEST="true",
        ).status_code,
    ]
    assert set(answers) == {404}, answers
    # A member of vision is no lead: 403.
    bob_client = client_for(world.bob)
    assert (
        bob_client.delete(f"/api/v1/teams/{world.vision.pk}/members/{bob.pk}/").status_code == 403
    )
    assert sorted(Membership.objects.values_list("id", "role", "gpu_cap_milli")) == before


def test_the_schema_documents_the_team_operations(world: World) -> None:
    schema = client_for(world.bob).get("/api/schema/?format=json").json()
    paths = schema["paths"]
    assert "post" in paths["/api/v1/teams/"]
    members = paths["/api/v1/teams/{team_id}/members/"]
    assert {"get", "post"} <= set(members)
    member = paths["/api/v1/teams/{team_id}/members/{membership_id}/"]
    assert {"get", "patch", "delete"} <= set(member)
    assert "400" in member["patch"]["responses"] and "403" in member["delete"]["responses"]
