"""Test setup shared by every suite.

Tests run against PostgreSQL and Redis when DATABASE_URL / REDIS_URL are set
(as in CI), and against SQLite and a filesystem broker otherwise. Celery runs
eagerly unless a test starts a real worker. Passwords are hashed with MD5:
the production hasher (PBKDF2, hundreds of thousands of rounds) made most of
each test's setup time. The simulated cluster is the test world's
(tests/world_cluster.yaml), not the demo's.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
WORLD_CLUSTER = str(Path(__file__).resolve().parent / "world_cluster.yaml")
# For processes the tests start (a Celery worker); this one is set by _test_settings.
os.environ.setdefault("SIMULATED_CLUSTER", WORLD_CLUSTER)


@pytest.fixture(autouse=True, scope="session")
def _test_settings(tmp_path_factory: pytest.TempPathFactory) -> object:
    """Settings every test shares; override_settings so that cached hashers are reset."""
    from django.conf import settings
    from django.test.utils import override_settings

    # The throttles run in every test, at rates no test reaches unless it sets its own.
    rates = {"anon": "100000/min", "user": "100000/min", "token": "100000/min"}
    with override_settings(
        REST_FRAMEWORK={**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": rates},
        PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"],
        SIMULATED_CLUSTER=WORLD_CLUSTER,
        # The simulated cluster's checkpoint folders, out of the checkout's var/.
        SIMULATED_CHECKPOINT_DIR=str(tmp_path_factory.mktemp("checkpoints")),
        SIMULATED_LOG_DIR=str(tmp_path_factory.mktemp("logs")),
        # Mail goes to django.core.mail.outbox unless a test points it at an SMTP server.
        EMAIL_BACKEND="django.core.mail.backends.locmem.EmailBackend",
        # API throttles count in the cache: one per process, emptied per test.
        CACHES={"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}},
    ):
        yield


@pytest.fixture(autouse=True)
def _empty_cache() -> None:
    from django.core.cache import cache

    cache.clear()


@pytest.fixture(autouse=True)
def _eager_celery(settings: pytest.FixtureRequest) -> None:
    settings.CELERY_TASK_ALWAYS_EAGER = True  # type: ignore[attr-defined]
    from portal.celery import app

    app.conf.task_always_eager = True
    app.conf.task_eager_propagates = True
