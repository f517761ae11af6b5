"""Scheduling profiles: stored, edited by admins (services, API, settings page) with
validation and audit, exactly one active, run by the tick and recorded on its decisions."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.test import Client

from portal.models import AuditEvent, Decision, GpuRequest, PolicyProfile
from portal.services.profiles import (
    policy_profile_activate,
    policy_profile_create,
    policy_profile_ensure,
    policy_profile_update,
)
from portal.tick.run import run_tick
from portal.tick.snapshot import build_snapshot
from scheduling import profile as scheduling_profile
from tests.base import World, api_secret, make_world, submit

#: the version the default profile is stored with (the shipped file's)
SHIPPED_VERSION = scheduling_profile.load().version

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> World:
    return make_world()


def api(user: Any) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {api_secret(user)}")


def active() -> PolicyProfile:
    return PolicyProfile.objects.get(active=True)


# -- services ---------------------------------------------------------------------------


def test_it_stores_the_shipped_profile_active_once() -> None:
    first = policy_profile_ensure()
    assert policy_profile_ensure().pk == first.pk
    assert PolicyProfile.objects.filter(active=True).count() == 1
    shipped = scheduling_profile.load()
    assert (first.name, first.version) == (shipped.name, shipped.version)
    assert first.profile().knobs == shipped.knobs


def test_it_stores_the_shipped_profile_in_an_emptied_database() -> None:
    PolicyProfile.objects.all().delete()
    row = policy_profile_ensure()
    assert row.active and row.name == "default"
    assert AuditEvent.objects.filter(action="profile.activate", object_id=str(row.pk)).exists()


def test_it_audits_a_change_old_to_new_and_bumps_the_version(world: World) -> None:
    row = policy_profile_ensure()
    version = row.version
    row = policy_profile_update(
        actor=world.dave, profile=row, knobs={"preempt_after_s": 60, "max_reservations": 16}
    )
    assert row.version == version + 1
    assert row.knobs["preempt_after_s"] == 60 and row.updated_by == world.dave
    event = AuditEvent.objects.get(action="profile.update", object_id=str(row.pk))
    assert event.actor == world.dave
    # only what changed, old -> new
    assert event.before == {"version": version, "preempt_after_s": 300}
    assert event.after == {"version": version + 1, "preempt_after_s": 60}
    # no change: no new version, no audit
    again = policy_profile_update(actor=world.dave, profile=row, knobs={})
    assert again.version == version + 1
    assert AuditEvent.objects.filter(action="profile.update").count() == 1


@pytest.mark.parametrize(
    ("knobs", "field"),
    [
        ({"preempt_after_s": -1}, "preempt_after_s"),
        ({"escalate_after": "soon"}, "escalate_after"),
        ({"packer": "tetris"}, "packer"),
        ({"bogus_knob": 1}, "bogus_knob"),
    ],
)
def test_it_refuses_bad_knobs_naming_them_and_keeps_the_profile(
    world: World, knobs: dict[str, object], field: str
) -> None:
    row = policy_profile_ensure()
    before = (row.version, dict(row.knobs), AuditEvent.objects.count())
    with pytest.raises(ValidationError) as exc:
        policy_profile_update(actor=world.dave, profile=row, knobs=knobs)
    assert field in exc.value.message_dict
    row.refresh_from_db()
    assert (row.version, row.knobs, AuditEvent.objects.count()) == before


def test_it_keeps_exactly_one_profile_active(world: World) -> None:
    default = policy_profile_ensure()
    tight = policy_profile_create(actor=world.dave, name="tight", knobs={"preempt_after_s": 0})
    assert not tight.active and tight.version == 1
    assert tight.knobs["max_reservations"] == default.knobs["max_reservations"]
    policy_profile_activate(actor=world.dave, profile=tight)
    assert list(PolicyProfile.objects.filter(active=True)) == [tight]
    event = AuditEvent.objects.get(action="profile.activate", object_id=str(tight.pk))
    assert event.before == {"active": str(default)} and event.after == {"active": "tight v1"}
    # the database itself refuses a second active profile
    with pytest.raises(IntegrityError), transaction.atomic():
        PolicyProfile.objects.filter(pk=default.pk).update(active=True)
    with pytest.raises(ValidationError) as exc:
        policy_profile_create(actor=world.dave, name="tight")
    assert "name" in exc.value.message_dict
    with pytest.raises(ValidationError) as exc:
        policy_profile_create(actor=world.dave, name="Not A Name")
    assert "name" in exc.value.message_dict


# -- the tick ---------------------------------------------------------------------------


def test_each_decision_records_the_profile_in_force(world: World) -> None:
    row = policy_profile_ensure()
    first = submit(world.bob, world.vision)
    run_tick()
    decision = Decision.objects.get(request=first, kind="admit")
    assert (decision.profile_name, decision.profile_version) == (row.name, row.version)
    row = policy_profile_update(actor=world.dave, profile=row, knobs={"max_reservations": 2})
    second = submit(world.bob, world.vision)
    run_tick()
    decision = Decision.objects.get(request=second, kind="admit")
    assert (decision.profile_name, decision.profile_version) == ("default", row.version)
    # the decisions of earlier ticks keep the version they were made under
    assert Decision.objects.get(request=first, kind="admit").profile_version == row.version - 1
    # shown in the decision log and the API
    client = Client()
    client.force_login(world.dave)
    page = client.get("/decisions/").content.decode()
    assert f"default v{row.version}" in page and f"default v{row.version - 1}" in page
    rows = api(world.bob).get("/api/v1/decisions/", {"request": second.pk}).json()["results"]
    assert [(d["profile_name"], d["profile_version"]) for d in rows] == [("default", row.version)]


def _fill_for_backfill(world: World) -> GpuRequest:
    """a100-train, 4 nodes of 8: three hold 7 GPUs for 2 hours, one holds 5 for 30 minutes;
    then a 4-GPU request fits nowhere and reserves the node that drains soonest."""
    for _ in range(3):
        submit(world.bob, world.vision, count=7, estimated_runtime_s=7200)
    submit(world.bob, world.vision, count=5, estimated_runtime_s=1800)
    run_tick()
    assert GpuRequest.objects.filter(state="admitted").count() == 4
    return submit(world.bob, world.vision, count=4, estimated_runtime_s=3600)


def test_a_short_request_backfills_ahead_of_a_reserved_big_one(world: World) -> None:
    big = _fill_for_backfill(world)
    # only the reserved node has room for 2 GPUs (3 free)
    short = submit(world.bob, world.vision, count=2, estimated_runtime_s=600)
    long = submit(world.bob, world.vision, count=2, estimated_runtime_s=7200)
    run_tick()
    big.refresh_from_db()
    short.refresh_from_db()
    long.refresh_from_db()
    assert big.state == "pending"
    # ends before the big one can start: admitted on the reserved node
    assert short.state == "admitted", short.status_message
    # would delay the big one: waits
    assert long.state == "pending", long.status_message


def test_the_tick_runs_the_active_profiles_knobs(world: World) -> None:
    # Without reservations (a profile that allows none) nothing holds the node back.
    open_profile = policy_profile_create(
        actor=world.dave, name="no-reservations", knobs={"max_reservations": 0}
    )
    policy_profile_activate(actor=world.dave, profile=open_profile)
    _fill_for_backfill(world)
    long = submit(world.bob, world.vision, count=2, estimated_runtime_s=7200)
    run_tick()
    long.refresh_from_db()
    assert long.state == "admitted"
    assert Decision.objects.get(request=long, kind="admit").profile_name == "no-reservations"


def test_pending_requests_carry_the_estimate_capped_by_the_limit(world: World) -> None:
    plain = submit(world.bob, world.vision, estimated_runtime_s=5400)
    capped = submit(world.bob, world.vision, estimated_runtime_s=7200, max_runtime_s=900)
    snapshot, _ = build_snapshot(plain.created_at)
    runtime = {p.id: p.expected_runtime_ms for p in snapshot.pending}
    assert runtime[str(plain.pk)] == 5400 * 1000
    assert runtime[str(capped.pk)] == 900 * 1000


# -- API --------------------------------------------------------------------------------


def test_the_api_lets_admins_list_create_change_and_activate(world: World) -> None:
    policy_profile_ensure()
    dave = api(world.dave)
    r = dave.get("/api/v1/profiles/")
    assert r.status_code == 200
    [row] = r.json()["results"]
    assert row["name"] == "default" and row["active"] is True
    assert row["preempt_after_s"] == 300 and row["packer"] == "fgd-bestfit"

    r = dave.post(
        "/api/v1/profiles/",
        {"name": "eager", "preempt_after_s": 0},
        content_type="application/json",
    )
    assert r.status_code == 201, r.content
    created = r.json()
    assert created["active"] is False and created["preempt_after_s"] == 0

    url = f"/api/v1/profiles/{created['id']}/"
    r = dave.patch(url, {"max_reservations": 2}, content_type="application/json")
    assert r.status_code == 200, r.content
    assert r.json()["version"] == 2 and r.json()["updated_by"] == "dave"

    r = dave.post(url + "activate/")
    assert r.status_code == 200 and r.json()["active"] is True
    assert active().name == "eager"
    assert dave.get(url).json()["max_reservations"] == 2


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"preempt_after_s": -5}, "preempt_after_s"),
        ({"escalate_after": 2.0}, "escalate_after"),
        ({"max_reservations": "many"}, "max_reservations"),
        ({"packer": "tetris"}, "packer"),
        ({"not_a_knob": 1}, "not_a_knob"),
    ],
)
def test_the_api_answers_400_naming_the_field(
    world: World, body: dict[str, object], field: str
) -> None:
    row = policy_profile_ensure()
    r = api(world.dave).patch(f"/api/v1/profiles/{row.pk}/", body, content_type="application/json")
    assert r.status_code == 400
    assert field in r.json()["errors"]
    row.refresh_from_db()
    assert row.version == SHIPPED_VERSION


def test_the_api_refuses_profiles_to_others(world: World) -> None:
    row = policy_profile_ensure()
    bob = api(world.bob)
    assert bob.get("/api/v1/profiles/").status_code == 403
    assert bob.get(f"/api/v1/profiles/{row.pk}/").status_code == 403
    r = bob.patch(
        f"/api/v1/profiles/{row.pk}/", {"preempt_after_s": 0}, content_type="application/json"
    )
    assert r.status_code == 403
    r = bob.post("/api/v1/profiles/", {"name": "mine"}, content_type="application/json")
    assert r.status_code == 403
    assert bob.post(f"/api/v1/profiles/{row.pk}/activate/").status_code == 403
    row.refresh_from_db()
    assert row.version == SHIPPED_VERSION and PolicyProfile.objects.count() == 1


def test_the_schema_documents_the_knobs(world: World) -> None:
    doc = api(world.dave).get("/api/schema/", {"format": "json"}).json()
    assert {"/api/v1/profiles/", "/api/v1/profiles/{profile_id}/"} <= set(doc["paths"])
    props = doc["components"]["schemas"]["PatchedProfileUpdate"]["properties"]
    assert set(props) == set(scheduling_profile.KNOBS)
    assert props["reserve_min_devices"]["minimum"] == 1


# -- settings page ----------------------------------------------------------------------


def _form_data(row: PolicyProfile, **changes: object) -> dict[str, object]:
    data = {f"pp{row.pk}-{k}": v for k, v in row.profile().knobs.items()}
    data.update({f"pp{row.pk}-{k}": v for k, v in changes.items()})
    return data


def test_the_settings_page_edits_a_profile_one_field_per_knob(world: World) -> None:
    row = policy_profile_ensure()
    client = Client()
    client.force_login(world.dave)
    page = client.get("/ops/settings/").content.decode()
    for knob in scheduling_profile.KNOBS:
        assert f'name="pp{row.pk}-{knob}"' in page
    r = client.post(f"/ops/profiles/{row.pk}/", _form_data(row, reserve_after_s=900))
    assert r.status_code == 302
    row.refresh_from_db()
    assert row.knobs["reserve_after_s"] == 900 and row.version == SHIPPED_VERSION + 1
    assert AuditEvent.objects.filter(action="profile.update", actor=world.dave).exists()


def test_the_settings_page_shows_errors_on_the_form(world: World) -> None:
    row = policy_profile_ensure()
    client = Client()
    client.force_login(world.dave)
    r = client.post(f"/ops/profiles/{row.pk}/", _form_data(row, escalate_after=3))
    assert r.status_code == 400
    form = dict(r.context["profiles"])[row]
    assert "escalate_after" in form.errors
    assert "less than or equal to 1" in r.content.decode()
    row.refresh_from_db()
    assert row.version == SHIPPED_VERSION
    # over HTMX the answer is the profiles section alone, with the same errors
    r = client.post(
        f"/ops/profiles/{row.pk}/", _form_data(row, escalate_after=3), HTTP_HX_REQUEST="true"
    )
    assert r.status_code == 400
    body = r.content.decode()
    assert body.lstrip().startswith('<section id="profiles">') and "escalate_after" in body


def test_the_settings_page_creates_and_activates_profiles(world: World) -> None:
    policy_profile_ensure()
    client = Client()
    client.force_login(world.dave)
    data = {f"pp-new-{k}": v for k, v in scheduling_profile.load().knobs.items()}
    data.update({"pp-new-name": "night", "pp-new-preempt_after_s": 0})
    r = client.post("/ops/profiles/new/", data, HTTP_HX_REQUEST="true")
    assert r.status_code == 200
    night = PolicyProfile.objects.get(name="night")
    assert night.knobs["preempt_after_s"] == 0 and not night.active
    r = client.post(f"/ops/profiles/{night.pk}/activate/")
    assert r.status_code == 302
    assert active().name == "night"


def test_the_profile_pages_are_for_admins_only(world: World) -> None:
    row = policy_profile_ensure()
    client = Client()
    client.force_login(world.alice)
    assert client.post(f"/ops/profiles/{row.pk}/", _form_data(row)).status_code == 403
    assert client.post(f"/ops/profiles/{row.pk}/activate/").status_code == 403
    assert client.post("/ops/profiles/new/", {"pp-new-name": "x"}).status_code == 403
    assert client.get("/ops/settings/", HTTP_HX_REQUEST="true").status_code == 403
    assert PolicyProfile.objects.count() == 1
