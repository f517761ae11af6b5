"""Personal access tokens over the API: created once, hashed, scoped, revoked at once."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import pytest
import time_machine
from django.test import Client
from django.utils import timezone

from portal.models import AuditEvent, Membership, PersonalToken
from tests.base import World, api_secret, make_world, submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> World:
    return make_world()


def bearer(secret: str) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {secret}")


def signed_in(user) -> Client:  # noqa: ANN001
    c = Client()
    c.force_login(user)
    return c


def create(client: Client, **body) -> dict:  # noqa: ANN003
    r = client.post("/api/v1/tokens/", {"name": "laptop", **body}, content_type="application/json")
    assert r.status_code == 201, r.content
    return r.json()


def test_it_creates_a_token_whose_secret_is_shown_once_and_stored_hashed(world: World) -> None:
    made = create(signed_in(world.bob), scope="read")
    secret = made["secret"]
    assert secret.startswith("qm_") and len(secret) > 40
    assert made["prefix"] == secret[:11] and made["scope"] == "read"
    assert made["state"] == "active"
    stored = PersonalToken.objects.get(pk=made["id"])
    assert abs((stored.expires_at - timezone.now()) - timedelta(days=90)) < timedelta(minutes=1)
    assert stored.digest == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in str(list(PersonalToken.objects.values()))
    listed = bearer(secret).get("/api/v1/tokens/").json()["results"]
    assert [t["id"] for t in listed] == [made["id"]] and "secret" not in listed[0]


def test_it_accepts_bearer_and_the_older_token_keyword(world: World) -> None:
    secret = api_secret(world.bob)
    assert bearer(secret).get("/api/v1/requests/").status_code == 200
    assert Client(HTTP_AUTHORIZATION=f"Token {secret}").get("/api/v1/requests/").status_code == 200
    assert bearer("qm_" + "x" * 43).get("/api/v1/requests/").status_code == 401


def test_it_notes_the_last_use(world: World) -> None:
    secret = api_secret(world.bob)
    bearer(secret).get("/api/v1/requests/")
    assert PersonalToken.objects.get(user=world.bob).last_used_at is not None


def test_a_revoked_token_answers_401_on_the_next_call(world: World) -> None:
    session = signed_in(world.bob)
    made = create(session)
    client = bearer(made["secret"])
    assert client.get("/api/v1/requests/").status_code == 200
    assert session.delete(f"/api/v1/tokens/{made['id']}/").status_code == 204
    r = client.get("/api/v1/requests/")
    assert r.status_code == 401
    assert "revoked" in r.json()["detail"]
    assert bearer(made["secret"]).get("/api/v1/requests/").status_code == 401


def test_an_expired_token_answers_401(world: World) -> None:
    made = create(signed_in(world.bob), expires_in_days=1)
    with time_machine.travel(timezone.now() + timedelta(days=1, seconds=1)):
        r = bearer(made["secret"]).get("/api/v1/requests/")
    assert r.status_code == 401 and "expired" in r.json()["detail"]


def test_it_refuses_an_expiry_past_the_sites_maximum(world: World, settings) -> None:  # noqa: ANN001
    settings.PERSONAL_TOKEN_MAX_DAYS = 30
    r = signed_in(world.bob).post(
        "/api/v1/tokens/", {"name": "x", "expires_in_days": 31}, content_type="application/json"
    )
    assert r.status_code == 400 and "expires_in_days" in str(r.json())
    r = signed_in(world.bob).post(
        "/api/v1/tokens/", {"scope": "read"}, content_type="application/json"
    )
    assert r.status_code == 400 and "name" in str(r.json())


def test_a_read_token_may_not_change_anything(world: World) -> None:
    secret = api_secret(world.bob, scope="read")
    r = bearer(secret).post(
        "/api/v1/tokens/", {"name": "escalate"}, content_type="application/json"
    )
    assert r.status_code == 403
    assert "scope is read" in r.json()["detail"]
    req = submit(world.bob, world.vision)
    assert bearer(secret).post(f"/api/v1/requests/{req.pk}/cancel/").status_code == 403
    assert bearer(secret).get(f"/api/v1/requests/{req.pk}/").status_code == 200


def test_only_admins_create_admin_scoped_tokens(world: World) -> None:
    r = signed_in(world.bob).post(
        "/api/v1/tokens/", {"name": "x", "scope": "admin"}, content_type="application/json"
    )
    assert r.status_code == 400 and "scope" in str(r.json())
    assert create(signed_in(world.dave), scope="admin")["scope"] == "admin"


def test_an_admins_submit_token_cannot_do_admin_work(world: World) -> None:
    body = {"name": "ops-team", "namespace": "ops-team"}
    narrow = bearer(api_secret(world.dave, scope="read+submit"))
    assert narrow.post("/api/v1/teams/", body, content_type="application/json").status_code == 403
    wide = bearer(api_secret(world.dave, scope="admin"))
    assert wide.post("/api/v1/teams/", body, content_type="application/json").status_code == 201


def test_a_membership_change_counts_on_the_next_call(world: World) -> None:
    req = submit(world.alice, world.vision)
    client = bearer(api_secret(world.bob))
    assert client.get(f"/api/v1/requests/{req.pk}/").status_code == 200
    Membership.objects.filter(user=world.bob, team=world.vision).delete()
    assert client.get(f"/api/v1/requests/{req.pk}/").status_code == 404


def test_create_and_revoke_are_audited(world: World) -> None:
    session = signed_in(world.bob)
    made = create(session)
    session.delete(f"/api/v1/tokens/{made['id']}/")
    events = AuditEvent.objects.filter(object_type="personaltoken", object_id=str(made["id"]))
    assert sorted(e.action for e in events) == ["token.create", "token.revoke"]
    assert all(e.actor == world.bob for e in events)
    assert made["secret"] not in str([(e.before, e.after) for e in events])


def test_an_admin_lists_and_revokes_anyones_tokens(world: World) -> None:
    made = create(signed_in(world.carol))
    admin = bearer(api_secret(world.dave))
    everyone = admin.get("/api/v1/tokens/?all=1").json()["results"]
    assert made["id"] in [t["id"] for t in everyone]
    assert [t["user"] for t in admin.get("/api/v1/tokens/?user=carol").json()["results"]] == [
        "carol"
    ]
    assert admin.delete(f"/api/v1/tokens/{made['id']}/").status_code == 204
    assert bearer(made["secret"]).get("/api/v1/requests/").status_code == 401
    event = AuditEvent.objects.get(action="token.revoke")
    assert event.actor == world.dave


def test_nobody_else_sees_or_revokes_a_users_token(world: World) -> None:
    made = create(signed_in(world.carol))
    bob = bearer(api_secret(world.bob))
    assert bob.get(f"/api/v1/tokens/{made['id']}/").status_code == 404
    assert bob.delete(f"/api/v1/tokens/{made['id']}/").status_code == 404
    assert bob.get("/api/v1/tokens/?all=1").status_code == 403
    assert made["id"] not in [t["id"] for t in bob.get("/api/v1/tokens/").json()["results"]]
    assert PersonalToken.objects.get(pk=made["id"]).revoked_at is None
