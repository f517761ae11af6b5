"""The login path as people meet it: warnings before a lockout, a styled lockout and CSRF
failure that say what to do, "you have been logged out", a skip link, the auditor demo login."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

pytestmark = pytest.mark.django_db


def test_the_last_attempts_before_a_lockout_are_announced(client: Client, settings: Any) -> None:
    settings.AXES_FAILURE_LIMIT = 5
    get_user_model().objects.create_user("erin", password="right-pw-123")
    pages = [
        client.post("/accounts/login/", {"username": "erin", "password": f"wrong-{i}"})
        for i in range(4)
    ]
    first, last = pages[0].content.decode(), pages[-1].content.decode()
    assert "attempts left" not in first  # 4 left: no need to worry anyone yet
    assert "1 attempt left" in last and "15 minutes" in last


def test_the_lockout_is_a_styled_page_that_says_how_long_to_wait(
    client: Client, settings: Any
) -> None:
    settings.AXES_FAILURE_LIMIT = 2
    get_user_model().objects.create_user("erin", password="right-pw-123")
    for i in range(2):
        r = client.post("/accounts/login/", {"username": "erin", "password": f"wrong-{i}"})
    assert r.status_code == 429
    page = r.content.decode()
    assert "Too many failed logins" in page and "15 minutes" in page
    assert 'class="top"' in page  # the site's header: a page of the portal, not a bare text
    assert r["Retry-After"] == "900"


def test_a_csrf_failure_is_a_styled_page_that_says_what_to_do() -> None:
    c = Client(enforce_csrf_checks=True)
    r = c.post("/accounts/login/", {"username": "x", "password": "y"})
    assert r.status_code == 403
    page = r.content.decode()
    assert "Reload the page" in page and 'class="top"' in page


def test_logging_out_says_so(client: Client) -> None:
    user = get_user_model().objects.create_user("erin", password="right-pw-123")
    client.force_login(user)
    r = client.post("/accounts/logout/", follow=True)
    assert "You have been logged out." in r.content.decode()


def test_every_page_has_a_skip_link_to_its_content(client: Client) -> None:
    page = client.get("/accounts/login/").content.decode()
    assert 'href="#content"' in page and 'id="content"' in page


def test_the_demo_has_an_auditor_login() -> None:
    from django.conf import settings

    from portal import access
    from portal.demo.seed import seed

    seed()
    auditor = get_user_model().objects.get(username="auditor")
    assert auditor.groups.filter(name=settings.AUDITOR_GROUP).exists()
    assert access.is_read_only(auditor)
