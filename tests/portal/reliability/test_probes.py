"""The worker's and beat's probes read heartbeat files only (`manage.py probe`), so that a
broker outage restarts nothing; the chart runs them."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from portal.lib import heartbeat


@pytest.fixture(autouse=True)
def beats(settings: Any, tmp_path: Path) -> Path:
    settings.HEARTBEAT_DIR = str(tmp_path)
    return tmp_path


def _age(path: Path, seconds: float) -> None:
    path.touch()
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_it_passes_live_on_a_fresh_heartbeat_and_fails_on_a_stale_or_missing_one(
    beats: Path,
) -> None:
    with pytest.raises(CommandError, match="missing"):
        call_command("probe", "worker", "--live")
    heartbeat.touch(heartbeat.WORKER_ALIVE)
    call_command("probe", "worker", "--live")
    _age(beats / heartbeat.WORKER_ALIVE, 61)
    with pytest.raises(CommandError, match="stale"):
        call_command("probe", "worker", "--live")
    call_command("probe", "worker", "--live", "--max-age", "90")


def test_ready_also_needs_recent_work(beats: Path) -> None:
    heartbeat.touch(heartbeat.BEAT_ALIVE)
    with pytest.raises(CommandError, match="never"):
        call_command("probe", "beat", "--ready")
    _age(beats / heartbeat.BEAT_SENT, 121)
    with pytest.raises(CommandError, match="stale: a periodic task was sent"):
        call_command("probe", "beat", "--ready")
    heartbeat.touch(heartbeat.BEAT_SENT)
    call_command("probe", "beat", "--ready")


def test_beat_touches_sent_only_when_the_broker_took_the_task(
    beats: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from celery.beat import PersistentScheduler

    down = [True]

    def apply_async(
        self: object, entry: object, producer: object = None, advance: bool = True, **kw: object
    ) -> str:
        if down[0]:
            raise ConnectionError("redis is down")
        return "sent"

    monkeypatch.setattr(PersistentScheduler, "apply_async", apply_async)
    scheduler = heartbeat.HeartbeatScheduler.__new__(heartbeat.HeartbeatScheduler)
    with pytest.raises(ConnectionError):
        scheduler.apply_async(object())
    assert heartbeat.age(heartbeat.BEAT_SENT) is None
    down[0] = False
    assert scheduler.apply_async(object()) == "sent"
    assert heartbeat.age(heartbeat.BEAT_SENT) is not None


def test_a_succeeded_task_touches_the_worker_file(beats: Path) -> None:
    from celery import signals

    heartbeat.connect_worker_signals()
    signals.task_success.send(sender=None, result={})
    assert (heartbeat.age(heartbeat.WORKER_TASK) or 99) < 5
