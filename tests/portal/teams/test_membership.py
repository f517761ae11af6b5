"""Membership and the queue: who may hold requests, and what reads may never write.

Kept from coming back: the submit preview built the tick's snapshot, whose member rules
cancelled other people's pending requests outside the tick lock.
"""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from portal.models import AuditEvent, Decision, GpuRequest, Membership, Pool, WorkloadClass
from portal.services.requests import gpu_request_cancel
from portal.services.teams import membership_remove, quota_set
from portal.tick.preview import gpu_request_preview
from portal.tick.run import run_tick
from portal.tick.snapshot import build_snapshot
from tests.base import World, make_world, submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> World:
    return make_world()


def _writes() -> tuple[int, int, list[tuple[int, str, str]]]:
    return (
        Decision.objects.count(),
        AuditEvent.objects.count(),
        sorted(GpuRequest.objects.values_list("id", "state", "status_code")),
    )


def _orphan(world: World) -> GpuRequest:
    """A pending request whose submitter was removed from the team behind the services' back."""
    req = submit(world.bob, world.vision)
    Membership.objects.filter(user=world.bob, team=world.vision).delete()
    return req


def test_the_preview_cancels_nothing_and_writes_nothing(world: World) -> None:
    orphan = _orphan(world)
    Membership.objects.create(user=world.carol, team=world.vision, gpu_cap_milli=0)
    capped = submit(world.carol, world.vision)
    before = _writes()
    preview = gpu_request_preview(
        team=world.vision,
        workload_class=WorkloadClass.objects.get(name="training"),
        pool=Pool.objects.get(name="a100-train"),
        profile_kind="whole",
    )
    assert preview.outcome == "fits"
    assert _writes() == before
    assert GpuRequest.objects.get(pk=orphan.pk).state == "pending"
    assert GpuRequest.objects.get(pk=capped.pk).status_code == "queued"


def test_opening_the_submit_page_and_its_preview_cancels_nothing(world: World) -> None:
    orphan = _orphan(world)
    before = _writes()
    c = Client()
    c.force_login(world.alice)
    assert c.get(reverse("portal:request-submit")).status_code == 200
    data = {
        "team": world.vision.pk,
        "name": "resnet",
        "workload_class": WorkloadClass.objects.get(name="training").pk,
        "pool": Pool.objects.get(name="a100-train").pk,
        "profile": _whole_profile_pk(),
        "count": 1,
        "image": "registry.example.com/vision/train:1.0",
        "command": "python train.py",
        "env": "",
        "checkpoint_interval_s": 0,
        "max_runtime_s": 0,
        "estimated_runtime_s": 3600,
    }
    r = c.post(reverse("portal:request-preview"), data, HTTP_HX_REQUEST="true")
    assert r.status_code == 200 and b"fits now" in r.content
    assert _writes() == before
    assert GpuRequest.objects.get(pk=orphan.pk).state == "pending"


def _whole_profile_pk() -> int:
    from portal.models import DeviceProfile

    return DeviceProfile.objects.filter(kind="whole").order_by("pk").first().pk


def test_building_the_snapshot_writes_nothing(world: World) -> None:
    from django.utils import timezone

    _orphan(world)
    Membership.objects.filter(user=world.alice, team=world.vision).update(gpu_cap_milli=0)
    submit(world.alice, world.vision)
    before = _writes()
    snapshot, _ = build_snapshot(timezone.now())
    assert _writes() == before
    # Members and caps travel to the core as plain data.
    assert ("vision", str(world.alice.pk), 0) in {
        (m.team, m.user, m.cap_milli) for m in snapshot.members or ()
    }
    assert all(p.user for p in snapshot.pending)


def test_membership_remove_cancels_the_members_pending_requests_with_audit(world: World) -> None:
    mine = [submit(world.bob, world.vision), submit(world.bob, world.vision)]
    other = submit(world.alice, world.vision)
    membership = Membership.objects.get(user=world.bob, team=world.vision)
    membership_remove(actor=world.alice, membership=membership)
    assert not Membership.objects.filter(pk=membership.pk).exists()
    for req in mine:
        req.refresh_from_db()
        assert req.state == "cancelled" and req.status_code == "not-a-member"
        assert "no longer a member" in req.end_reason
        assert Decision.objects.filter(request=req, kind="end", code="not-a-member").count() == 1
        assert AuditEvent.objects.filter(
            action="request.cancel", object_id=str(req.pk), actor=world.alice
        ).exists()
    assert AuditEvent.objects.filter(
        action="membership.remove", object_id=str(membership.pk), actor=world.alice
    ).exists()
    assert GpuRequest.objects.get(pk=other.pk).state == "pending"


def test_membership_remove_leaves_admitted_work_running(world: World) -> None:
    running = submit(world.bob, world.vision)
    run_tick()
    membership_remove(
        actor=world.alice, membership=Membership.objects.get(user=world.bob, team=world.vision)
    )
    assert GpuRequest.objects.get(pk=running.pk).state == "admitted"


def test_the_tick_cancels_orphans_under_its_lock_with_audit(world: World) -> None:
    """A membership deleted behind the services' back: the tick, not a read, cancels."""
    orphan = _orphan(world)
    run_tick()
    orphan.refresh_from_db()
    assert orphan.state == "cancelled" and orphan.status_code == "not-a-member"
    assert Decision.objects.filter(request=orphan, kind="end", code="not-a-member").count() == 1
    assert AuditEvent.objects.filter(
        action="request.cancel", object_id=str(orphan.pk), actor=None
    ).exists()


def test_removing_a_member_in_django_admin_goes_through_the_service(world: World) -> None:
    from django.contrib.auth import get_user_model

    req = submit(world.bob, world.vision)
    root = get_user_model().objects.create_superuser("root", password="pw-root-123")
    membership = Membership.objects.get(user=world.bob, team=world.vision)
    c = Client()
    c.force_login(root)
    r = c.post(f"/admin/portal/membership/{membership.pk}/delete/", {"post": "yes"})
    assert r.status_code == 302
    assert not Membership.objects.filter(pk=membership.pk).exists()
    req.refresh_from_db()
    assert req.state == "cancelled" and req.status_code == "not-a-member"
    assert AuditEvent.objects.filter(action="membership.remove", actor=root).exists()


def test_the_team_pages_recent_changes_are_the_teams_not_each_submission(world: World) -> None:
    """A busy team submits many requests a minute: the lead's page keeps its quota,
    membership and other changes in view (submissions have their own lists)."""
    quota_set(
        actor=world.dave,
        team=world.vision,
        pool=Pool.objects.get(name="a100-train"),
        nominal_milli=12000,
        borrowing_limit_milli=4000,
        reason="new project",
    )
    first = submit(world.bob, world.vision, count=1, name="first")
    gpu_request_cancel(user=world.alice, gpu_request=first, reason="wrong image")
    for i in range(25):
        submit(world.bob, world.vision, count=1, name=f"sweep-{i}")
    assert AuditEvent.objects.filter(team=world.vision, action="request.submit").count() == 26
    client = Client()
    client.force_login(world.alice)
    body = client.get(reverse("portal:team-detail", args=[world.vision.pk])).content.decode()
    audit = body.split('id="team-audit"', 1)[1].split("</table>", 1)[0]
    assert 'data-action="quota.set"' in audit
    # a lead's cancel, with its reason, is a change made to the team's work
    assert 'data-action="request.cancel"' in audit and "wrong image" in audit
    assert "submitted a request" not in audit
