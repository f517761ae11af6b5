from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from portal.models import AuditEvent, GpuRequest, Pool, Quota
from portal.services.pools import pool_update
from portal.services.requests import gpu_request_cancel
from portal.services.teams import quota_set
from tests.base import make_world, submit

pytestmark = pytest.mark.django_db


def test_it_queues_a_request_and_audits_it() -> None:
    w = make_world()
    req = submit(w.bob, w.vision, count=2)
    assert req.state == GpuRequest.State.PENDING
    assert req.team == w.vision
    event = AuditEvent.objects.get(action="request.submit", object_id=str(req.pk))
    assert event.actor == w.bob and event.team == w.vision


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"env": {"NVIDIA_VISIBLE_DEVICES": "all"}}, "env"),
        ({"env": {"CUDA_VISIBLE_DEVICES": "0"}}, "env"),
        ({"env": {"1BAD": "x"}}, "env"),
        ({"image": "not an image"}, "image"),
        ({"count": 0}, "count"),
        ({"count": 99}, "count"),
        ({"command": ["rm", "-rf", "/"] + [1]}, "command"),
        ({"profile_kind": "mig", "mig_profile": "9g.99gb", "pool_name": "h100-mig"}, "mig_profile"),
        ({"profile_kind": "shared", "milli": 0, "pool_name": "l4-shared"}, "milli"),
        ({"profile_kind": "mig", "mig_profile": "3g.40gb"}, "mig_profile"),
        ({"estimated_runtime_s": -5}, "estimated_runtime_s"),
    ],
)
def test_it_rejects_bad_input_naming_the_field(kwargs: dict[str, object], field: str) -> None:
    w = make_world()
    before = GpuRequest.objects.count(), AuditEvent.objects.count()
    with pytest.raises(ValidationError) as exc:
        submit(w.bob, w.vision, **kwargs)
    assert field in exc.value.message_dict
    assert (GpuRequest.objects.count(), AuditEvent.objects.count()) == before


def test_it_rejects_a_team_the_user_is_not_in() -> None:
    w = make_world()
    with pytest.raises(ValidationError) as exc:
        submit(w.carol, w.vision)
    assert "team" in exc.value.message_dict


def test_it_caps_pending_requests_per_user(settings: object) -> None:
    w = make_world()
    settings.MAX_PENDING_PER_USER = 2  # type: ignore[attr-defined]
    submit(w.bob, w.vision)
    submit(w.bob, w.vision)
    with pytest.raises(ValidationError, match="2 pending"):
        submit(w.bob, w.vision)
    assert GpuRequest.objects.filter(submitted_by=w.bob).count() == 2


def test_it_lets_a_lead_set_quota_within_the_grant_only() -> None:
    w = make_world()
    pool = Pool.objects.get(name="a100-train")
    granted = Quota.objects.get(team=w.vision, pool=pool).granted_milli
    quota_set(actor=w.alice, team=w.vision, pool=pool, nominal_milli=granted - 1000)
    with pytest.raises(ValidationError) as exc:
        quota_set(actor=w.alice, team=w.vision, pool=pool, nominal_milli=granted + 1000)
    assert "nominal_milli" in exc.value.message_dict
    assert Quota.objects.get(team=w.vision, pool=pool).nominal_milli == granted - 1000
    event = AuditEvent.objects.filter(action="quota.set").first()
    assert event is not None
    assert (
        event.before["nominal_milli"] == granted and event.after["nominal_milli"] == granted - 1000
    )


def test_it_lets_only_admins_change_grants() -> None:
    w = make_world()
    pool = Pool.objects.get(name="a100-train")
    with pytest.raises(ValidationError) as exc:
        quota_set(actor=w.alice, team=w.vision, pool=pool, nominal_milli=0, granted_milli=99000)
    assert "granted_milli" in exc.value.message_dict
    quota_set(actor=w.dave, team=w.vision, pool=pool, nominal_milli=20000, granted_milli=20000)
    assert Quota.objects.get(team=w.vision, pool=pool).granted_milli == 20000


def test_it_cancels_a_pending_request_once() -> None:
    w = make_world()
    req = submit(w.bob, w.vision)
    gpu_request_cancel(user=w.bob, gpu_request=req)
    req.refresh_from_db()
    assert req.state == GpuRequest.State.CANCELLED
    with pytest.raises(ValidationError) as exc:
        gpu_request_cancel(user=w.bob, gpu_request=req)
    assert "state" in exc.value.message_dict


def test_it_audits_class_and_pool_edits_and_refuses_unknown_fields() -> None:
    w = make_world()
    pool = Pool.objects.get(name="l4-shared")
    pool_update(actor=w.dave, pool=pool, lifecycle="maintenance")
    assert Pool.objects.get(pk=pool.pk).lifecycle == "maintenance"
    assert AuditEvent.objects.filter(action="pool.update", object_id=str(pool.pk)).exists()
    with pytest.raises(ValidationError) as exc:
        pool_update(actor=w.dave, pool=pool, name="renamed")
    assert "name" in exc.value.message_dict
    with pytest.raises(ValidationError) as exc:
        pool_update(actor=w.dave, pool=pool, lifecycle="bogus")
    assert "lifecycle" in exc.value.message_dict
