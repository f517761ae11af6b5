"""The token pages: /me/tokens/ for everyone (single sign-on users too), /ops/tokens/ for admins."""

from __future__ import annotations

import importlib
import re

import pytest
from django.apps import apps
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.utils import timezone

from portal.models import AuditEvent, PersonalToken
from tests.base import World, make_world

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> World:
    return make_world()


def signed_in(user) -> Client:  # noqa: ANN001
    c = Client()
    c.force_login(user)
    return c


def test_a_single_sign_on_user_creates_a_token_shown_once_and_uses_it(world: World) -> None:
    # Single sign-on users have no usable password: the page is how they get a token.
    sso = get_user_model().objects.create_user("sam")
    assert not sso.has_usable_password()
    page = signed_in(sso)
    r = page.post("/me/tokens/", {"name": "laptop", "scope": "read", "expires_in_days": 30})
    assert r.status_code == 302
    shown = page.get("/me/tokens/").content.decode()
    secret = re.search(r'data-testid="new-token-secret"', shown) and re.search(
        r'value="(qm_[^"]+)"', shown
    )
    assert secret
    again = page.get("/me/tokens/").content.decode()
    assert secret.group(1) not in again and "laptop" in again
    api = Client(HTTP_AUTHORIZATION=f"Bearer {secret.group(1)}")
    assert api.get("/api/v1/requests/").status_code == 200


def test_the_page_names_the_field_it_refuses(world: World, settings) -> None:  # noqa: ANN001
    settings.PERSONAL_TOKEN_MAX_DAYS = 10
    r = signed_in(world.bob).post(
        "/me/tokens/", {"name": "x", "scope": "read+submit", "expires_in_days": 11}
    )
    assert r.status_code == 400
    assert 'name="expires_in_days"' in r.content.decode()
    assert "10" in r.content.decode() and not PersonalToken.objects.exists()
    r = signed_in(world.bob).post(
        "/me/tokens/", {"name": "x", "scope": "admin", "expires_in_days": 1}
    )
    assert r.status_code == 400 and not PersonalToken.objects.exists()


def test_revoking_on_the_page_is_audited_and_others_cannot(world: World) -> None:
    page = signed_in(world.bob)
    page.post("/me/tokens/", {"name": "ci", "scope": "read", "expires_in_days": 5})
    token = PersonalToken.objects.get(user=world.bob)
    assert (
        signed_in(world.carol).post("/me/tokens/revoke/", {"token_id": token.pk}).status_code == 404
    )
    assert page.post("/me/tokens/revoke/", {"token_id": token.pk}).status_code == 302
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert AuditEvent.objects.filter(action="token.revoke", actor=world.bob).count() == 1


def test_admins_see_and_revoke_every_users_tokens(world: World) -> None:
    signed_in(world.carol).post(
        "/me/tokens/", {"name": "nb", "scope": "read", "expires_in_days": 5}
    )
    token = PersonalToken.objects.get(user=world.carol)
    assert signed_in(world.bob).get("/ops/tokens/").status_code == 403
    admin = signed_in(world.dave)
    page = admin.get("/ops/tokens/?user=carol").content.decode()
    assert "carol" in page and token.prefix in page
    r = admin.post("/me/tokens/revoke/", {"token_id": token.pk, "next": "/ops/tokens/"})
    assert r.status_code == 302 and r["Location"] == "/ops/tokens/"
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_an_auditor_may_create_read_tokens_only(world: World, settings) -> None:  # noqa: ANN001
    from django.contrib.auth.models import Group

    auditor = get_user_model().objects.create_user("erin", password="pw-erin-123")
    auditor.groups.add(Group.objects.get_or_create(name=settings.AUDITOR_GROUP)[0])
    page = signed_in(auditor)
    assert (
        page.post(
            "/me/tokens/", {"name": "a", "scope": "read+submit", "expires_in_days": 5}
        ).status_code
        == 400
    )
    assert (
        page.post("/me/tokens/", {"name": "a", "scope": "read", "expires_in_days": 5}).status_code
        == 302
    )
    assert PersonalToken.objects.get(user=auditor).scope == "read"


def test_old_drf_tokens_become_hashed_personal_tokens(world: World) -> None:
    """The migration keeps a DRF authtoken key working, stored only as its digest."""
    migration = importlib.import_module("portal.migrations.0023_access_tokens")
    key = "0123456789abcdef0123456789abcdef01234567"
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE authtoken_token (key varchar(40) PRIMARY KEY, created timestamp,"
            " user_id integer)"
        )
        now = timezone.now()
        cursor.execute(
            "INSERT INTO authtoken_token VALUES (%s, %s, %s), (%s, %s, %s)",
            [key, now, world.bob.pk, "f" * 40, now, world.dave.pk],
        )

    # What the migration uses of its schema editor (a real one cannot open inside a test's
    # transaction on SQLite).
    class Editor:
        def __init__(self) -> None:
            self.connection = connection

        def execute(self, sql: str) -> None:
            with connection.cursor() as cursor:
                cursor.execute(sql)

    migration.adopt_drf_tokens(apps, Editor())
    assert "authtoken_token" not in connection.introspection.table_names()
    assert {t.user.username: t.scope for t in PersonalToken.objects.all()} == {
        "bob": "read+submit",
        "dave": "admin",
    }
    assert key not in str(list(PersonalToken.objects.values()))
    assert Client(HTTP_AUTHORIZATION=f"Token {key}").get("/api/v1/requests/").status_code == 200
