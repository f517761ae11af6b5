"""The REST API under /api/v1/: token auth, same services and access rules as the pages."""

from __future__ import annotations

import pytest
from django.test import Client

from portal.models import AuditEvent, GpuRequest, Pool, Quota
from portal.tick import run as tick
from tests.base import World, api_secret, make_world, submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> World:
    return make_world()


def api(user) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {api_secret(user)}")


BODY = {
    "team": "vision",
    "workload_class": "training",
    "pool": "a100-train",
    "profile": "whole",
    "count": 2,
    "image": "registry.example.com/vision/train:1.0",
    "command": ["python", "train.py"],
    "env": {"EPOCHS": "3"},
    "checkpoint_interval_s": 600,
}


def post(client: Client, url: str, body: dict):
    return client.post(url, body, content_type="application/json")


def test_it_submits_lists_gets_and_cancels(world: World) -> None:
    c = api(world.bob)
    r = post(c, "/api/v1/requests/", BODY)
    assert r.status_code == 201, r.json()
    data = r.json()
    assert data["team"] == "vision" and data["state"] == "pending" and data["count"] == 2
    req = GpuRequest.objects.get(pk=data["id"])
    assert req.submitted_by == world.bob and req.env == {"EPOCHS": "3"}

    r = c.get("/api/v1/requests/")
    assert r.status_code == 200 and [x["id"] for x in r.json()["results"]] == [req.pk]
    r = c.get(f"/api/v1/requests/{req.pk}/")
    assert r.json()["reason"].startswith("queued")

    r = post(c, f"/api/v1/requests/{req.pk}/cancel/", {})
    assert r.status_code == 200 and r.json()["state"] == "cancelled"
    # Cancelling twice is a 400 naming the state, not a 500.
    r = post(c, f"/api/v1/requests/{req.pk}/cancel/", {})
    assert r.status_code == 400 and "state" in r.json()["errors"]


def test_it_shows_queue_position_and_reason_after_a_tick(world: World) -> None:
    c = api(world.bob)
    for _ in range(5):
        assert post(c, "/api/v1/requests/", {**BODY, "count": 8}).status_code == 201
    tick.run_tick()
    r = c.get("/api/v1/queue/")
    rows = r.json()["results"]
    assert rows and rows[0]["queue_position"] is not None
    positions = [x["queue_position"] for x in rows]
    assert positions == sorted(positions)
    assert rows[0]["reason"].startswith("waiting")


@pytest.mark.parametrize(
    "change, field",
    [
        ({"env": {"NVIDIA_VISIBLE_DEVICES": "all"}}, "env"),
        ({"env": {"CUDA_VISIBLE_DEVICES": "0"}}, "env"),
        ({"count": 0}, "count"),
        ({"count": "many"}, "count"),
        ({"image": "not an image"}, "image"),
        ({"team": "nlp"}, "team"),
        ({"workload_class": "nope"}, "workload_class"),
        ({"pool": "h100-mig"}, "profile"),
        ({"namespace": "kube-system"}, "namespace"),
        ({"nodeName": "a100-01"}, "nodeName"),
        ({"tolerations": [{"key": "x"}]}, "tolerations"),
        ({"state": "running"}, "state"),
        ({"command": {"a": 1}}, "command"),
        ({"max_runtime_s": -1}, "max_runtime_s"),
    ],
)
def test_it_answers_400_naming_the_field(world: World, change: dict, field: str) -> None:
    r = post(api(world.bob), "/api/v1/requests/", {**BODY, **change})
    assert r.status_code == 400, r.content
    assert field in r.json()["errors"], r.json()
    assert not GpuRequest.objects.exists()


def test_it_caps_pending_requests_per_user_and_team(world: World, settings) -> None:
    settings.MAX_PENDING_PER_USER = 2
    c = api(world.bob)
    assert post(c, "/api/v1/requests/", BODY).status_code == 201
    assert post(c, "/api/v1/requests/", BODY).status_code == 201
    r = post(c, "/api/v1/requests/", BODY)
    assert r.status_code == 400 and "2 pending" in r.json()["errors"]["non_field_errors"][0]
    world.vision.max_pending = 3
    world.vision.save()
    assert post(api(world.alice), "/api/v1/requests/", BODY).status_code == 201
    r = post(api(world.alice), "/api/v1/requests/", BODY)
    assert r.status_code == 400 and "vision" in r.json()["errors"]["non_field_errors"][0]
    assert GpuRequest.objects.count() == 3


def test_it_hides_other_teams_requests(world: World) -> None:
    req = submit(world.bob, world.vision)
    c = api(world.carol)
    assert c.get(f"/api/v1/requests/{req.pk}/").status_code == 404
    assert post(c, f"/api/v1/requests/{req.pk}/cancel/", {}).status_code == 404
    assert c.get("/api/v1/requests/").json()["results"] == []
    assert c.get("/api/v1/queue/").json()["results"] == []
    assert c.get(f"/api/v1/teams/{world.vision.pk}/").status_code == 404
    req.refresh_from_db()
    assert req.state == "pending"


def test_it_lets_only_the_submitter_or_a_lead_cancel(world: World) -> None:
    req = submit(world.alice, world.vision)
    assert post(api(world.bob), f"/api/v1/requests/{req.pk}/cancel/", {}).status_code == 403
    mine = submit(world.bob, world.vision)
    assert post(api(world.alice), f"/api/v1/requests/{mine.pk}/cancel/", {}).status_code == 200


def test_it_sets_quotas_within_the_grant(world: World) -> None:
    a100 = Pool.objects.get(name="a100-train")
    url = f"/api/v1/teams/{world.vision.pk}/quotas/{a100.pk}/"
    c = api(world.alice)
    r = c.put(
        url, {"nominal_milli": 8000, "borrowing_limit_milli": 2000}, content_type="application/json"
    )
    assert r.status_code == 200 and r.json()["nominal_milli"] == 8000
    assert AuditEvent.objects.filter(action="quota.set", actor=world.alice).exists()
    r = c.put(url, {"nominal_milli": 99000}, content_type="application/json")
    assert r.status_code == 400 and "nominal_milli" in r.json()["errors"]
    r = c.put(url, {"nominal_milli": 1000, "granted_milli": 99000}, content_type="application/json")
    assert r.status_code == 400 and "granted_milli" in r.json()["errors"]
    assert (
        api(world.bob).put(url, {"nominal_milli": 0}, content_type="application/json").status_code
        == 403
    )
    assert (
        api(world.carol).put(url, {"nominal_milli": 0}, content_type="application/json").status_code
        == 404
    )
    r = api(world.dave).put(
        url, {"nominal_milli": 20000, "granted_milli": 24000}, content_type="application/json"
    )
    assert r.status_code == 200
    q = Quota.objects.get(team=world.vision, pool=a100)
    assert (q.nominal_milli, q.granted_milli) == (20000, 24000)


def test_it_shows_team_usage(world: World) -> None:
    submit(world.bob, world.vision, count=4)
    tick.run_tick()
    r = api(world.alice).get(f"/api/v1/teams/{world.vision.pk}/")
    usage = {u["pool"]: u for u in r.json()["usage"]}
    assert usage["a100-train"]["used_milli"] == 4000
    assert {m["username"] for m in r.json()["members"]} >= {"alice", "bob"}


def test_it_serves_pools_capacity_decisions_and_audit(world: World) -> None:
    submit(world.bob, world.vision, count=2)
    tick.run_tick()
    pools = {p["name"]: p for p in api(world.bob).get("/api/v1/pools/").json()}
    assert (
        pools["a100-train"]["allocated_milli"] == 2000
        and "whole" in pools["a100-train"]["profiles"]
    )
    assert "mig-3g.40gb" in pools["h100-mig"]["profiles"]
    assert api(world.alice).get("/api/v1/capacity/").status_code == 403
    r = api(world.dave).get("/api/v1/capacity/?pool=a100-train")
    nodes = r.json()["results"]
    cells = [c for n in nodes for d in n["devices"] for c in d["cells"]]
    assert sum(c["status"] == "allocated" for c in cells) == 2
    r = api(world.bob).get("/api/v1/decisions/?kind=admit")
    assert r.status_code == 200 and all(d["kind"] == "admit" for d in r.json()["results"])
    assert api(world.bob).get("/api/v1/decisions/?kind=bogus").status_code == 400
    assert api(world.carol).get("/api/v1/decisions/?team=vision").status_code == 400
    assert api(world.bob).get("/api/v1/audit/").status_code == 403
    assert api(world.dave).get("/api/v1/audit/").json()["count"] >= 1


def test_it_previews_without_writing(world: World) -> None:
    before = (GpuRequest.objects.count(), AuditEvent.objects.count())
    r = post(
        api(world.bob),
        "/api/v1/requests/preview/",
        {k: BODY[k] for k in ("team", "workload_class", "pool", "profile", "count")},
    )
    assert (
        r.status_code == 200 and r.json()["outcome"] == "fits" and r.json()["pool"] == "a100-train"
    )
    assert (GpuRequest.objects.count(), AuditEvent.objects.count()) == before


def test_it_drains_nodes_for_admins_only(world: World) -> None:
    from portal.models import Node

    node = Node.objects.get(name="a100-02")
    assert post(api(world.alice), f"/api/v1/nodes/{node.pk}/drain/", {}).status_code == 403
    r = post(api(world.dave), f"/api/v1/nodes/{node.pk}/drain/", {})
    assert r.status_code == 200 and r.json()["draining"] is True


def test_it_requires_authentication(world: World) -> None:
    r = Client().get("/api/v1/requests/")
    assert r.status_code == 401
    r = Client(HTTP_AUTHORIZATION="Token nope").get("/api/v1/requests/")
    assert r.status_code == 401


def test_it_serves_the_schema_and_docs(world: World) -> None:
    c = Client()
    c.force_login(world.bob)
    r = c.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert r.status_code == 200
    schema = r.json()
    assert schema["openapi"].startswith("3")
    assert "/api/v1/requests/" in schema["paths"] and "post" in schema["paths"]["/api/v1/requests/"]
    assert c.get("/api/docs/").status_code == 200
    assert Client().get("/api/schema/").status_code in (401, 403)
