"""Who may change what — Django admin, teams and members, classes, priority."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.test import Client
from rest_framework.test import APIClient

from portal.models import (
    AuditEvent,
    Decision,
    GpuRequest,
    Membership,
    Quota,
    Team,
    WorkloadClass,
)
from portal.services.teams import membership_set
from portal.tick.run import run_tick
from tests.base import make_world, submit

pytestmark = pytest.mark.django_db


def _client(user: Any) -> Client:
    c = Client()
    c.force_login(user)
    return c


def test_django_admin_cannot_change_or_delete_audited_rows() -> None:
    w = make_world()
    w.dave.is_superuser = True
    w.dave.save()
    submit(w.bob, w.vision)
    run_tick()
    admin = _client(w.dave)
    decision = Decision.objects.first()
    quota = Quota.objects.first()
    for model, obj in (
        ("decision", decision),
        ("quota", quota),
        ("membership", Membership.objects.first()),
        ("pool", quota.pool),
        ("workloadclass", WorkloadClass.objects.first()),
        ("device", None),
        ("auditevent", AuditEvent.objects.first()),
        ("team", w.vision),
    ):
        assert admin.get(f"/admin/portal/{model}/").status_code == 200, model
        assert admin.get(f"/admin/portal/{model}/add/").status_code == 403, model
        if obj is None:
            continue
        page = admin.get(f"/admin/portal/{model}/{obj.pk}/change/")
        assert page.status_code == 200 and b'name="_save"' not in page.content, model
        assert admin.post(f"/admin/portal/{model}/{obj.pk}/change/", {}).status_code == 403, model
        if model == "membership":
            continue  # removal goes through services.membership_remove (test_membership.py)
        assert (
            admin.post(f"/admin/portal/{model}/{obj.pk}/delete/", {"post": "yes"}).status_code
            == 403
        ), model
    assert Decision.objects.filter(pk=decision.pk).exists()


def test_priority_is_bounded_by_role_on_the_service_the_form_and_the_api(settings: Any) -> None:
    w = make_world()
    # A member may not jump the queue ...
    with pytest.raises(ValidationError) as exc:
        submit(w.bob, w.vision, priority=100)
    assert "priority" in exc.value.message_dict
    assert "between -100 and 0" in exc.value.message_dict["priority"][0]
    assert submit(w.bob, w.vision, priority=-10).priority == -10
    # ... a lead may, up to the lead bound.
    assert submit(w.alice, w.vision, priority=settings.PRIORITY_MAX_LEAD).priority == 50
    with pytest.raises(ValidationError):
        submit(w.alice, w.vision, priority=settings.PRIORITY_MAX_LEAD + 1)

    api = APIClient()
    api.force_authenticate(w.bob)
    body = {
        "team": "vision",
        "workload_class": "training",
        "pool": "a100-train",
        "image": "registry.example.com/vision/train:1",
        "priority": 100,
    }
    r = api.post("/api/v1/requests/", body, format="json")
    assert r.status_code == 400 and "priority" in r.json()["errors"]
    assert "between -100 and 0" in r.json()["errors"]["priority"][0]

    page = _client(w.bob)
    training = WorkloadClass.objects.get(name="training")
    from portal.models import DeviceProfile, Pool

    form = {
        "team": w.vision.pk,
        "workload_class": training.pk,
        "pool": Pool.objects.get(name="a100-train").pk,
        "profile": DeviceProfile.objects.get(name="whole").pk,
        "count": 1,
        "pods": 1,
        "cpu_milli": 1000,
        "memory_mib": 4096,
        "image": "registry.example.com/vision/train:1",
        "checkpoint_interval_s": 0,
        "max_runtime_s": 0,
        "estimated_runtime_s": 3600,
        "priority": 100,
    }
    before = GpuRequest.objects.count()
    r = page.post("/requests/new/", form)
    assert r.status_code == 400 and b"between -100 and 0" in r.content
    assert GpuRequest.objects.count() == before


def test_a_restricted_class_is_open_only_to_the_teams_admins_list() -> None:
    w = make_world()
    User = get_user_model()
    sam = User.objects.create_user("sam", password="pw-sam-123")
    speech = Team.objects.get(name="speech")
    Membership.objects.create(user=sam, team=speech)
    inference = WorkloadClass.objects.get(name="inference")
    inference.restricted = True
    inference.save()
    inference.teams.set([w.vision, w.nlp])
    with pytest.raises(ValidationError) as exc:
        submit(
            sam,
            speech,
            cls="inference",
            pool_name="h100-mig",
            profile_kind="mig",
            mig_profile="1g.10gb",
        )
    assert "workload_class" in exc.value.message_dict
    api = APIClient()
    api.force_authenticate(sam)
    preview = api.post(
        "/api/v1/requests/preview/",
        {"team": "speech", "workload_class": "inference", "pool": "h100-mig"},
        format="json",
    )
    assert preview.status_code == 200 and preview.json()["outcome"] == "rejected"
    submit(
        w.bob,
        w.vision,
        cls="inference",
        pool_name="h100-mig",
        profile_kind="mig",
        mig_profile="1g.10gb",
    )

    # Admins open it to speech on the settings page; audited.
    admin = _client(w.dave)
    p = f"c{inference.pk}"
    data = {
        f"{p}-band": inference.band,
        f"{p}-preemption": inference.preemption,
        f"{p}-min_runtime_s": inference.min_runtime_s,
        f"{p}-max_queue_s": inference.max_queue_s,
        f"{p}-latency_objective_ms": inference.latency_objective_ms or "",
        f"{p}-inference": "on",
        f"{p}-priority_class_name": inference.priority_class_name,
        f"{p}-description": inference.description,
        f"{p}-restricted": "on",
        f"{p}-teams": [t.pk for t in inference.teams.all()] + [speech.pk],
    }
    r = admin.post(f"/ops/classes/{inference.pk}/", data)
    assert r.status_code == 302, r.content[:2000]
    event = AuditEvent.objects.get(action="class.teams")
    assert "speech" in event.after["teams"] and "speech" not in event.before["teams"]
    submit(
        sam,
        speech,
        cls="inference",
        pool_name="h100-mig",
        profile_kind="mig",
        mig_profile="1g.10gb",
    )


def test_admins_create_teams_and_leads_add_and_remove_members_on_pages() -> None:
    w = make_world()
    # Only admins create teams.
    assert _client(w.alice).post("/teams/new/", {"name": "robotics"}).status_code == 403
    r = _client(w.dave).post("/teams/new/", {"name": "robotics", "display_name": "Robotics"})
    robotics = Team.objects.get(name="robotics")
    assert r.status_code == 302 and robotics.namespace == "qm-robotics"
    assert AuditEvent.objects.filter(action="team.create", object_id=str(robotics.pk)).exists()
    assert _client(w.dave).post("/teams/new/", {"name": "Bad Name"}).status_code == 400

    lead = _client(w.alice)
    # A lead adds carol to vision as a member; an unknown user is a form error.
    assert (
        lead.post(f"/teams/{w.vision.pk}/members/add/", {"username": "nobody"}).status_code == 400
    )
    r = lead.post(f"/teams/{w.vision.pk}/members/add/", {"username": "carol", "role": "lead"})
    assert r.status_code == 302
    m = Membership.objects.get(user=w.carol, team=w.vision)
    assert m.role == "member"  # only admins choose the role
    assert AuditEvent.objects.filter(action="membership.set", object_id=str(m.pk)).exists()
    # A member manages nobody; a lead of another team neither (404 there).
    assert (
        _client(w.bob).post(f"/teams/{w.vision.pk}/members/add/", {"username": "dave"}).status_code
        == 403
    )
    assert _client(w.bob).post(f"/teams/{w.vision.pk}/members/{m.pk}/remove/").status_code == 403

    # Removing bob cancels his pending requests in vision, each audited.
    pending = [submit(w.bob, w.vision) for _ in range(2)]
    bob_m = Membership.objects.get(user=w.bob, team=w.vision)
    r = lead.post(f"/teams/{w.vision.pk}/members/{bob_m.pk}/remove/")
    assert r.status_code == 302
    assert not Membership.objects.filter(pk=bob_m.pk).exists()
    for req in pending:
        req.refresh_from_db()
        assert req.state == GpuRequest.State.CANCELLED and req.status_code == "not-a-member"
    assert AuditEvent.objects.filter(action="request.cancel", team=w.vision).count() == 2
    assert AuditEvent.objects.filter(action="membership.remove", team=w.vision).count() == 1
    # Leads do not remove leads.
    alice_m = Membership.objects.get(user=w.alice, team=w.vision)
    other_lead = _client(w.alice)
    membership_set(actor=w.dave, team=w.vision, user=w.carol, role="lead")
    carol_m = Membership.objects.get(user=w.carol, team=w.vision)
    assert other_lead.post(f"/teams/{w.vision.pk}/members/{carol_m.pk}/remove/").status_code == 403
    assert Membership.objects.filter(pk=alice_m.pk).exists()
