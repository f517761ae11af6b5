"""Test setup shared by every suite.

Tests run against PostgreSQL and Redis when DATABASE_URL / REDIS_URL are set
(as in CI), and against SQLite and a filesystem broker otherwise. Celery runs
eagerly unless a test starts a real worker.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


@pytest.fixture(autouse=True)
def _eager_celery(settings: pytest.FixtureRequest) -> None:
    settings.CELERY_TASK_ALWAYS_EAGER = True  # type: ignore[attr-defined]
    from portal.celery import app

    app.conf.task_always_eager = True
    app.conf.task_eager_propagates = True
