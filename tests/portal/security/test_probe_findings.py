"""The findings of the security probe (issue 32), each with the test that failed before its fix.

- NUL in a cookie or a header is a 400 before any database lookup;
- JSON nested ~1,000 deep in a form field or an API field is a 400, not a RecursionError;
- NUM_PROXIES 0 means no proxy: the anonymous throttle keys on the socket address;
- a class's priority_class_name is a Kubernetes name; env names are bounded;
- every page carries a Content-Security-Policy without inline script, and a Permissions-Policy;
- no derived fallback SECRET_KEY.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from portal.models import GpuRequest, WorkloadClass
from tests.base import World, api_secret, make_world

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[3]
BODY = {
    "team": "vision",
    "workload_class": "training",
    "pool": "a100-train",
    "image": "registry.example.com/vision/train:1.0",
    "command": ["python", "train.py"],
}


@pytest.fixture
def world() -> World:
    return make_world()


def api(user: Any) -> Client:
    secret = api_secret(user)
    return Client(HTTP_AUTHORIZATION=f"Token {secret}")


# ---------------------------------------------------------------------------
# NUL in cookies and headers


@pytest.mark.parametrize(
    "headers",
    [
        # an escaped NUL: the cookie parser unquotes \000 to a NUL byte
        {"HTTP_COOKIE": 'sessionid="abcdefghijkl\\000mnopqrstuvwxyz0123456"'},
        {"HTTP_COOKIE": "sessionid=abcdefghijkl\x00mnopqrstuvwxyz0123456"},
        {"HTTP_COOKIE": 'csrftoken="\\000"'},
        {"HTTP_AUTHORIZATION": "Token abc\x00def"},
        {"HTTP_X_FORWARDED_USER": "bob\x00"},
        {"HTTP_USER_AGENT": "curl\x00"},
    ],
)
@pytest.mark.parametrize("url", ["/", "/queue/", "/api/v1/requests/", "/accounts/login/"])
def test_nul_in_a_cookie_or_header_is_a_400_before_any_query(
    url: str, headers: dict[str, str]
) -> None:
    with CaptureQueriesContext(connection) as queries:
        r = Client(**headers).get(url)
    assert r.status_code == 400, (url, headers, r.status_code)
    assert b"NUL" in r.content
    assert len(queries) == 0


def test_an_ordinary_cookie_still_passes(world: World) -> None:
    c = Client()
    c.force_login(world.bob)
    assert c.get("/").status_code == 200


# ---------------------------------------------------------------------------
# Deep JSON in every form field and API field

DEEP_OBJECT = '{"a":' * 1000 + "1" + "}" * 1000
DEEP_LIST = "[" * 1000 + "]" * 1000


def _form(world: World, **fields: Any) -> dict[str, Any]:
    wc = WorkloadClass.objects.get(name="training")
    return {
        "team": world.vision.pk,
        "workload_class": wc.pk,
        "profile": wc.default_profile_id,
        "count": 1,
        "image": "registry.example.com/vision/train:1.0",
        "checkpoint_interval_s": 0,
        "max_runtime_s": 0,
        "estimated_runtime_s": 3600,
        **fields,
    }


@pytest.mark.parametrize("deep", [DEEP_OBJECT, DEEP_LIST, '{"A": ' + DEEP_LIST + "}"])
@pytest.mark.parametrize(
    "field", ["env", "command", "name", "image", "model_name", "model_revision"]
)
def test_deep_json_in_any_submit_form_field_is_a_400(world: World, field: str, deep: str) -> None:
    c = Client()
    c.force_login(world.bob)
    r = c.post(reverse("portal:request-submit"), _form(world, **{field: deep}))
    # Other fields take the text as it is (a name, a command); none answers 500.
    assert r.status_code in (200, 302, 400), r.status_code
    if field == "env":
        assert r.status_code == 400
        # a list is not NAME=value lines; an object is read as JSON, and refused for its depth
        assert b"nested" in r.content or not deep.startswith("{")
        assert not GpuRequest.objects.exists()


@pytest.mark.parametrize("field", ["env", "command", "name", "image", "pool", "team"])
def test_deep_json_in_any_api_field_is_a_400(world: World, field: str) -> None:
    body = '{"team": "vision", "workload_class": "training", "image": "x", "%s": %s}' % (
        field,
        DEEP_OBJECT,
    )
    r = api(world.bob).post("/api/v1/requests/", body, content_type="application/json")
    assert r.status_code == 400, r.content[:200]
    assert "nested" in r.json()["detail"]


# ---------------------------------------------------------------------------
# NUM_PROXIES 0: no proxy


def test_num_proxies_zero_is_read_as_zero_not_none() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django, os; os.environ['DJANGO_SETTINGS_MODULE']='portal.settings';"
            "from django.conf import settings; print(repr(settings.REST_FRAMEWORK['NUM_PROXIES']))",
        ],
        cwd=ROOT,
        env={**os.environ, "NUM_PROXIES": "0"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.stdout.strip() == "0", result.stdout + result.stderr


def test_without_a_proxy_the_anonymous_throttle_keys_on_the_socket_address(
    world: World, settings: Any
) -> None:
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "NUM_PROXIES": 0,
        "DEFAULT_THROTTLE_RATES": {"anon": "3/min", "user": "1000/min", "token": "1000/min"},
    }
    codes = [
        Client(HTTP_X_FORWARDED_FOR=f"10.0.0.{i}").get("/api/v1/requests/").status_code
        for i in range(5)
    ]
    assert codes == [401, 401, 401, 429, 429]


def test_behind_one_proxy_the_throttle_keys_on_the_last_hop(world: World, settings: Any) -> None:
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "NUM_PROXIES": 1,
        "DEFAULT_THROTTLE_RATES": {"anon": "2/min", "user": "1000/min", "token": "1000/min"},
    }
    one = [
        Client(HTTP_X_FORWARDED_FOR=f"6.6.6.{i}, 10.0.0.1").get("/api/v1/requests/").status_code
        for i in range(3)
    ]
    assert one == [401, 401, 429]
    assert Client(HTTP_X_FORWARDED_FOR="10.0.0.2").get("/api/v1/requests/").status_code == 401


# ---------------------------------------------------------------------------
# priority_class_name and env names


def _class_form(wc: WorkloadClass, **changes: Any) -> dict[str, Any]:
    fields = {
        "band": wc.band,
        "preemption": wc.preemption,
        "min_runtime_s": wc.min_runtime_s,
        "max_queue_s": wc.max_queue_s,
        "latency_objective_ms": "",
        "priority_class_name": wc.priority_class_name,
        "description": "x",
        **changes,
    }
    return {f"c{wc.pk}-{k}": v for k, v in fields.items()}


@pytest.mark.parametrize(
    "name", ["Quartermaster_Training", "-lead", "trail-", "has space", "a" * 64, "x/y"]
)
def test_a_priority_class_name_that_is_not_a_kubernetes_name_is_a_400(
    world: World, name: str
) -> None:
    wc = WorkloadClass.objects.get(name="training")
    admin = Client()
    admin.force_login(world.dave)
    r = admin.post(
        reverse("portal:class-edit", args=[wc.pk]), _class_form(wc, priority_class_name=name)
    )
    assert r.status_code == 400
    assert b"priority" in r.content.lower()
    wc.refresh_from_db()
    assert wc.priority_class_name == "quartermaster-training"


def test_a_good_priority_class_name_is_kept(world: World) -> None:
    wc = WorkloadClass.objects.get(name="training")
    admin = Client()
    admin.force_login(world.dave)
    admin.post(
        reverse("portal:class-edit", args=[wc.pk]),
        _class_form(wc, priority_class_name="qm.batch-low"),
    )
    wc.refresh_from_db()
    assert wc.priority_class_name == "qm.batch-low"


@pytest.mark.parametrize("name", ["A" * 10_000, "A" * 129])
def test_an_overlong_env_name_is_a_400(world: World, name: str) -> None:
    r = api(world.bob).post(
        "/api/v1/requests/", {**BODY, "env": {name: "1"}}, content_type="application/json"
    )
    assert r.status_code == 400
    assert "env" in r.json()["errors"]
    assert "characters" in r.json()["errors"]["env"][0]
    assert not GpuRequest.objects.exists()


def test_an_env_name_of_128_characters_passes(world: World) -> None:
    r = api(world.bob).post(
        "/api/v1/requests/", {**BODY, "env": {"A" * 128: "1"}}, content_type="application/json"
    )
    assert r.status_code == 201, r.content


# ---------------------------------------------------------------------------
# Content-Security-Policy and Permissions-Policy


@pytest.mark.parametrize("url", ["/", "/accounts/login/", "/queue/", "/api/v1/requests/"])
def test_every_answer_carries_a_strict_csp_and_a_permissions_policy(world: World, url: str) -> None:
    c = Client()
    c.force_login(world.bob)
    r = c.get(url)
    csp = r.headers["Content-Security-Policy"]
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";") if d.strip())
    assert directives["default-src"] == "'self'"
    assert directives["script-src"] == "'self'"
    assert directives["object-src"] == "'none'"
    assert directives["frame-ancestors"] == "'none'"
    assert "unsafe-inline" not in directives["script-src"]
    assert "unsafe-eval" not in csp
    policy = r.headers["Permissions-Policy"]
    for feature in ("camera=()", "microphone=()", "geolocation=()"):
        assert feature in policy


def test_no_template_has_an_inline_script_or_event_handler() -> None:
    """The CSP forbids inline script: a template with one would break in the browser."""
    import re

    offenders = []
    for path in (ROOT / "templates").rglob("*.html"):
        text = path.read_text()
        for m in re.finditer(r"<script\b[^>]*>", text):
            if "src=" not in m.group(0):
                offenders.append(f"{path.name}: {m.group(0)}")
        if re.search(r"\son[a-z]+\s*=", text) or "javascript:" in text:
            offenders.append(f"{path.name}: event handler or javascript: URL")
    assert offenders == []


# ---------------------------------------------------------------------------
# SECRET_KEY


def _key(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    dropped = ("DEBUG", "SECRET_KEY", "SECRET_KEY_FILE", "QM_DEMO", "QM_REQUIRE_SECRET")
    base = {k: v for k, v in os.environ.items() if k not in dropped}
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import os; os.environ['DJANGO_SETTINGS_MODULE']='portal.settings';"
            "from django.conf import settings; print(settings.SECRET_KEY)",
        ],
        cwd=ROOT,
        env={**base, "QM_VAR_DIR": str(tmp_path), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_production_image_refuses_to_start_without_a_secret_key(tmp_path: Path) -> None:
    result = _key(tmp_path, QM_REQUIRE_SECRET="true")
    assert result.returncode != 0
    assert "SECRET_KEY" in result.stderr and "QM_DEMO" in result.stderr


def test_the_image_requires_a_secret_key_unless_told_it_is_a_demo() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "QM_REQUIRE_SECRET=true" in dockerfile


def test_a_demo_gets_a_random_key_kept_across_restarts_not_one_derived(tmp_path: Path) -> None:
    first = _key(tmp_path, QM_REQUIRE_SECRET="true", QM_DEMO="true")
    assert first.returncode == 0, first.stderr
    key = first.stdout.strip()
    assert len(key) >= 50
    assert str(ROOT) not in key and "insecure" not in key
    assert _key(tmp_path, QM_DEMO="true").stdout.strip() == key
    assert (tmp_path / "secret_key").stat().st_mode & 0o077 == 0
    # another installation gets another key
    other = tmp_path / "other"
    other.mkdir()
    assert _key(other).stdout.strip() != key


def test_a_given_secret_key_is_used(tmp_path: Path) -> None:
    result = _key(tmp_path, QM_REQUIRE_SECRET="true", SECRET_KEY="k" * 60)
    assert result.stdout.strip() == "k" * 60
