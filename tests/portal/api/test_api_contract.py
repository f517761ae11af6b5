"""The API keeps the contract its schema states, for clients generated from it.

- A Python client generated from /api/schema/ by openapi-python-client calls
  every list operation and parses every answer (list pages were documented as
  arrays, so generated clients broke on the first call).
- Every operation documents 400, 401, 403, 429 and 503; those naming an object 404.
- Filters and the readiness endpoint answer alike whether a name or id exists.
- Swagger UI is served from the installed sidecar, offline.
- A database outage is a 503 with Retry-After; /readyz checks the database only (Redis is optional).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.staticfiles import finders
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import OperationalError, close_old_connections, connection
from django.test import Client

from portal.celery import app as celery_app
from portal.tick import run as tick
from tests.base import World, api_secret, make_world, submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> World:
    return make_world()


def api(user: Any) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {api_secret(user)}")


def schema(user: Any) -> dict[str, Any]:
    r = api(user).get("/api/schema/", {"format": "json"})
    assert r.status_code == 200
    return r.json()


def test_list_operations_are_documented_as_pages(world: World) -> None:
    doc = schema(world.bob)
    for path in ("/api/v1/requests/", "/api/v1/queue/", "/api/v1/decisions/", "/api/v1/teams/"):
        ok = doc["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]
        ref = ok["schema"]["$ref"].rsplit("/", 1)[-1]
        page = doc["components"]["schemas"][ref]
        assert page["type"] == "object" and page["properties"]["results"]["type"] == "array"
        params = {p["name"] for p in doc["paths"][path]["get"]["parameters"]}
        assert "page" in params


def test_every_operation_documents_its_error_answers(world: World) -> None:
    doc = schema(world.bob)
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            codes = set(op["responses"])
            assert {"400", "401", "403", "429", "503"} <= codes, (method, path, codes)
            if "{" in path:
                assert "404" in codes, (method, path)


def _generate_client(doc_path: Path, out: Path) -> Any:
    config = out.parent / "client-config.yaml"
    config.write_text(
        "post_hooks: []\nproject_name_override: qm_client\npackage_name_override: qm_client\n"
    )
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "openapi-python-client"),
            "generate",
            "--path",
            str(doc_path),
            "--output-path",
            str(out),
            "--meta",
            "none",
            "--config",
            str(config),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Warning" not in result.stdout, result.stdout
    sys.path.insert(0, str(out.parent))
    try:
        for name in [m for m in sys.modules if m == "qm_client" or m.startswith("qm_client.")]:
            del sys.modules[name]
        return importlib.import_module("qm_client")
    finally:
        sys.path.remove(str(out.parent))


@pytest.mark.slow
def test_a_client_generated_from_the_schema_calls_every_list_operation(
    world: World, tmp_path: Path
) -> None:
    a = submit(world.bob, world.vision)
    submit(world.bob, world.vision, count=8)
    tick.run_tick()
    assert a.attempts.exists()
    doc = api(world.dave).get("/api/schema/", {"format": "json"})
    (tmp_path / "openapi.json").write_bytes(doc.content)
    client_pkg = _generate_client(tmp_path / "openapi.json", tmp_path / "qm_client")
    wsgi = httpx.WSGITransport(app=get_wsgi_application())
    # As django.test.Client does: the request cycle must not close the test's connection.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        _call_every_list_operation(world, client_pkg, wsgi)
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


def _call_every_list_operation(world: World, client_pkg: Any, wsgi: Any) -> None:

    def client_for(user: Any) -> Any:
        secret = api_secret(user)
        c = client_pkg.AuthenticatedClient(base_url="http://testserver", token=secret)
        c.set_httpx_client(
            httpx.Client(
                base_url="http://testserver",
                transport=wsgi,
                headers={"Authorization": f"Bearer {secret}"},
            )
        )
        return c

    bob, dave = client_for(world.bob), client_for(world.dave)
    called = []
    api_pkg = importlib.import_module("qm_client.api")
    for info in pkgutil.walk_packages(api_pkg.__path__, "qm_client.api."):
        module = importlib.import_module(info.name)
        if not info.name.endswith("_list"):
            continue
        # Lists under an object (a team's members) get an object both callers may see.
        ids = {"team_id": world.vision.pk}
        params = inspect.signature(module.sync_detailed).parameters
        path_args = {k: v for k, v in ids.items() if k in params}
        for who, c in (("member", bob), ("admin", dave)):
            response = module.sync_detailed(client=c, **path_args)
            if who == "member" and info.name.endswith(
                (
                    "capacity_list",
                    "audit_list",
                    "profiles_list",
                    "rollouts_list",
                    "policy_versions_list",
                )
            ):
                assert response.status_code == 403
                continue
            assert response.status_code == 200, (info.name, who, response.content[:300])
            parsed = response.parsed
            assert parsed is not None, info.name
            rows = parsed if isinstance(parsed, list) else parsed.results
            assert isinstance(rows, list)
            for row in rows:
                assert type(row).__name__ != "dict", info.name  # a generated model
            called.append((info.name.rsplit(".", 1)[-1], who, len(rows)))
    names = {n for n, _, _ in called}
    assert names >= {
        "requests_list",
        "queue_list",
        "pools_list",
        "capacity_list",
        "decisions_list",
        "audit_list",
        "teams_list",
        "profiles_list",
        "team_members_list",
    }, names
    assert all(
        n > 0 for name, _, n in called if name in ("requests_list", "pools_list", "profiles_list")
    )


def test_a_team_filter_answers_alike_for_other_and_missing_teams(world: World) -> None:
    bob = api(world.bob)
    other = bob.get("/api/v1/queue/", {"team": "nlp"})
    missing = bob.get("/api/v1/queue/", {"team": "no-such-team"})
    assert other.status_code == missing.status_code == 400
    assert other.json() == missing.json()
    assert bob.get("/api/v1/queue/", {"team": "vision"}).status_code == 200
    # Admins see every team, so every existing one filters.
    assert api(world.dave).get("/api/v1/queue/", {"team": "nlp"}).status_code == 200


def test_swagger_ui_is_served_offline(world: World) -> None:
    c = Client()
    c.force_login(world.bob)
    r = c.get("/api/docs/")
    assert r.status_code == 200
    html = r.content.decode()
    assert "cdn." not in html and "unpkg" not in html
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js" in html
    assert finders.find("drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js")


def test_a_database_outage_is_a_503_for_the_api(world: World) -> None:
    bob = api(world.bob)
    with connection.execute_wrapper(_refuse):
        r = bob.get("/api/v1/requests/")
    assert r.status_code == 503 and int(r.headers["Retry-After"]) > 0
    assert "database" in r.json()["detail"]


def test_a_database_outage_is_a_503_for_pages(world: World) -> None:
    c = Client()
    c.force_login(world.bob)
    with connection.execute_wrapper(_refuse):
        r = c.get("/queue/")
    assert r.status_code == 503 and "Retry-After" in r.headers


def _refuse(*args: Any) -> Any:
    raise OperationalError("connection to server at 127.0.0.1 failed: Connection refused")


def test_readyz_checks_the_database_only(client: Client) -> None:
    r = client.get("/readyz", HTTP_HOST="10.1.2.3:8000")
    assert r.status_code == 200
    assert r.json() == {"ok": True, "database": "ok"}
    with connection.execute_wrapper(_refuse):
        r = client.get("/readyz")
    assert r.status_code == 503 and r.json()["database"].startswith("unreachable")
    # /healthz is liveness only: a database outage must not get every pod restarted.
    with connection.execute_wrapper(_refuse):
        assert client.get("/healthz").status_code == 200
    # A broker nothing listens on: the web still answers, so it stays in the Service.
    old = celery_app.conf.broker_url, celery_app.conf.broker_write_url
    celery_app.conf.broker_url = celery_app.conf.broker_write_url = "redis://127.0.0.1:1/0"
    try:
        r = client.get("/readyz")
    finally:
        celery_app.conf.broker_url, celery_app.conf.broker_write_url = old
    assert r.status_code == 200 and r.json() == {"ok": True, "database": "ok"}
