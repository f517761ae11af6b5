"""Retiring a team (issue 29): no new requests, waiting ones cancelled, running work runs on,
its quotas out of the cohort, hidden from pickers, kept for the logs; admins only.

alice leads vision, bob is a member of vision, carol is in nlp, dave is an admin.
"""

from __future__ import annotations

import pytest
from django.test import Client
from django.utils import timezone

from portal import access
from portal.forms.requests import SubmitForm
from portal.forms.settings import WorkloadClassForm
from portal.models import AuditEvent, GpuRequest, Pool, Quota, Team, WorkloadClass
from portal.selectors.teams import team_usage
from portal.services.teams import team_retire
from portal.tick.run import run_tick
from portal.tick.snapshot import build_snapshot
from tests.base import World, make_world, submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> World:
    return make_world()


def client_for(user) -> Client:  # noqa: ANN001
    c = Client()
    c.force_login(user)
    return c


def retire(user, team: Team, body: dict | None = None):  # noqa: ANN001, ANN201
    return client_for(user).delete(
        f"/api/v1/teams/{team.pk}/", body or {}, content_type="application/json"
    )


SUBMIT = {
    "team": "vision",
    "workload_class": "training",
    "pool": "a100-train",
    "profile": "whole",
    "count": 1,
    "image": "registry.example.com/vision/train:1.0",
}


def test_only_admins_retire_a_team(world: World) -> None:
    assert retire(world.alice, world.vision, {"confirm": True}).status_code == 403
    assert retire(world.bob, world.vision, {"confirm": True}).status_code == 403
    # not her team: it does not exist for her
    assert retire(world.carol, world.vision, {"confirm": True}).status_code == 404
    world.vision.refresh_from_db()
    assert world.vision.retired_at is None
    assert not AuditEvent.objects.filter(action="team.retire").exists()


def test_retiring_asks_first_then_cancels_waiting_work_and_running_work_runs_on(
    world: World,
) -> None:
    running = submit(world.bob, world.vision)
    run_tick()
    running.refresh_from_db()
    assert running.state in GpuRequest.ACTIVE_STATES
    waiting = [submit(world.bob, world.vision, count=8) for _ in range(2)]
    for req in waiting:
        req.refresh_from_db()
        assert req.state == GpuRequest.State.PENDING

    r = retire(world.dave, world.vision)
    assert r.status_code == 400, r.content
    assert "2 waiting request(s)" in r.json()["errors"]["confirm"][0]
    assert "1 running request(s)" in r.json()["errors"]["confirm"][0]
    world.vision.refresh_from_db()
    assert world.vision.retired_at is None

    r = retire(world.dave, world.vision, {"confirm": True})
    assert r.status_code == 200, r.content
    assert r.json() == {"running": 1, "cancelled": 2}
    world.vision.refresh_from_db()
    assert world.vision.retired_at is not None
    for req in waiting:
        req.refresh_from_db()
        assert req.state == GpuRequest.State.CANCELLED
    running.refresh_from_db()
    assert running.state in GpuRequest.ACTIVE_STATES
    event = AuditEvent.objects.get(action="team.retire", object_id=str(world.vision.pk))
    assert event.actor == world.dave
    assert event.before == {"retired_at": None}
    assert event.after["retired_at"] is not None
    assert (event.after["running"], event.after["cancelled"]) == (1, 2)
    # kept for the logs: the row, its requests and its audit trail stay
    assert Team.objects.filter(pk=world.vision.pk).exists()
    assert GpuRequest.objects.filter(team=world.vision).count() == 3

    # twice is a clear 400, not a second event
    r = retire(world.dave, world.vision, {"confirm": True})
    assert r.status_code == 400 and "team" in r.json()["errors"]
    assert AuditEvent.objects.filter(action="team.retire").count() == 1


def test_a_retired_team_takes_no_new_requests(world: World) -> None:
    assert retire(world.dave, world.vision, {"confirm": True}).status_code == 200
    r = client_for(world.bob).post("/api/v1/requests/", SUBMIT, content_type="application/json")
    assert r.status_code == 400, r.content
    assert "retired" in str(r.json()["errors"]["team"])
    assert not GpuRequest.objects.filter(team=world.vision).exists()
    # nor new quota: its quotas no longer count
    pool = Pool.objects.get(name="a100-train")
    r = client_for(world.dave).put(
        f"/api/v1/teams/{world.vision.pk}/quotas/{pool.pk}/",
        {"nominal_milli": 1000},
        content_type="application/json",
    )
    assert r.status_code == 400 and "retired" in str(r.json()["errors"]["team"])
    page = client_for(world.dave).get(f"/teams/{world.vision.pk}/").content.decode()
    assert 'id="quota-split"' not in page and 'data-testid="team-retired"' in page


def test_a_retired_team_s_quotas_leave_the_cohort(world: World) -> None:
    snapshot, _ = build_snapshot(timezone.now())
    assert any(q.team == "vision" for q in snapshot.quotas)
    retire(world.dave, world.vision, {"confirm": True})
    snapshot, _ = build_snapshot(timezone.now())
    assert not any(q.team == "vision" for q in snapshot.quotas)
    assert any(q.team == "nlp" for q in snapshot.quotas)
    # the team page counts as the tick does
    assert all(u.quota is None for u in team_usage(world.vision))
    assert any(u.quota is not None for u in team_usage(world.nlp))


def test_a_retired_team_is_hidden_from_pickers_but_its_page_stays(world: World) -> None:
    retire(world.dave, world.vision, {"confirm": True})
    submit_form = SubmitForm(teams=access.teams_for(world.dave))
    assert "vision" not in {t.name for t in submit_form.fields["team"].queryset}
    assert "nlp" in {t.name for t in submit_form.fields["team"].queryset}
    class_form = WorkloadClassForm(instance=WorkloadClass.objects.get(name="inference"))
    assert "vision" not in {t.name for t in class_form.fields["teams"].queryset}
    assert client_for(world.dave).get("/ops/settings/").status_code == 200
    listing = client_for(world.dave).get("/teams/").content.decode()
    assert "Retired:" in listing and "vision" in listing
    r = client_for(world.dave).get(f"/teams/{world.vision.pk}/")
    assert r.status_code == 200
    assert "retired" in r.content.decode()
    r = client_for(world.dave).get("/api/v1/teams/").json()
    rows = r["results"] if isinstance(r, dict) else r
    vision = next(t for t in rows if t["name"] == "vision")
    assert vision["retired_at"] is not None


def test_the_team_page_asks_before_retiring(world: World) -> None:
    submit(world.bob, world.vision, count=8)
    admin = client_for(world.dave)
    page = admin.get(f"/teams/{world.vision.pk}/").content.decode()
    assert f"/teams/{world.vision.pk}/retire/" in page
    assert (
        f"/teams/{world.vision.pk}/retire/"
        not in client_for(world.alice).get(f"/teams/{world.vision.pk}/").content.decode()
    )
    r = admin.post(f"/teams/{world.vision.pk}/retire/", {})
    assert r.status_code == 200
    assert "1 waiting request(s)" in r.content.decode()
    world.vision.refresh_from_db()
    assert world.vision.retired_at is None
    assert (
        client_for(world.alice)
        .post(f"/teams/{world.vision.pk}/retire/", {"confirm": "on"})
        .status_code
        == 403
    )
    r = admin.post(f"/teams/{world.vision.pk}/retire/", {"confirm": "on"})
    assert r.status_code == 302
    world.vision.refresh_from_db()
    assert world.vision.retired_at is not None
    assert GpuRequest.objects.get(team=world.vision).state == GpuRequest.State.CANCELLED


def test_a_retired_team_s_guarantee_becomes_lendable(world: World) -> None:
    """vision keeps its 16 a100-train GPUs for itself (lends none): nlp, at its own 12, may
    not borrow 8 more from a cohort of 4. Once vision is retired, its 16 are lendable."""
    Quota.objects.filter(team=world.vision, pool__name="a100-train").update(lending_limit_milli=0)
    own = [submit(world.carol, world.nlp, count=8), submit(world.carol, world.nlp, count=4)]
    run_tick()
    borrower = submit(world.carol, world.nlp, count=8)
    run_tick()
    for req in own:
        req.refresh_from_db()
        assert req.state in GpuRequest.ACTIVE_STATES
    borrower.refresh_from_db()
    assert borrower.state == GpuRequest.State.PENDING

    team_retire(actor=world.dave, team=world.vision, confirm=True)
    run_tick()
    borrower.refresh_from_db()
    assert borrower.state in GpuRequest.ACTIVE_STATES
