"""Every action says it was done; removing a member asks first and says what it cancels; a
member cancels their own request without typing a reason."""

from __future__ import annotations

import pytest
from django.test import Client

from portal.models import GpuRequest, Membership, Pool
from tests.base import World, make_world, submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> World:
    return make_world()


def _as(user: object) -> Client:
    c = Client()
    c.force_login(user)  # type: ignore[arg-type]
    return c


def _messages(response: object) -> list[str]:
    return [str(m) for m in response.context["messages"]]  # type: ignore[attr-defined]


def test_removing_a_member_asks_first_naming_what_it_cancels(world: World) -> None:
    for _ in range(2):
        submit(world.bob, world.vision, count=8)
    submit(world.bob, world.vision, count=8)
    GpuRequest.objects.update(state=GpuRequest.State.PENDING)
    page = _as(world.alice).get(f"/teams/{world.vision.pk}/").content.decode()
    assert "Remove bob?" in page and "3 pending requests of bob will be cancelled" in page
    ms = Membership.objects.get(user=world.bob, team=world.vision)
    r = _as(world.alice).post(f"/teams/{world.vision.pk}/members/{ms.pk}/remove/", follow=True)
    assert "Removed bob from vision; 3 pending requests cancelled." in _messages(r)


def test_adding_a_member_and_saving_a_quota_say_so(world: World) -> None:
    from django.contrib.auth import get_user_model

    get_user_model().objects.create_user("erin")
    alice = _as(world.alice)
    r = alice.post(f"/teams/{world.vision.pk}/members/add/", {"username": "erin"}, follow=True)
    assert "Added erin to vision." in _messages(r)
    pool = Pool.objects.get(name="a100-train")
    dave = _as(world.dave)
    r = dave.post(
        f"/teams/{world.vision.pk}/quotas/{pool.pk}/",
        {
            f"pool{pool.pk}-nominal": "12",
            f"pool{pool.pk}-borrowing_limit": "4",
            f"pool{pool.pk}-reason": "more work",
        },
        follow=True,
    )
    assert any(m.startswith("Quota of vision in a100-train saved") for m in _messages(r)), (
        _messages(r)
    )


def test_a_member_cancels_their_own_request_without_a_reason(world: World) -> None:
    req = submit(world.bob, world.vision, count=8)
    page = _as(world.bob).get(f"/requests/{req.pk}/").content.decode()
    assert "reason (optional)" in page
    r = _as(world.bob).post(f"/requests/{req.pk}/cancel/", {"reason": ""}, follow=True)
    said = {f"Request #{req.pk} cancelled.", f"Request #{req.pk} is stopping."}
    assert said & set(_messages(r)), _messages(r)
    # someone else's (a lead's cancel) still needs the reason: the confirmation asks again
    other = submit(world.bob, world.vision, count=8)
    before = GpuRequest.objects.get(pk=other.pk).state
    r = _as(world.alice).post(f"/requests/{other.pk}/cancel/", {"reason": ""})
    assert "Say why" in r.content.decode()
    assert GpuRequest.objects.get(pk=other.pk).state == before
