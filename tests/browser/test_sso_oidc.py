"""Single sign-on end to end: Chromium, the portal and a real OpenID provider on loopback.

The provider is the certified `oidc-provider` npm package (tests/browser/oidc/provider.mjs),
installed with `npm ci` from its package-lock.json (scripts/test does it; so does this
module when node_modules/ is missing). It requires PKCE of every client, so a sign-in
that completes proves the portal sent a code challenge and its verifier. The user
signs in on the provider's own login and consent pages; the portal maps their groups
(OIDC_GROUP_MAP) to memberships; a second sign-in with other groups removes one.

Also here, with password logins: a lead manages members on the team page, and an
auditor reads the admin pages without a button that changes anything. Screenshots
of each page go to test-results/.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote_plus

import pytest
import requests
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from portal.models import AuditEvent, GpuRequest, Membership
from portal.services.nodes import node_cordon
from portal.settings import _group_map
from tests.base import make_world, submit
from tests.browser import test_portal_browser as base

# The one Chromium fixture, shared by name with test_portal_browser.py.
browser = base.browser

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

RESULTS = Path(__file__).resolve().parents[2] / "test-results"
PROVIDER_DIR = Path(__file__).resolve().parent / "oidc"
CLIENT_ID, CLIENT_SECRET = "quartermaster", "browser-test-secret"
GROUP_MAP = "gpu-vision:vision:member,gpu-vision-leads:vision:lead,gpu-nlp:nlp:member"


def npm_ci() -> None:
    """Install the provider's packages from package-lock.json, once per checkout."""
    if (PROVIDER_DIR / "node_modules" / "oidc-provider" / "package.json").exists():
        return
    npm = shutil.which("npm")
    assert npm, "the single sign-on test needs Node.js and npm (scripts/services installs them)"
    subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=PROVIDER_DIR,
        check=True,
        timeout=300,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def provider(live_server, tmp_path: Path, settings) -> Iterator[dict]:  # noqa: ANN001
    """The provider on a free loopback port, and the portal's settings pointing at it."""
    npm_ci()
    port = free_port()
    issuer = f"http://127.0.0.1:{port}"
    accounts = tmp_path / "accounts.json"
    accounts.write_text("{}")
    env = {
        **os.environ,
        "PORT": str(port),
        "CLIENT_ID": CLIENT_ID,
        "CLIENT_SECRET": CLIENT_SECRET,
        "REDIRECT_URI": f"{live_server.url}/oidc/callback/",
        "ACCOUNTS_FILE": str(accounts),
    }
    proc = subprocess.Popen(
        [shutil.which("node") or "node", "provider.mjs"],
        cwd=PROVIDER_DIR,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline, line = time.monotonic() + 30, ""
        while time.monotonic() < deadline and "listening" not in line:
            ready, _, _ = select.select([proc.stdout], [], [], 0.5)
            if ready:
                line = proc.stdout.readline()  # type: ignore[union-attr]
                assert line or proc.poll() is None, "the OpenID provider exited"
        assert "listening" in line, "the OpenID provider did not start"
        settings.OIDC_ENABLED = True
        settings.OIDC_RP_CLIENT_ID = CLIENT_ID
        settings.OIDC_RP_CLIENT_SECRET = CLIENT_SECRET
        settings.OIDC_OP_AUTHORIZATION_ENDPOINT = f"{issuer}/auth"
        settings.OIDC_OP_TOKEN_ENDPOINT = f"{issuer}/token"
        settings.OIDC_OP_USER_ENDPOINT = f"{issuer}/me"
        settings.OIDC_OP_JWKS_ENDPOINT = f"{issuer}/jwks"
        settings.OIDC_RP_SIGN_ALGO = "RS256"
        settings.OIDC_PROVIDER_NAME = "Test IdP"
        settings.OIDC_GROUP_MAP = _group_map(GROUP_MAP)
        settings.AUTHENTICATION_BACKENDS = [
            *settings.AUTHENTICATION_BACKENDS,
            "portal.auth.sso.GroupMappingBackend",
        ]
        yield {"issuer": issuer, "accounts": accounts}
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def shot(page, name: str) -> None:  # noqa: ANN001
    RESULTS.mkdir(exist_ok=True)
    page.screenshot(path=str(RESULTS / f"{name}.png"), full_page=True)


def new_page(browser, live_server) -> object:  # noqa: ANN001
    context = browser.new_context(
        # Playwright evaluates wait_for_function strings and axe with eval, which the portal's
        # CSP refuses; tests/browser/test_csp_browser.py checks the pages under the policy.
        bypass_csp=True,
        base_url=live_server.url,
        viewport={"width": 1400, "height": 900},
    )
    page = context.new_page()
    page.set_default_timeout(20_000)
    return page


def sso_login(page, provider: dict, login: str, screenshots: str = "") -> None:  # noqa: ANN001
    """Through the portal's button and the provider's login and consent pages, back home."""
    page.goto("/accounts/login/")
    if screenshots:
        shot(page, f"{screenshots}-portal-login")
    page.click("[data-testid=sso-login]")
    page.wait_for_url(f"{provider['issuer']}/interaction/**", wait_until="domcontentloaded")
    page.fill("input[name=login]", login)
    page.fill("input[name=password]", "any-password")
    if screenshots:
        shot(page, f"{screenshots}-provider-login")
    page.click("button[type=submit]")
    page.wait_for_selector("text=Continue")
    if screenshots:
        shot(page, f"{screenshots}-provider-consent")
    page.click("button[type=submit]")
    # The provider redirects to /oidc/callback/, which signs in and redirects home.
    page.wait_for_selector("header.top form.logout")


def set_groups(provider: dict, **groups: list[str]) -> None:
    provider["accounts"].write_text(json.dumps({k: {"groups": v} for k, v in groups.items()}))


def roles(username: str) -> dict[str, tuple[str, str]]:
    return {
        m.team.name: (m.role, m.source)
        for m in Membership.objects.filter(user__username=username).select_related("team")
    }


def test_sso_signs_in_with_pkce_maps_groups_and_a_second_sign_in_removes_a_membership(
    browser, live_server, provider, monkeypatch
) -> None:  # noqa: ANN001
    monkeypatch.setattr("portal.services.requests._wake_scheduler", lambda: None)
    world = make_world()
    set_groups(provider, erin=["gpu-vision-leads", "gpu-nlp", "unmapped"])
    # The provider refuses an authorization request without a PKCE challenge, so the
    # sign-in below completing means the portal sent one (and the verifier after it).
    refused = requests.get(
        f"{provider['issuer']}/auth",
        params={
            "client_id": CLIENT_ID,
            "response_type": "code",
            "scope": "openid",
            "redirect_uri": f"{live_server.url}/oidc/callback/",
            "state": "no-pkce",
        },
        allow_redirects=False,
        timeout=10,
    )
    assert refused.status_code in (302, 303)
    assert "error=invalid_request" in refused.headers["Location"]
    assert "requires PKCE" in unquote_plus(refused.headers["Location"])

    page = new_page(browser, live_server)
    sso_login(page, provider, "erin", screenshots="sso")
    assert page.locator("header.top .logout span").inner_text().startswith("erin")
    assert roles("erin") == {"vision": ("lead", "sso"), "nlp": ("member", "sso")}
    shot(page, "sso-landed-my-jobs")
    page.goto(f"/teams/{world.vision.pk}/")
    assert "you are a lead" in page.locator(".head").inner_text()
    row = page.locator("#members tr", has_text="erin")
    assert "lead" in row.inner_text() and "(SSO)" in row.inner_text()
    shot(page, "sso-team-page")

    erin = get_user_model().objects.get(username="erin")
    pending = submit(erin, world.nlp, name="erin-nlp-pending")
    page.context.close()

    # The provider no longer puts erin in gpu-nlp: the next sign-in removes that membership
    # through the membership service, which cancels erin's pending request in nlp.
    set_groups(provider, erin=["gpu-vision-leads"])
    page = new_page(browser, live_server)
    sso_login(page, provider, "erin")
    assert roles("erin") == {"vision": ("lead", "sso")}
    assert GpuRequest.objects.get(pk=pending.pk).state == "cancelled"
    removed = AuditEvent.objects.get(action="membership.remove", team=world.nlp)
    assert removed.actor_name == "sso" and removed.after == {"cancelled_requests": 1}
    page.goto("/teams/")
    page.wait_for_url(f"**/teams/{world.vision.pk}/")
    shot(page, "sso-second-sign-in-team")
    page.context.close()


def test_with_password_login_off_the_login_page_only_offers_sso(
    browser, live_server, provider, settings
) -> None:  # noqa: ANN001
    make_world()
    settings.PASSWORD_LOGIN = False
    settings.AUTHENTICATION_BACKENDS = ["portal.auth.sso.GroupMappingBackend"]
    set_groups(provider, frank=["gpu-vision"])
    page = new_page(browser, live_server)
    page.goto("/accounts/login/")
    assert page.locator("input[name=password]").count() == 0
    assert "Sign in with Test IdP" in page.locator("[data-testid=sso-login]").inner_text()
    shot(page, "sso-only-login")
    sso_login(page, provider, "frank")
    assert roles("frank") == {"vision": ("member", "sso")}
    page.context.close()


def password_login(page, username: str, password: str) -> None:  # noqa: ANN001
    page.goto("/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("#password-login button[type=submit]")
    page.wait_for_url("**/")


def test_a_lead_adds_caps_and_removes_members_on_the_team_page(
    browser, live_server, monkeypatch
) -> None:  # noqa: ANN001
    monkeypatch.setattr("portal.services.requests._wake_scheduler", lambda: None)
    world = make_world()
    submit(world.bob, world.vision, name="bob-pending")
    page = new_page(browser, live_server)
    password_login(page, "alice", "pw-alice-123")
    page.goto(f"/teams/{world.vision.pk}/")
    page.fill("#member-add input[name=username]", "carol")
    page.click("#member-add button[type=submit]")
    page.wait_for_selector("#members tr:has-text('carol')")
    carol = Membership.objects.get(user=world.carol, team=world.vision)
    row = page.locator("#members tr", has_text="carol")
    row.locator("input[name$=-gpu_cap]").fill("2")
    row.locator("button:has-text('Save')").click()
    page.wait_for_selector("#members tr:has-text('carol') >> text=2 GPUs")
    carol.refresh_from_db()
    assert carol.gpu_cap_milli == 2000
    # removing asks first, saying what it cancels
    bob_row = page.locator("#members tr", has_text="bob")
    bob_row.locator("summary:has-text('Remove')").click()
    assert "1 pending request of bob will be cancelled" in bob_row.inner_text()
    bob_row.locator("button:has-text('Confirm remove')").click()
    page.wait_for_function(
        "!document.querySelector('#members').innerText.includes('bob')", timeout=20_000
    )
    assert GpuRequest.objects.get(name="bob-pending").state == "cancelled"
    audit = page.locator("#team-audit").inner_text()
    assert "removed a member: bob in team vision" in audit and "set a membership" in audit
    shot(page, "lead-team-members")
    page.context.close()


def test_an_auditor_reads_the_admin_pages_and_sees_no_buttons_that_change_anything(
    browser, live_server
) -> None:  # noqa: ANN001
    world = make_world()
    submit(world.bob, world.vision, name="vision-train")
    node_cordon(actor=world.dave, node=world.vision.quotas.first().pool.nodes.first())
    erin = get_user_model().objects.create_user("erin", password="pw-erin-123")
    erin.groups.add(Group.objects.get_or_create(name="auditors")[0])
    page = new_page(browser, live_server)
    password_login(page, "erin", "pw-erin-123")
    assert "auditor" in page.locator("header.top .logout span").inner_text()
    page.click("[data-testid=admin-menu] > summary")
    page.click("[data-testid=admin-menu] a:has-text('Capacity')")
    page.wait_for_selector("#capacity-map")
    assert page.locator(".node-actions").count() == 0
    shot(page, "auditor-capacity")
    page.click("[data-testid=admin-menu] > summary")
    page.click("[data-testid=admin-menu] a:has-text('Audit log')")
    assert "cordoned a node" in page.locator("#audit-log").inner_text()
    shot(page, "auditor-audit")
    page.goto("/ops/settings/")
    assert page.locator("fieldset[disabled] button").count() > 0
    assert not page.locator("fieldset[disabled] button").first.is_visible()
    shot(page, "auditor-settings")
    page.goto("/decisions/")
    shot(page, "auditor-decisions")
    page.goto(f"/teams/{world.vision.pk}/")
    assert "you are an auditor" in page.locator(".head").inner_text()
    assert page.locator("#member-add").count() == 0
    shot(page, "auditor-team")
    page.context.close()
