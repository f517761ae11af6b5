"""End to end through a real Celery worker: submit → tick → admitted → simulated run → succeeded.

The worker is a separate process on the configured broker (Redis when
REDIS_URL is set, as in CI; the filesystem broker otherwise) and the same
database the test writes to.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from portal.models import Allocation, GpuRequest, UsageRecord
from tests.base import make_world, submit

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.celery]

ROOT = Path(__file__).resolve().parents[3]


def _worker_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    db = connection.settings_dict
    if connection.vendor == "postgresql":
        user = f"{db['USER']}@" if db["USER"] else ""
        env["DATABASE_URL"] = (
            f"postgres://{user}{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
        )
    else:
        env.pop("DATABASE_URL", None)
        env["SQLITE_PATH"] = str(db["NAME"])
    env.update(
        TICK_SECONDS="1",
        SIMULATED_SECONDS_PER_HOUR="2",
        CELERY_TASK_ALWAYS_EAGER="false",
        DJANGO_SETTINGS_MODULE="portal.settings",
    )
    return env


def _wait_for(predicate, timeout: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.3)
    return False


def test_it_runs_a_request_to_success_through_a_real_worker(tmp_path: Path) -> None:
    from portal.celery import app

    w = make_world()
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "portal",
            "worker",
            "--beat",
            "--pool",
            "solo",
            "--schedule",
            str(tmp_path / "beat"),
            "--loglevel",
            "INFO",
        ],
        cwd=ROOT,
        env=_worker_env(tmp_path),
        stdout=open(tmp_path / "worker.log", "w"),
        stderr=subprocess.STDOUT,
    )
    try:
        # The submit wakes the tick through the real broker.
        app.conf.task_always_eager = False
        settings.CELERY_TASK_ALWAYS_EAGER = False
        req = submit(w.bob, w.vision, count=2, estimated_runtime_s=3600)

        def state() -> str:
            return GpuRequest.objects.get(pk=req.pk).state

        assert _wait_for(lambda: state() != "pending", 60), (tmp_path / "worker.log").read_text()[
            -3000:
        ]
        assert _wait_for(lambda: state() == "succeeded", 60), (tmp_path / "worker.log").read_text()[
            -3000:
        ]
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        app.conf.task_always_eager = True

    attempt = req.attempts.get()
    assert attempt.state == "succeeded" and attempt.released_at is not None
    assert not Allocation.objects.filter(attempt=attempt, active=True).exists()
    usage = UsageRecord.objects.get(attempt=attempt)
    assert usage.ended_at is not None and usage.charged
    assert Allocation.objects.filter(attempt=attempt).count() == 2
