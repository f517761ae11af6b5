"""Security and bad input: each test is a defect found probing the portal as an attacker would.

- /metrics answered every team's numbers to OPTIONS, TRACE, POST, PUT, PATCH and
  DELETE without the token;
- wrong passwords were never throttled, nor API calls;
- NUL bytes, deep JSON, malformed node-agent reports, malformed pool settings
  and a negative class band gave 500s (or broke the preview for everyone).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.test import Client, RequestFactory
from django.urls import reverse

from portal.metrics.collector import metrics_view
from portal.models import GpuRequest, Node, Pool, WorkloadClass
from portal.services.pools import pool_update, workload_class_update
from tests.base import World, api_secret, make_world, submit

pytestmark = pytest.mark.django_db

METHODS = ["GET", "HEAD", "OPTIONS", "TRACE", "POST", "PUT", "PATCH", "DELETE"]


@pytest.fixture
def world() -> World:
    return make_world()


def api(user: Any) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {api_secret(user)}")


def post(client: Client, url: str, body: Any) -> Any:
    return client.post(url, body, content_type="application/json")


BODY = {
    "team": "vision",
    "workload_class": "training",
    "pool": "a100-train",
    "image": "registry.example.com/vision/train:1.0",
    "command": ["python", "train.py"],
}


# ---------------------------------------------------------------------------
# /metrics


@pytest.mark.parametrize("method", METHODS)
def test_metrics_ask_for_the_token_whatever_the_method(
    world: World, client: Client, settings: Any, method: str
) -> None:
    submit(world.bob, world.vision)
    settings.METRICS_TOKEN = "m-token"
    r = client.generic(method, "/metrics")
    assert r.status_code == 401
    assert b"quartermaster_" not in r.content
    r = client.generic(method, "/metrics", HTTP_AUTHORIZATION="Bearer m-token")
    if method in ("GET", "HEAD"):
        assert r.status_code == 200
    else:
        assert r.status_code == 405 and b"quartermaster_" not in r.content


@pytest.mark.parametrize("method", METHODS)
def test_the_metrics_view_checks_the_token_itself(settings: Any, method: str) -> None:
    """Whatever routes a request to the view (middleware order, a second URL), the token holds."""
    settings.METRICS_TOKEN = "m-token"
    request = RequestFactory().generic(method, "/metrics")
    r = metrics_view(request)
    assert r.status_code == 401 and b"quartermaster_" not in r.content


# ---------------------------------------------------------------------------
# brute force


def test_password_logins_are_locked_out_after_repeated_failures(
    client: Client, settings: Any
) -> None:
    settings.AXES_FAILURE_LIMIT = 5
    get_user_model().objects.create_user("erin", password="right-pw-123")
    for i in range(4):
        r = client.post("/accounts/login/", {"username": "erin", "password": f"wrong-{i}"})
        assert r.status_code == 200  # the form again, with its error
    r = client.post("/accounts/login/", {"username": "erin", "password": "wrong-5"})
    assert r.status_code == 429
    # Locked: even the right password is refused, with a status a client can act on.
    r = client.post("/accounts/login/", {"username": "erin", "password": "right-pw-123"})
    assert r.status_code == 429
    assert "_auth_user_id" not in client.session
    # Someone else, from the same address, still signs in.
    get_user_model().objects.create_user("fay", password="fay-pw-123")
    r = client.post("/accounts/login/", {"username": "fay", "password": "fay-pw-123"})
    assert r.status_code == 302


def _rates(settings: Any, **rates: str) -> None:
    base = {"anon": "1000/min", "user": "1000/min", "token": "1000/min"}
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {**base, **rates},
    }


def test_the_api_throttles_each_user_with_retry_after(world: World, settings: Any) -> None:
    _rates(settings, user="3/min")
    bob = api(world.bob)
    codes = [bob.get("/api/v1/pools/").status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    r = bob.get("/api/v1/pools/")
    assert r.status_code == 429 and 0 < int(r.headers["Retry-After"]) <= 60
    # Per user: bob signed in with a session shares his count; carol has her own.
    session = Client()
    session.force_login(world.bob)
    assert session.get("/api/v1/pools/").status_code == 429
    assert api(world.carol).get("/api/v1/pools/").status_code == 200


def test_the_api_throttles_each_token(world: World, settings: Any) -> None:
    _rates(settings, token="2/min")
    bob = api(world.bob)
    assert [bob.get("/api/v1/teams/").status_code for _ in range(3)] == [200, 200, 429]
    session = Client()
    session.force_login(world.bob)
    assert session.get("/api/v1/teams/").status_code == 200  # the token is slowed, not bob


def test_anonymous_clients_and_token_guesses_are_throttled(world: World, settings: Any) -> None:
    _rates(settings, anon="3/min")
    guess = Client(HTTP_AUTHORIZATION="Token " + "0" * 40)
    codes = [guess.get("/api/v1/requests/").status_code for _ in range(3)]
    assert codes == [401, 401, 401]
    r = guess.get("/api/v1/requests/")
    assert r.status_code == 429 and int(r.headers["Retry-After"]) > 0
    # The same address without credentials shares the count; a signed-in user does not.
    assert Client().get("/api/v1/requests/").status_code == 429
    assert api(world.bob).get("/api/v1/requests/").status_code == 200


# ---------------------------------------------------------------------------
# 500s any signed-in user could cause


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("command", ["python", "train.py\x00--evil"]),
        ("env", {"EPOCHS": "3\x00"}),
        ("env", {"EP\x00OCHS": "3"}),
        ("image", "registry.example.com/vision/train:1.0\x00"),
        ("name", "a\x00b"),
    ],
)
def test_nul_bytes_in_a_submit_are_a_400(world: World, field: str, value: Any) -> None:
    r = post(api(world.bob), "/api/v1/requests/", {**BODY, field: value})
    assert r.status_code == 400, r.content
    assert "NUL" in json.dumps(r.json()) or "Null characters" in json.dumps(r.json())
    assert not GpuRequest.objects.exists()


def test_nul_bytes_in_the_submit_form_are_a_400(world: World) -> None:
    c = Client()
    c.force_login(world.bob)
    wc = WorkloadClass.objects.get(name="training")
    r = c.post(
        reverse("portal:request-submit"),
        {
            "team": world.vision.pk,
            "workload_class": wc.pk,
            "image": "registry.example.com/vision/train:1.0",
            "command": "python train.py\x00",
            "env": "A=1",
            "count": 1,
        },
    )
    assert r.status_code == 400
    assert not GpuRequest.objects.exists()


@pytest.mark.parametrize(
    "url",
    [
        "/api/v1/queue/?team=%00",
        "/api/v1/queue/?pool=a%00b",
        "/api/v1/queue/?workload_class=%00",
        "/api/v1/decisions/?node=%00",
        "/api/v1/decisions/?team=%00",
        "/api/v1/requests/?state=%00",
        "/api/v1/audit/?action=%00",
        "/api/v1/capacity/?pool=%00",
        "/queue/?team=%00",
        "/decisions/?node=%00",
        "/ops/audit/?actor=%00",
        "/ops/capacity/?node=%00",
        "/?scope=%00",
    ],
)
def test_nul_bytes_in_query_filters_are_a_400(world: World, url: str) -> None:
    c = api(world.dave)
    c.force_login(world.dave)
    r = c.get(url)
    assert r.status_code == 400, (url, r.status_code)
    assert b"NUL" in r.content


DEEP = "[" * 50_000 + "]" * 50_000  # 100 KB


@pytest.mark.parametrize("url", ["/api/v1/requests/", "/api/v1/requests/preview/", "quota"])
def test_deeply_nested_json_is_a_400(world: World, url: str) -> None:
    if url == "quota":
        pool = Pool.objects.get(name="a100-train")
        url = f"/api/v1/teams/{world.vision.pk}/quotas/{pool.pk}/"
    c = api(world.alice)
    r = (
        c.put(url, DEEP, content_type="application/json")
        if "quotas" in url
        else c.post(url, DEEP, content_type="application/json")
    )
    assert r.status_code == 400, r.content[:200]
    assert "nested" in r.json()["detail"]


def test_json_nested_below_the_recursion_limit_is_a_400_too(world: World) -> None:
    body = {**BODY, "env": {"A": "1"}}
    inner: Any = "x"
    for _ in range(200):
        inner = [inner]
    body["command"] = inner
    r = post(api(world.bob), "/api/v1/requests/", body)
    assert r.status_code == 400 and "nested" in r.json()["detail"]


@pytest.fixture
def agent(world: World, settings: Any) -> Client:
    settings.NODE_AGENT_TOKEN = "agent-token"
    return Client(HTTP_AUTHORIZATION="Bearer agent-token")


def _dev(**kw: Any) -> dict[str, Any]:
    return {"index": 0, "uuid": "GPU-1", "memory_used_mib": 0, "healthy": True, **kw}


MALFORMED_REPORTS: list[Any] = [
    [],
    "a string",
    {"devices": []},
    {"node": 5, "devices": []},
    {"node": "a100-01"},
    {"node": "a100-01", "devices": {"0": {}}},
    {"node": "a100-01", "devices": ["not an object"]},
    {"node": "a100-01", "devices": [{}]},
    {"node": "a100-01", "devices": [_dev(index="0")]},
    {"node": "a100-01", "devices": [_dev(index=-1)]},
    {"node": "a100-01", "devices": [_dev(memory_used_mib="lots")]},
    {"node": "a100-01", "devices": [_dev(memory_used_mib=[1])]},
    {"node": "a100-01", "devices": [_dev(utilization_pct={"x": 1})]},
    {"node": "a100-01", "devices": [_dev(utilization_pct=1e400)]},
    {"node": "a100-01", "devices": [_dev(healthy="yes")]},
    {"node": "a100-01", "devices": [_dev(uuid=["GPU-1"])]},
    {"node": "a100-01", "devices": [_dev(xids={"xid": 79})]},
    {"node": "a100-01", "devices": [_dev(xids=[{"xid": "79", "critical": True}])]},
    {"node": "a100-01", "devices": [_dev(xids=[79])]},
    {"node": "a100-01", "devices": [_dev(processes=[{"pid": "x"}])]},
    {"node": "a100-01", "devices": [_dev(processes="all")]},
    {"node": "a100-01", "devices": [_dev(mig=[{"start": "0"}])]},
    {"node": "a100-01", "devices": [_dev(mig=[{"processes": [{"used_memory_mib": -5}]}])]},
    {"node": "a100-01", "sent_at": 12, "devices": []},
    {"node": "a100-01", "devices": [_dev(error={"nested": "x\x00"})]},
]


@pytest.mark.parametrize("report", MALFORMED_REPORTS, ids=range(len(MALFORMED_REPORTS)))
def test_every_malformed_node_agent_report_is_a_400_and_stores_nothing(
    agent: Client, report: Any
) -> None:
    raw = json.dumps(report) if not isinstance(report, str) else json.dumps(report)
    r = agent.post("/api/v1/agent/report/", raw, content_type="application/json")
    assert r.status_code == 400, (report, r.status_code, r.content[:300])
    assert not Node.objects.filter(last_heartbeat__isnull=False).exists()


def test_deep_json_to_the_node_agent_endpoint_is_a_400(agent: Client) -> None:
    r = agent.post("/api/v1/agent/report/", DEEP, content_type="application/json")
    assert r.status_code == 400


def test_a_well_formed_report_still_passes(agent: Client) -> None:
    report = {
        "node": "a100-01",
        "sent_at": "2026-01-01T00:00:00Z",
        "devices": [
            _dev(
                utilization_pct=None,
                xids=[{"xid": 13, "critical": False, "at": "2026-01-01T00:00:00Z"}],
                processes=[{"pid": 42, "used_memory_mib": 100}],
                mig=[{"profile": "1g.10gb", "start": -1, "size": 0, "processes": []}],
            )
        ],
    }
    r = agent.post("/api/v1/agent/report/", json.dumps(report), content_type="application/json")
    assert r.status_code == 202, r.content


def _pool_form(pool: Pool, **changes: str) -> dict[str, Any]:
    fields = {
        "lifecycle": pool.lifecycle,
        "inference_floor_milli": pool.inference_floor_milli,
        "taints": json.dumps(pool.taints),
        "node_selector": json.dumps(pool.node_selector),
        "time_slicing_replicas": pool.time_slicing_replicas,
        "mig_layout": json.dumps(pool.mig_layout),
        "interconnect": pool.interconnect,
        "architecture": pool.architecture,
        **changes,
    }
    return {f"p{pool.pk}-{k}": v for k, v in fields.items()}


BAD_POOL_SETTINGS = [
    ("taints", '[{"effect": "NoSchedule"}]'),
    ("taints", '[{"key": "a", "effect": "Sometimes"}]'),
    ("taints", '{"key": "a"}'),
    ("taints", '["a=b:NoSchedule"]'),
    ("taints", '[{"key": "bad key!", "effect": "NoSchedule"}]'),
    ("taints", '[{"key": "a", "value": 3, "effect": "NoSchedule"}]'),
    ("mig_layout", '"3g.40gb"'),
    ("mig_layout", '["9g.bad"]'),
    ("mig_layout", "[3]"),
    ("node_selector", '["quartermaster.io/pool"]'),
    ("node_selector", '{"quartermaster.io/pool": 1}'),
    ("node_selector", '{"bad key!": "x"}'),
]


@pytest.mark.parametrize(("field", "value"), BAD_POOL_SETTINGS)
def test_malformed_pool_settings_are_a_400_and_the_preview_still_works(
    world: World, field: str, value: str
) -> None:
    pool = Pool.objects.get(name="h100-mig")
    before = (pool.taints, pool.mig_layout, pool.node_selector)
    admin = Client()
    admin.force_login(world.dave)
    r = admin.post(reverse("portal:pool-edit", args=[pool.pk]), _pool_form(pool, **{field: value}))
    assert r.status_code == 400
    pool.refresh_from_db()
    assert (pool.taints, pool.mig_layout, pool.node_selector) == before
    for body in (
        {"team": "vision", "workload_class": "inference", "pool": "any"},
        {"team": "vision", "workload_class": "inference", "pool": "h100-mig"},
    ):
        r = post(api(world.bob), "/api/v1/requests/preview/", body)
        assert r.status_code == 200, r.content


@pytest.mark.parametrize(("field", "value"), BAD_POOL_SETTINGS)
def test_the_pool_service_refuses_malformed_settings(world: World, field: str, value: str) -> None:
    with pytest.raises(ValidationError) as exc:
        pool_update(
            actor=world.dave, pool=Pool.objects.get(name="h100-mig"), **{field: json.loads(value)}
        )
    assert any(k.startswith(field) for k in exc.value.message_dict)


def test_good_pool_settings_pass(world: World) -> None:
    pool = Pool.objects.get(name="h100-mig")
    pool_update(
        actor=world.dave,
        pool=pool,
        taints=[{"key": "example.com/gpu", "value": "", "effect": "NoExecute"}],
        mig_layout=["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"],
        node_selector={"quartermaster.io/pool": "h100-mig"},
    )


def test_a_negative_class_band_is_a_400(world: World) -> None:
    wc = WorkloadClass.objects.get(name="training")
    admin = Client()
    admin.force_login(world.dave)
    data = {
        f"c{wc.pk}-{k}": v
        for k, v in {
            "band": -1,
            "preemption": "always",
            "min_runtime_s": 60,
            "max_queue_s": 0,
            "latency_objective_ms": "",
            "priority_class_name": "qm-training",
            "description": "x",
        }.items()
    }
    r = admin.post(reverse("portal:class-edit", args=[wc.pk]), data)
    assert r.status_code == 400
    assert b"band" in r.content
    wc.refresh_from_db()
    assert wc.band == 100
    with pytest.raises(ValidationError) as exc:
        workload_class_update(actor=world.dave, workload_class=wc, band=-1)
    assert "band" in exc.value.message_dict
