"""Logs and events over the API: the request page's tail and events, a gang's pods, a followed
stream, authorized like the page; a request that never ran says so."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from portal.models import GpuRequest, SimulatedWorkload
from portal.selectors import requests as selectors
from portal.services.requests import gpu_request_cancel
from portal.tick.reconcile import reconcile
from portal.tick.run import run_tick
from tests.base import World, api_secret, make_world, submit

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def world() -> World:
    return make_world()


def api(user: Any) -> Client:
    """A client that sends the token as `Bearer`, as the command line does."""
    secret = api_secret(user)
    return Client(HTTP_AUTHORIZATION=f"Bearer {secret}")


def _advance(req: GpuRequest, seconds: float) -> None:
    """Run the request's simulated workloads forward by moving their clocks."""
    for w in SimulatedWorkload.objects.filter(
        name__startswith=req.attempts.order_by("-number").first().workload_name  # type: ignore[union-attr]
    ):
        SimulatedWorkload.objects.filter(pk=w.pk).update(
            created_at=w.created_at - timedelta(seconds=seconds),
            starts_at=w.starts_at - timedelta(seconds=seconds),
            ends_at=w.ends_at - timedelta(seconds=seconds),
        )


def _running(world: World, **kw: Any) -> GpuRequest:
    req = submit(world.bob, world.vision, estimated_runtime_s=36_000, **kw)
    run_tick()
    _advance(req, 6)
    reconcile()
    req.refresh_from_db()
    assert req.state == GpuRequest.State.RUNNING
    return req


def test_it_reads_the_log_tail_with_a_bearer_token(world: World) -> None:
    req = _running(world)
    r = api(world.bob).get(f"/api/v1/requests/{req.pk}/logs/")
    assert r.status_code == 200, r.content
    data = r.json()
    assert data["request"] == req.pk and data["attempt"] == 1
    assert data["pod"] == 0 and data["pods"] == 1 and data["live"] is True
    assert "epoch 1 step 3 loss" in data["text"]
    r = api(world.bob).get(f"/api/v1/requests/{req.pk}/logs/?tail=2")
    lines = r.json()["text"].splitlines()
    assert len(lines) == 2 and lines[-1].startswith("epoch 1 step ")


def test_it_reads_each_pod_of_a_gang(world: World) -> None:
    req = _running(world, count=8, pods=2, cpu_milli=16000, memory_mib=65536)
    name = req.attempts.get().workload_name
    c = api(world.bob)
    for rank in (0, 1):
        r = c.get(f"/api/v1/requests/{req.pk}/logs/?pod={rank}")
        assert r.status_code == 200
        assert r.json()["pods"] == 2
        assert r.json()["text"].startswith(f"[qm] {name}-{rank} on ")
    r = c.get(f"/api/v1/requests/{req.pk}/logs/?pod=2")
    assert r.status_code == 400 and "0 to 1" in r.json()["errors"]["pod"][0]


@pytest.mark.parametrize(
    ("query", "field"), [("tail=lots", "tail"), ("tail=-1", "tail"), ("pod=x", "pod")]
)
def test_it_answers_400_naming_the_parameter(world: World, query: str, field: str) -> None:
    req = _running(world)
    r = api(world.bob).get(f"/api/v1/requests/{req.pk}/logs/?{query}")
    assert r.status_code == 400 and field in r.json()["errors"]


def test_it_lists_the_workloads_events(world: World) -> None:
    req = _running(world)
    r = api(world.bob).get(f"/api/v1/requests/{req.pk}/events/")
    assert r.status_code == 200
    data = r.json()
    assert data["attempt"] == 1
    reasons = [e["reason"] for e in data["events"]]
    assert {"Scheduled", "Pulled", "Started"} <= set(reasons)
    assert set(data["events"][0]) == {"at", "type", "reason", "message", "object"}


def test_another_teams_member_gets_404_the_team_and_admins_read(world: World) -> None:
    req = _running(world)
    for path in ("logs", "events"):
        url = f"/api/v1/requests/{req.pk}/{path}/"
        r = api(world.carol).get(url)
        assert r.status_code == 404
        assert b"epoch" not in r.content and b"Scheduled" not in r.content
        for user in (world.alice, world.dave):
            assert api(user).get(url).status_code == 200
    assert api(world.carol).get(f"/api/v1/requests/{req.pk}/logs/?follow=1").status_code == 404
    assert Client().get(f"/api/v1/requests/{req.pk}/logs/").status_code in (401, 403)


def test_a_request_that_never_ran_says_so(world: World) -> None:
    for i in range(5):
        submit(world.bob, world.vision, count=8, name=f"big-{i}")
    run_tick()
    waiting = GpuRequest.objects.filter(state=GpuRequest.State.PENDING).first()
    assert waiting is not None
    c = api(world.bob)
    r = c.get(f"/api/v1/requests/{waiting.pk}/logs/")
    assert r.status_code == 409
    assert r.json()["detail"] == f"Request #{waiting.pk} has not run yet, so it has no log."
    r = c.get(f"/api/v1/requests/{waiting.pk}/events/")
    assert r.status_code == 200 and r.json() == {
        "request": waiting.pk,
        "attempt": None,
        "events": [],
    }
    # The page's download says it in words too, not with an empty file.
    page = Client()
    page.force_login(world.bob)
    r = page.get(reverse("portal:request-logs-download", args=[waiting.pk]))
    assert r.status_code == 404
    assert "Content-Disposition" not in r
    assert b"has not run yet, so it has no log" in r.content


def test_a_followed_log_streams_new_lines_until_the_request_ends(world: World) -> None:
    req = _running(world)
    polls: list[float] = []

    def sleep(seconds: float) -> None:
        # Between polls the workload prints three more lines; on the third poll it is cancelled.
        polls.append(seconds)
        _advance(req, 3)
        if len(polls) == 3:
            gpu_request_cancel(user=world.bob, gpu_request=req)
            reconcile()

    lines = list(
        "".join(selectors.request_log_follow(req.pk, tail_lines=2, sleep=sleep)).splitlines()
    )
    steps = [int(x.split()[3]) for x in lines if x.startswith("epoch 1 step ")]
    # The tail asked for, then each line once, in order, with none skipped.
    assert steps == list(range(steps[0], steps[-1] + 1))
    assert steps[-1] - steps[0] >= 8
    assert len(polls) >= 3
    req.refresh_from_db()
    assert req.state == GpuRequest.State.CANCELLED


def test_a_followed_log_of_an_ended_request_is_its_whole_tail(world: World) -> None:
    req = _running(world)
    gpu_request_cancel(user=world.bob, gpu_request=req)
    reconcile()
    r = api(world.bob).get(f"/api/v1/requests/{req.pk}/logs/?follow=1")
    assert r.status_code == 200 and r["Content-Type"].startswith("text/plain")
    body = b"".join(r.streaming_content).decode()  # type: ignore[attr-defined]
    assert "epoch 1 step 3 loss" in body


def test_a_reconnecting_follower_gets_the_lines_after_those_it_has(world: World) -> None:
    req = _running(world)
    gpu_request_cancel(user=world.bob, gpu_request=req)
    reconcile()
    lines = api(world.bob).get(f"/api/v1/requests/{req.pk}/logs/?tail=5").json()["text"]
    have = lines.splitlines()[:2]
    r = api(world.bob).get(
        f"/api/v1/requests/{req.pk}/logs/", {"follow": "1", "tail": "1", "after": have}
    )
    body = b"".join(r.streaming_content).decode()  # type: ignore[attr-defined]
    assert body.splitlines() == lines.splitlines()[2:]
    # Lines the log no longer holds: the stream starts with the tail.
    r = api(world.bob).get(
        f"/api/v1/requests/{req.pk}/logs/", {"follow": "1", "tail": "1", "after": ["gone"]}
    )
    body = b"".join(r.streaming_content).decode()  # type: ignore[attr-defined]
    assert body.splitlines() == lines.splitlines()[-1:]
    r = api(world.bob).get(f"/api/v1/requests/{req.pk}/logs/", {"follow": "1", "after": ["x"] * 21})
    assert r.status_code == 400 and "after" in r.json()["errors"]


def test_a_followed_stream_ends_after_its_time_even_while_the_request_runs(
    world: World,
) -> None:
    req = _running(world)
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    chunks = list(
        selectors.request_log_follow(
            req.pk, tail_lines=1, max_s=10, poll_s=2, sleep=sleep, clock=lambda: now[0]
        )
    )
    assert len(chunks) == 1 and now[0] == 10  # the tail, then five quiet polls
    req.refresh_from_db()
    assert req.state == GpuRequest.State.RUNNING


def test_it_continues_where_the_last_read_ended() -> None:
    seen = ["a", "b", "c"]
    assert selectors._continues(seen, ["b", "c", "d", "e"]) == ["d", "e"]
    assert selectors._continues(seen, ["c", "d"]) == ["d"]
    assert selectors._continues(seen, ["x", "y"]) == ["x", "y"]  # a gap: sent whole
    assert selectors._continues([], ["x"]) == ["x"]
    assert selectors._continues(seen, ["a", "b", "c"]) == []


def test_the_detail_names_the_latest_attempt_and_the_wait(world: World) -> None:
    req = _running(world)
    data = api(world.bob).get(f"/api/v1/requests/{req.pk}/").json()
    attempt = data["latest_attempt"]
    assert attempt["number"] == 1 and attempt["state"] == "running"
    assert attempt["pool"] == "a100-train" and len(attempt["nodes"]) == 1
    assert [w["reason"] for w in data["wait"]] == [
        "unschedulable",
        "quota",
        "capacity",
        "provisioning",
        "backoff",
    ]
