"""Sign-in behind an authenticating proxy: the trusted header, configured as docs/portal.md says."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client, override_settings

from tests.base import World, make_world

pytestmark = pytest.mark.django_db

AFTER_AUTH = settings.MIDDLEWARE.index("django.contrib.auth.middleware.AuthenticationMiddleware")
PROXIED = {
    "MIDDLEWARE": [
        *settings.MIDDLEWARE[: AFTER_AUTH + 1],
        "portal.auth.trusted_header.TrustedHeaderMiddleware",
        *settings.MIDDLEWARE[AFTER_AUTH + 1 :],
    ],
    "AUTHENTICATION_BACKENDS": [
        "portal.auth.trusted_header.TrustedHeaderBackend",
        "django.contrib.auth.backends.ModelBackend",
    ],
}


@pytest.fixture
def world() -> World:
    return make_world()


@override_settings(**PROXIED)
def test_a_known_user_named_by_the_proxy_is_signed_in_as_themselves(world: World) -> None:
    r = Client().get("/", HTTP_X_FORWARDED_USER=world.alice.username)
    assert r.status_code == 200
    assert r.wsgi_request.user == world.alice


@override_settings(**PROXIED)
def test_an_unknown_user_arrives_with_no_team_and_no_staff_bit(world: World) -> None:
    r = Client().get("/", HTTP_X_FORWARDED_USER="newcomer")
    assert r.status_code == 200
    user = get_user_model().objects.get(username="newcomer")
    assert not user.is_staff and not user.is_superuser
    assert not user.memberships.exists()


@override_settings(**PROXIED)
def test_without_the_header_nobody_is_signed_in(world: World) -> None:
    r = Client().get("/")
    assert r.status_code == 302 and "/login" in r["Location"]


@override_settings(**PROXIED, QM_TRUSTED_USER_HEADER="HTTP_X_AUTH_REQUEST_USER")
def test_the_header_is_the_one_the_settings_name(world: World) -> None:
    assert Client().get("/", HTTP_X_FORWARDED_USER=world.alice.username).status_code == 302
    r = Client().get("/", HTTP_X_AUTH_REQUEST_USER=world.alice.username)
    assert r.status_code == 200 and r.wsgi_request.user == world.alice
