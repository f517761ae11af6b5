"""Pools and workload classes created, changed and retired over /api/v1/ (admins only)."""

from __future__ import annotations

import pytest
from django.test import Client

from portal.models import AuditEvent, GpuRequest, Pool, WorkloadClass
from tests.base import World, api_secret, make_world, submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> World:
    return make_world()


def api(user) -> Client:
    secret = api_secret(user)
    return Client(HTTP_AUTHORIZATION=f"Token {secret}")


POOL = {
    "name": "h100-new",
    "gpu_model": "NVIDIA-H100-80GB-HBM3",
    "gpu_memory_mib": 81920,
    "partitioning": "mig",
    "mig_layout": ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"],
    "node_selector": {"quartermaster.io/pool": "h100-new"},
    "taints": [{"key": "quartermaster.io/gpu", "value": "true", "effect": "NoSchedule"}],
}


def test_it_creates_a_pool_as_admin_with_one_audit_event(world: World) -> None:
    r = api(world.dave).post("/api/v1/pools/", POOL, content_type="application/json")
    assert r.status_code == 201, r.content
    pool = Pool.objects.get(name="h100-new")
    assert pool.mig_layout == POOL["mig_layout"]
    events = AuditEvent.objects.filter(action="pool.create", object_id=str(pool.pk))
    assert events.count() == 1
    assert events.get().after["node_selector"] == POOL["node_selector"]


@pytest.mark.parametrize("who", ["alice", "bob"])
def test_it_refuses_a_lead_or_researcher(world: World, who: str) -> None:
    user = getattr(world, who)
    assert (
        api(user).post("/api/v1/pools/", POOL, content_type="application/json").status_code == 403
    )
    body = {"name": "urgent", "band": 900}
    assert (
        api(user).post("/api/v1/classes/", body, content_type="application/json").status_code == 403
    )
    assert not Pool.objects.filter(name="h100-new").exists()
    assert not WorkloadClass.objects.filter(name="urgent").exists()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"node_selector": {"bad key!": "x"}}, "node_selector"),
        ({"taints": [{"key": "a", "effect": "Sometimes"}]}, "taints"),
        ({"mig_layout": ["4g.40gb", "4g.40gb"]}, "mig_layout"),
        ({"mig_layout": ["3g.71gb"]}, "mig_layout"),
        ({"name": "Not_A_Name"}, "name"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_it_answers_bad_pool_input_with_a_400_naming_the_field(
    world: World, change: dict, field: str
) -> None:
    r = api(world.dave).post("/api/v1/pools/", {**POOL, **change}, content_type="application/json")
    assert r.status_code == 400, r.content
    assert field in r.json()["errors"]
    assert not Pool.objects.filter(name=POOL["name"]).exists()


def test_it_creates_and_changes_a_class(world: World) -> None:
    admin = api(world.dave)
    body = {
        "name": "urgent",
        "band": 900,
        "preemption": "never",
        "max_queue_s": 60,
        "default_profile": "whole",
        "restricted": True,
        "teams": ["vision"],
    }
    r = admin.post("/api/v1/classes/", body, content_type="application/json")
    assert r.status_code == 201, r.content
    assert r.json()["teams"] == ["vision"]
    wc = WorkloadClass.objects.get(name="urgent")
    r = admin.patch(f"/api/v1/classes/{wc.pk}/", {"band": 950}, content_type="application/json")
    assert r.status_code == 200, r.content
    assert (
        AuditEvent.objects.filter(action="class.update", object_id=str(wc.pk)).get().after["band"]
        == 950
    )
    r = admin.post(
        "/api/v1/classes/", {**body, "name": "x", "band": -1}, content_type="application/json"
    )
    assert r.status_code == 400 and "band" in r.json()["errors"]


def test_it_asks_before_retiring_a_pool_with_waiting_work_then_moves_it(world: World) -> None:
    req = submit(world.bob, world.vision, pool_name="l4-shared", profile_kind="whole", count=1)
    pool = Pool.objects.get(name="l4-shared")
    admin = api(world.dave)
    r = admin.delete(f"/api/v1/pools/{pool.pk}/", content_type="application/json")
    assert r.status_code == 400
    assert "1 waiting request" in r.json()["errors"]["confirm"][0]
    pool.refresh_from_db()
    assert pool.retired_at is None
    r = admin.delete(
        f"/api/v1/pools/{pool.pk}/",
        {"confirm": True, "move_to": "a100-train"},
        content_type="application/json",
    )
    assert r.status_code == 204, r.content
    pool.refresh_from_db()
    req.refresh_from_db()
    assert pool.retired_at is not None and pool.lifecycle == "maintenance"
    assert req.pool.name == "a100-train" and req.state == GpuRequest.State.PENDING
    event = AuditEvent.objects.get(action="pool.retire", object_id=str(pool.pk))
    assert event.after["moved"] == 1 and event.after["moved_to"] == "a100-train"
    # kept, not deleted: the request's history still names it
    assert Pool.objects.filter(pk=pool.pk).exists()


def test_a_retired_class_takes_no_new_requests_and_its_waiting_ones_are_cancelled(
    world: World,
) -> None:
    req = submit(world.bob, world.vision, cls="interactive", profile_kind="whole", count=1)
    wc = WorkloadClass.objects.get(name="interactive")
    r = api(world.dave).delete(
        f"/api/v1/classes/{wc.pk}/?confirm=true", content_type="application/json"
    )
    assert r.status_code == 204, r.content
    req.refresh_from_db()
    assert req.state == GpuRequest.State.CANCELLED
    body = {
        "team": "vision",
        "workload_class": "interactive",
        "profile": "whole",
        "count": 1,
        "image": "registry.example.com/train:1",
    }
    r = api(world.bob).post("/api/v1/requests/", body, content_type="application/json")
    assert r.status_code == 400
    assert "retired" in str(r.json()["errors"]["workload_class"])


def test_an_admin_changes_a_team_and_a_lead_may_not(world: World) -> None:
    url = f"/api/v1/teams/{world.vision.pk}/"
    r = api(world.alice).patch(url, {"weight": 5}, content_type="application/json")
    assert r.status_code == 403
    r = api(world.dave).patch(url, {"weight": 5}, content_type="application/json")
    assert r.status_code == 200, r.content
    event = AuditEvent.objects.get(action="team.update")
    assert (event.before["weight"], event.after["weight"]) == (1, 5)
    r = api(world.dave).patch(url, {"namespace": "Bad_NS"}, content_type="application/json")
    assert r.status_code == 400 and "namespace" in r.json()["errors"]


SHARED = {
    "name": "l40s-hami",
    "gpu_model": "NVIDIA-L40S",
    "gpu_memory_mib": 46068,
    "partitioning": "time-slicing",
    "time_slicing_replicas": 4,
    "sharing_engine": "hami",
    "node_selector": {"quartermaster.io/pool": "l40s-hami"},
}


def test_a_pool_declares_its_sharing_engine(world: World) -> None:
    admin = api(world.dave)
    r = admin.post("/api/v1/pools/", SHARED, content_type="application/json")
    assert r.status_code == 201, r.content
    assert Pool.objects.get(name="l40s-hami").sharing_engine == "hami"
    listed = {p["name"]: p for p in admin.get("/api/v1/pools/").json()}
    assert listed["l40s-hami"]["sharing_engine"] == "hami"
    assert listed["a100-train"]["sharing_engine"] == "none"


@pytest.mark.parametrize(
    "change",
    [{"sharing_engine": "magic"}, {"partitioning": "exclusive"}],
)
def test_a_bad_sharing_engine_is_a_400_naming_the_field(world: World, change: dict) -> None:
    r = api(world.dave).post(
        "/api/v1/pools/", {**SHARED, **change}, content_type="application/json"
    )
    assert r.status_code == 400, r.content
    assert "sharing_engine" in r.json()["errors"]
    assert not Pool.objects.filter(name="l40s-hami").exists()
