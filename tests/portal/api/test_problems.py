"""Errors under /api/ are RFC 9457 problem details, whoever answers them; never HTML."""

from __future__ import annotations

from unittest import mock

import pytest
from django.core.cache import cache
from django.test import Client

from tests.base import World, api_secret, make_world, submit

pytestmark = pytest.mark.django_db

MEMBERS = {"type", "title", "status", "detail", "code"}


@pytest.fixture
def world() -> World:
    return make_world()


def assert_problem(r, status: int, code: str) -> dict:  # noqa: ANN001
    assert r.status_code == status, r.content
    assert r["Content-Type"] == "application/problem+json"
    body = r.json()
    assert set(body) >= MEMBERS, body
    assert body["status"] == status and body["code"] == code
    assert body["type"] == f"urn:quartermaster:problem:{code}"
    assert body["title"] and body["detail"]
    return body


def test_an_unknown_api_url_is_a_problem_not_a_page(world: World) -> None:
    client = Client(HTTP_AUTHORIZATION=f"Bearer {api_secret(world.bob)}")
    for accept in ("application/json", "text/html"):
        assert_problem(client.get("/api/v1/no-such/", HTTP_ACCEPT=accept), 404, "not_found")
    assert_problem(Client().get("/api/v1/no-such/"), 404, "not_found")


def test_invalid_input_names_each_field(world: World) -> None:
    client = Client(HTTP_AUTHORIZATION=f"Bearer {api_secret(world.bob)}")
    r = client.post(
        "/api/v1/requests/",
        {"team": "vision", "workload_class": "training", "count": 0, "image": "x:1"},
        content_type="application/json",
    )
    body = assert_problem(r, 400, "invalid")
    assert "count" in body["errors"] and isinstance(body["errors"]["count"], list)
    assert "count" in body["detail"]


def test_malformed_json_is_a_parse_error(world: World) -> None:
    client = Client(HTTP_AUTHORIZATION=f"Bearer {api_secret(world.bob)}")
    r = client.post("/api/v1/requests/", "{nope", content_type="application/json")
    assert_problem(r, 400, "parse_error")


def test_auth_failures_say_why_with_a_stable_code(world: World) -> None:
    r = Client().get("/api/v1/requests/")
    assert_problem(r, 401, "not_authenticated")
    assert r["WWW-Authenticate"].startswith("Bearer")
    assert_problem(
        Client(HTTP_AUTHORIZATION="Bearer qm_nope").get("/api/v1/requests/"),
        401,
        "authentication_failed",
    )
    read = Client(HTTP_AUTHORIZATION=f"Bearer {api_secret(world.bob, scope='read')}")
    req = submit(world.bob, world.vision)
    assert_problem(read.post(f"/api/v1/requests/{req.pk}/cancel/"), 403, "token_scope")


def test_another_teams_object_and_a_wrong_method_are_problems(world: World) -> None:
    req = submit(world.bob, world.vision)
    carol = Client(HTTP_AUTHORIZATION=f"Bearer {api_secret(world.carol)}")
    assert_problem(carol.get(f"/api/v1/requests/{req.pk}/"), 404, "not_found")
    r = carol.delete("/api/v1/queue/")
    assert_problem(r, 405, "method_not_allowed")
    assert "GET" in r["Allow"]


def test_a_throttled_client_gets_a_problem_with_retry_after(world: World, settings) -> None:  # noqa: ANN001
    cache.clear()
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {"anon": "1/min", "user": "1000/min", "token": "1000/min"},
    }
    client = Client()
    client.get("/api/v1/requests/")
    r = client.get("/api/v1/requests/")
    assert_problem(r, 429, "throttled")
    assert int(r["Retry-After"]) > 0
    cache.clear()


def test_an_unhandled_exception_is_a_problem_without_the_traceback(world: World) -> None:
    client = Client(
        HTTP_AUTHORIZATION=f"Bearer {api_secret(world.bob)}", raise_request_exception=False
    )
    with mock.patch(
        "portal.api.requests.request_list", side_effect=RuntimeError("secret internals")
    ):
        r = client.get("/api/v1/requests/")
    body = assert_problem(r, 500, "server_error")
    assert "secret internals" not in r.content.decode() and "Traceback" not in body["detail"]
