"""Single sign-on: the group map, the sync at each sign-in, the login page and the redirect.

The whole flow against a real provider runs in tests/browser/test_sso_oidc.py; here the
provider's answers (the userinfo claims) are given to the backend directly.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ImproperlyConfigured
from django.test import Client

from portal.auth.sso import GroupMappingBackend
from portal.models import AuditEvent, GpuRequest, Membership
from portal.services.teams import membership_set
from portal.settings import _group_map
from tests.base import World, make_world, submit

pytestmark = pytest.mark.django_db

GROUP_MAP = _group_map(
    "gpu-vision:vision:member,gpu-vision-leads:vision:lead,gpu-nlp:nlp:member,"
    "gpu-ghost:ghost:member,platform-admins:*:admin,platform-auditors:*:auditor"
)
OIDC = {
    "OIDC_ENABLED": True,
    "OIDC_RP_CLIENT_ID": "quartermaster",
    "OIDC_RP_CLIENT_SECRET": "s3cret",
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "https://idp.example.com/auth",
    "OIDC_OP_TOKEN_ENDPOINT": "https://idp.example.com/token",
    "OIDC_OP_USER_ENDPOINT": "https://idp.example.com/me",
    "OIDC_OP_JWKS_ENDPOINT": "https://idp.example.com/jwks",
    "OIDC_GROUP_MAP": GROUP_MAP,
}


@pytest.fixture
def world(settings) -> World:  # noqa: ANN001
    for key, value in OIDC.items():
        setattr(settings, key, value)
    settings.AUTHENTICATION_BACKENDS = [
        *settings.AUTHENTICATION_BACKENDS,
        "portal.auth.sso.GroupMappingBackend",
    ]
    return make_world()


def sign_in(username: str, groups: list[str], monkeypatch) -> object:  # noqa: ANN001
    """What the backend does with the provider's userinfo once the code and id_token check out."""
    backend = GroupMappingBackend()
    claims = {"sub": username, "preferred_username": username, "groups": groups}
    monkeypatch.setattr(backend, "get_userinfo", lambda *a: claims)
    return backend.get_or_create_user("access", "id", {"sub": username})


def roles(user) -> dict[str, tuple[str, str]]:  # noqa: ANN001
    return {
        m.team.name: (m.role, m.source)
        for m in Membership.objects.filter(user=user).select_related("team")
    }


@pytest.mark.parametrize(
    "raw",
    [
        "gpu-a:team-a",  # no role
        "gpu-a:team-a:owner",  # unknown role
        "gpu-a:*:member",  # a team role needs a team
        "admins:team-a:admin",  # a platform role takes *
        "gpu-a::member",
    ],
)
def test_it_refuses_a_bad_group_map(raw: str) -> None:
    with pytest.raises(ImproperlyConfigured, match="OIDC_GROUP_MAP"):
        _group_map(raw)


def test_it_parses_the_group_map() -> None:
    assert _group_map(" gpu-a:team-a:member , admins:*:admin,") == [
        ("gpu-a", "team-a", "member"),
        ("admins", "*", "admin"),
    ]


def test_it_creates_the_user_with_mapped_memberships_and_roles(world: World, monkeypatch) -> None:  # noqa: ANN001
    erin = sign_in("erin", ["gpu-vision", "gpu-vision-leads", "gpu-nlp", "other"], monkeypatch)
    assert erin.username == "erin"
    # Two groups for vision: the higher role wins.
    assert roles(erin) == {"vision": ("lead", "sso"), "nlp": ("member", "sso")}
    assert not erin.is_staff
    events = AuditEvent.objects.filter(action="membership.set", actor_name="sso")
    assert events.count() == 2
    assert events.get(team=world.vision).after == {
        "user": "erin",
        "role": "lead",
        "gpu_cap_milli": None,
        "source": "sso",
    }


def test_it_removes_what_the_groups_no_longer_grant_and_cancels_pending_work(
    world: World, monkeypatch
) -> None:  # noqa: ANN001
    erin = sign_in("erin", ["gpu-vision", "gpu-nlp"], monkeypatch)
    pending = submit(erin, world.nlp, name="erin-nlp")
    kept = submit(erin, world.vision, name="erin-vision")
    again = sign_in("erin", ["gpu-vision"], monkeypatch)
    assert again.pk == erin.pk
    assert roles(erin) == {"vision": ("member", "sso")}
    assert GpuRequest.objects.get(pk=pending.pk).state == "cancelled"
    assert GpuRequest.objects.get(pk=kept.pk).state == "pending"
    removed = AuditEvent.objects.get(action="membership.remove", team=world.nlp)
    assert removed.actor_name == "sso" and removed.after == {"cancelled_requests": 1}
    assert removed.before["user"] == "erin" and removed.before["role"] == "member"


def test_it_leaves_memberships_leads_added_by_hand(world: World, monkeypatch) -> None:  # noqa: ANN001
    # bob was added to vision by hand; his groups name only nlp.
    sign_in("bob", ["gpu-nlp"], monkeypatch)
    assert roles(world.bob) == {"vision": ("member", "manual"), "nlp": ("member", "sso")}
    # Once the provider grants vision too, it manages that membership: losing the group removes it.
    sign_in("bob", ["gpu-nlp", "gpu-vision"], monkeypatch)
    assert roles(world.bob)["vision"] == ("member", "sso")
    sign_in("bob", [], monkeypatch)
    assert roles(world.bob) == {}


def test_it_keeps_a_members_cap_when_the_role_changes(world: World, monkeypatch) -> None:  # noqa: ANN001
    erin = sign_in("erin", ["gpu-vision"], monkeypatch)
    m = Membership.objects.get(user=erin, team=world.vision)
    membership_set(
        actor=world.alice, team=world.vision, user=erin, role="member", gpu_cap_milli=2000
    )
    sign_in("erin", ["gpu-vision-leads"], monkeypatch)
    m.refresh_from_db()
    assert (m.role, m.gpu_cap_milli, m.source) == ("lead", 2000, "sso")


def test_it_skips_teams_that_do_not_exist(world: World, monkeypatch, caplog) -> None:  # noqa: ANN001
    erin = sign_in("erin", ["gpu-ghost"], monkeypatch)
    assert roles(erin) == {}
    assert "ghost" in caplog.text


def test_it_grants_and_takes_back_the_platform_roles(world: World, monkeypatch) -> None:  # noqa: ANN001
    erin = sign_in("erin", ["platform-admins", "platform-auditors"], monkeypatch)
    erin.refresh_from_db()
    assert erin.is_staff and erin.groups.filter(name="auditors").exists()
    sign_in("erin", ["gpu-vision"], monkeypatch)
    erin.refresh_from_db()
    assert not erin.is_staff and not erin.groups.exists()
    changes = AuditEvent.objects.filter(action="user.roles", object_id=str(erin.pk))
    assert [(e.before["admin"], e.after["admin"]) for e in changes.order_by("id")] == [
        (False, True),
        (True, False),
    ]


def test_it_never_demotes_a_superuser(world: World, monkeypatch) -> None:  # noqa: ANN001
    root = get_user_model().objects.create_superuser("root", password="pw-root-123")
    sign_in("root", [], monkeypatch)
    root.refresh_from_db()
    assert root.is_staff and root.is_superuser


def test_it_leaves_platform_roles_alone_when_the_map_names_none(
    world: World, monkeypatch, settings
) -> None:  # noqa: ANN001
    settings.OIDC_GROUP_MAP = _group_map("gpu-vision:vision:member")
    auditors = Group.objects.create(name="auditors")
    world.dave.groups.add(auditors)
    sign_in("dave", ["gpu-vision"], monkeypatch)
    world.dave.refresh_from_db()
    assert world.dave.is_staff and world.dave.groups.filter(pk=auditors.pk).exists()


def test_it_refuses_claims_without_a_username(world: World, monkeypatch) -> None:  # noqa: ANN001
    backend = GroupMappingBackend()
    monkeypatch.setattr(backend, "get_userinfo", lambda *a: {"sub": "x", "groups": ["gpu-vision"]})
    from django.core.exceptions import SuspiciousOperation

    with pytest.raises(SuspiciousOperation):
        backend.get_or_create_user("access", "id", {"sub": "x"})
    assert not get_user_model().objects.filter(username="x").exists()


def test_it_sends_the_browser_to_the_provider_with_a_pkce_challenge(world: World) -> None:
    r = Client().get("/oidc/authenticate/?next=/queue/")
    assert r.status_code == 302
    url = urlparse(r["Location"])
    assert f"{url.scheme}://{url.netloc}{url.path}" == "https://idp.example.com/auth"
    query = parse_qs(url.query)
    assert query["response_type"] == ["code"]
    assert query["client_id"] == ["quartermaster"]
    assert query["code_challenge_method"] == ["S256"]
    assert len(query["code_challenge"][0]) == 43
    assert "groups" in query["scope"][0].split()


def test_a_refused_sign_in_comes_back_to_the_login_page_saying_so(world: World) -> None:
    client = Client()
    r = client.get("/oidc/callback/?error=access_denied&state=whatever")
    assert r.status_code == 302 and r["Location"] == "/accounts/login/?sso=failed"
    assert "Single sign-on did not complete" in client.get(r["Location"]).content.decode()
    assert "_auth_user_id" not in client.session


def test_it_answers_404_for_sso_urls_while_sso_is_off(settings) -> None:  # noqa: ANN001
    settings.OIDC_ENABLED = False
    assert Client().get("/oidc/authenticate/").status_code == 404
    assert Client().get("/oidc/callback/?code=x&state=y").status_code == 404


def test_the_login_page_offers_both_ways_in(world: World) -> None:
    page = Client().get("/accounts/login/?next=/queue/").content.decode()
    assert 'href="/oidc/authenticate/?next=/queue/"' in page
    assert 'name="password"' in page


def test_with_password_login_off_only_sso_is_offered(world: World, settings) -> None:  # noqa: ANN001
    settings.PASSWORD_LOGIN = False
    settings.AUTHENTICATION_BACKENDS = ["portal.auth.sso.GroupMappingBackend"]
    client = Client()
    page = client.get("/accounts/login/").content.decode()
    assert "/oidc/authenticate/" in page and 'name="password"' not in page
    r = client.post("/accounts/login/", {"username": "alice", "password": "pw-alice-123"})
    assert r.status_code == 403
    assert "_auth_user_id" not in client.session
    # Nor does a password get in through the Django admin's login form.
    client.post("/admin/login/", {"username": "dave", "password": "pw-dave-123"})
    assert "_auth_user_id" not in client.session


def test_the_settings_refuse_password_login_off_without_sso(monkeypatch) -> None:  # noqa: ANN001
    import subprocess
    import sys

    env = {"PASSWORD_LOGIN": "false", "PATH": "/usr/bin:/bin"}
    r = subprocess.run(
        [sys.executable, "-c", "import portal.settings"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode != 0
    assert "PASSWORD_LOGIN=false needs single sign-on" in r.stderr
