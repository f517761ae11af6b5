"""CPU and memory too large for every node are blamed on CPU or memory, at once.

The API accepted such a request and the next tick failed it as "no node … can hold 1 whole GPU".
"""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.test import Client

from portal.models import AuditEvent, GpuRequest
from tests.base import World, make_world, submit

pytestmark = pytest.mark.django_db

# a100-train's nodes have 128 CPUs and 1 TiB of memory each (tests/world_cluster.yaml)
TOO_MUCH_CPU = 129_000
TOO_MUCH_MEMORY = 1_048_577


@pytest.fixture
def world() -> World:
    return make_world()


def _client(user: object) -> Client:
    c = Client()
    c.force_login(user)  # type: ignore[arg-type]
    return c


@pytest.mark.parametrize(
    ("kwargs", "field", "words"),
    [
        ({"cpu_milli": TOO_MUCH_CPU}, "cpu_milli", "128 CPUs"),
        ({"memory_mib": TOO_MUCH_MEMORY}, "memory_mib", "1024 GiB"),
    ],
)
def test_a_submit_too_large_for_every_node_is_refused_naming_the_resource(
    world: World, kwargs: dict[str, int], field: str, words: str
) -> None:
    before = GpuRequest.objects.count(), AuditEvent.objects.count()
    with pytest.raises(ValidationError) as exc:
        submit(world.bob, world.vision, **kwargs)
    message = " ".join(exc.value.message_dict[field])
    assert words in message and "a100-train" in message
    assert (GpuRequest.objects.count(), AuditEvent.objects.count()) == before


def test_what_the_largest_node_holds_is_accepted(world: World) -> None:
    req = submit(world.bob, world.vision, cpu_milli=128_000, memory_mib=1_048_576)
    assert req.state == GpuRequest.State.PENDING


def test_the_api_answers_400_on_cpu_and_the_preview_blames_cpu(world: World) -> None:
    body = {
        "team": "vision",
        "workload_class": "training",
        "pool": "a100-train",
        "profile": "whole",
        "count": 1,
        "image": "registry.example.com/vision/train:1.0",
        "cpu_milli": TOO_MUCH_CPU,
    }
    c = _client(world.bob)
    r = c.post("/api/v1/requests/", body, content_type="application/json")
    assert r.status_code == 400 and "cpu_milli" in str(r.json()), r.content
    assert GpuRequest.objects.count() == 0
    preview = {k: body[k] for k in ("team", "workload_class", "pool", "profile", "count")}
    r = c.post(
        "/api/v1/requests/preview/",
        {**preview, "cpu_milli": TOO_MUCH_CPU},
        content_type="application/json",
    )
    assert r.status_code == 200
    assert r.json()["outcome"] == "rejected" and "128 CPUs" in r.json()["message"], r.json()
    assert "GPU" not in r.json()["message"]


def test_the_request_shows_the_cpu_and_memory_asked_for(world: World) -> None:
    req = submit(world.bob, world.vision, cpu_milli=8000, memory_mib=65536)
    data = _client(world.bob).get(f"/api/v1/requests/{req.pk}/").json()
    assert data["cpu_milli"] == 8000 and data["memory_mib"] == 65536
    page = _client(world.bob).get(f"/requests/{req.pk}/").content.decode()
    assert "8 CPUs" in page and "64 GiB" in page
