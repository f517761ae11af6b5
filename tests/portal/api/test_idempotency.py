"""`Idempotency-Key` on POST /api/v1/requests/: one key, one request, the first answer again."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import time_machine
from django.db import connection
from django.test import Client
from django.utils import timezone

from portal.models import GpuRequest, IdempotencyKey
from tests.base import World, api_secret, make_world

BODY = {
    "team": "vision",
    "workload_class": "training",
    "pool": "a100-train",
    "profile": "whole",
    "count": 1,
    "image": "registry.example.com/vision/train:1.0",
    "command": ["python", "train.py"],
}


@pytest.fixture
def world(db) -> World:  # noqa: ANN001
    return make_world()


def post(client: Client, key: str | None, body: dict | None = None):  # noqa: ANN201
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
    return client.post(
        "/api/v1/requests/", body or BODY, content_type="application/json", **headers
    )


@pytest.mark.django_db
def test_the_same_key_twice_creates_one_request_and_answers_the_first_again(world: World) -> None:
    client = Client(HTTP_AUTHORIZATION=f"Bearer {api_secret(world.bob)}")
    first = post(client, "run-42")
    assert first.status_code == 201
    again = post(client, "run-42")
    assert again.status_code == 201
    assert again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true"
    assert GpuRequest.objects.count() == 1
    # Without a key, or with another one, each submit is a new request.
    assert post(client, "run-43").json()["id"] != first.json()["id"]
    post(client, None)
    assert GpuRequest.objects.count() == 3


@pytest.mark.django_db
def test_keys_are_per_user(world: World) -> None:
    bob = Client(HTTP_AUTHORIZATION=f"Bearer {api_secret(world.bob)}")
    alice = Client(HTTP_AUTHORIZATION=f"Bearer {api_secret(world.alice)}")
    assert post(bob, "k").json()["id"] != post(alice, "k").json()["id"]
    assert GpuRequest.objects.count() == 2


@pytest.mark.django_db
def test_the_same_key_with_another_body_is_refused(world: World) -> None:
    client = Client(HTTP_AUTHORIZATION=f"Bearer {api_secret(world.bob)}")
    post(client, "k")
    r = post(client, "k", {**BODY, "count": 2})
    assert r.status_code == 422
    assert r["Content-Type"] == "application/problem+json"
    assert r.json()["code"] == "idempotency_key_reused"
    assert GpuRequest.objects.count() == 1


@pytest.mark.django_db
def test_a_refused_submit_does_not_use_up_the_key(world: World) -> None:
    client = Client(HTTP_AUTHORIZATION=f"Bearer {api_secret(world.bob)}")
    bad = post(client, "k", {**BODY, "count": 0})
    assert bad.status_code == 400 and "count" in bad.json()["errors"]
    assert not IdempotencyKey.objects.exists()
    assert post(client, "k", {**BODY, "count": 0}).status_code == 400


@pytest.mark.django_db
def test_a_key_is_remembered_for_24_hours(world: World) -> None:
    client = Client(HTTP_AUTHORIZATION=f"Bearer {api_secret(world.bob)}")
    first = post(client, "nightly").json()["id"]
    with time_machine.travel(timezone.now() + timedelta(hours=23)):
        assert post(client, "nightly").json()["id"] == first
    with time_machine.travel(timezone.now() + timedelta(hours=24, minutes=1)):
        client = Client(HTTP_AUTHORIZATION=f"Bearer {api_secret(world.bob)}")
        assert post(client, "nightly").json()["id"] != first
    assert GpuRequest.objects.count() == 2


@pytest.mark.django_db
def test_a_bad_key_is_a_400_naming_the_header(world: World) -> None:
    client = Client(HTTP_AUTHORIZATION=f"Bearer {api_secret(world.bob)}")
    r = post(client, "x" * 256)
    assert r.status_code == 400 and "Idempotency-Key" in r.json()["errors"]
    assert not GpuRequest.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(
    "connection.vendor != 'postgresql'", reason="concurrent writers: SQLite runs one at a time"
)
def test_racing_submits_with_one_key_create_one_request(world: World) -> None:
    secret = api_secret(world.bob)
    answers: list[int] = []
    barrier = threading.Barrier(4)

    def race() -> None:
        try:
            client = Client(HTTP_AUTHORIZATION=f"Bearer {secret}")
            barrier.wait()
            r = post(client, "race")
            answers.append(r.json()["id"] if r.status_code == 201 else -r.status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=race) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(answers) == 4 and len(set(answers)) == 1 and answers[0] > 0, answers
    assert GpuRequest.objects.count() == 1


@pytest.mark.django_db
def test_the_daily_sweep_forgets_keys_past_24_hours(world: World) -> None:
    from portal.services.idempotency import idempotency_keys_prune

    client = Client(HTTP_AUTHORIZATION=f"Bearer {api_secret(world.bob)}")
    post(client, "old")
    assert idempotency_keys_prune() == 0
    assert idempotency_keys_prune(now=timezone.now() + timedelta(hours=25)) == 1
    assert not IdempotencyKey.objects.exists()
