"""Redis is optional at run time (issue 32, item 1): with Redis unreachable the pages and the
API answer 2xx, /readyz checks only the database, the cache degrades to local memory and
comes back by itself, and a submit made meanwhile waits in the database for the next tick."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest
from django.conf import settings
from django.test import Client
from redis.exceptions import ConnectionError as RedisConnectionError

from portal.celery import app as celery_app
from portal.lib import cache as fallback
from portal.lib import wake
from portal.models import GpuRequest
from portal.tick.run import run_tick
from tests.base import World, api_secret, make_world

pytestmark = pytest.mark.django_db

# Nothing listens on port 1: a refused connection, as when Redis is stopped.
DEAD_REDIS = "redis://127.0.0.1:1/0"
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
def redis_down(settings: pytest.FixtureRequest) -> Iterator[None]:
    """The cache and the broker both point at a Redis that refuses connections."""
    settings.CACHES = {  # type: ignore[attr-defined]
        "default": {"BACKEND": "portal.lib.cache.FallbackRedisCache", "LOCATION": DEAD_REDIS}
    }
    old = celery_app.conf.broker_url, celery_app.conf.broker_write_url
    celery_app.conf.broker_url = celery_app.conf.broker_write_url = DEAD_REDIS
    celery_app.conf.task_always_eager = False
    wake._wake_due = 0.0
    wake._broker_retry_at = 0.0
    try:
        yield
    finally:
        celery_app.conf.broker_url, celery_app.conf.broker_write_url = old
        celery_app.conf.task_always_eager = True
        wake._broker_retry_at = 0.0


@pytest.fixture
def world() -> World:
    return make_world()


def test_it_answers_pages_and_the_api_with_redis_down(redis_down: None, world: World) -> None:
    secret = api_secret(world.bob)
    api = Client(HTTP_AUTHORIZATION=f"Token {secret}")
    started = time.monotonic()
    r = api.post("/api/v1/requests/", BODY, content_type="application/json")
    assert r.status_code == 201, r.content[:300]
    # The wake-up's refused publish costs little and the next submits do not retry it.
    for _ in range(5):
        assert (
            api.post("/api/v1/requests/", BODY, content_type="application/json").status_code == 201
        )
    assert time.monotonic() - started < 5
    assert api.get("/api/v1/requests/").status_code == 200
    page = Client()
    page.force_login(world.bob)
    assert page.get("/").status_code == 200
    assert page.get("/queue/").status_code == 200
    r = Client().get("/readyz")
    assert r.status_code == 200 and r.json() == {"ok": True, "database": "ok"}
    # The database kept every submit: the next tick (beat's, once Redis is back) schedules them.
    assert GpuRequest.objects.filter(state="pending").count() == 6
    run_tick()
    assert GpuRequest.objects.filter(state="admitted").count() == 6


def test_the_throttle_still_counts_in_memory_with_redis_down(
    redis_down: None, world: World, settings: pytest.FixtureRequest
) -> None:
    rates = {"anon": "100000/min", "user": "3/min", "token": "100000/min"}
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": rates}  # type: ignore[attr-defined]
    secret = api_secret(world.bob)
    api = Client(HTTP_AUTHORIZATION=f"Token {secret}")
    codes = [api.get("/api/v1/requests/").status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]


class _FlakyClient:
    """Stands for Django's Redis client: raises while `down`, else passes to the real one."""

    def __init__(self, real: object) -> None:
        self.real = real
        self.down = True
        self.calls = 0

    def __getattr__(self, name: str) -> object:
        def call(*args: object, **kwargs: object) -> object:
            self.calls += 1
            if self.down:
                raise RedisConnectionError(
                    "Error 111 connecting to 127.0.0.1:6379. Connection refused."
                )
            return getattr(self.real, name)(*args, **kwargs)

        return call


def test_the_cache_falls_back_logs_once_and_recovers_by_itself(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    url = getattr(settings, "REDIS_URL", "") or "redis://127.0.0.1:6379/0"
    clock = [100.0]
    monkeypatch.setattr(fallback.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(fallback, "_states", {})
    cache = fallback.FallbackRedisCache(url, {"KEY_PREFIX": "qm-test-fallback"})
    flaky = _FlakyClient(cache._cache)
    monkeypatch.setattr(cache, "_cache", flaky)
    # Django makes a cache object per thread: another thread's shares the outage and the memory.
    other = fallback.FallbackRedisCache(url, {"KEY_PREFIX": "qm-test-fallback"})
    monkeypatch.setattr(other, "_cache", flaky)
    with caplog.at_level(logging.WARNING, logger="portal.lib.cache"):
        cache.set("k", 1)
        assert cache.get("k") == 1 and cache.redis_down  # from memory
        assert cache.incr("k") == 2
        calls = flaky.calls
        assert other.redis_down and other.get("k") == 2 and flaky.calls == calls
        for _ in range(10):
            cache.get("k")
        assert flaky.calls == calls  # not retried before RETRY_SECONDS
        assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
        assert "unreachable" in caplog.records[0].message
        clock[0] += fallback.RETRY_SECONDS + 0.1
        cache.get("k")
        assert flaky.calls == calls + 1 and cache.redis_down  # tried once, still down
        flaky.down = False
        clock[0] += fallback.RETRY_SECONDS + 0.1
        cache.set("k", 7)
        assert not cache.redis_down
        assert cache.get("k") == 7  # from Redis again
    messages = [r.message for r in caplog.records]
    assert len(messages) == 2 and "reachable again" in messages[1]
    cache.delete("k")


def test_production_settings_use_the_fallback_cache_with_redis() -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import django; django.setup(); from django.conf import settings;"
        "print(settings.CACHES['default']['BACKEND'])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).resolve().parents[3],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "portal.settings", "REDIS_URL": DEAD_REDIS},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "portal.lib.cache.FallbackRedisCache"
