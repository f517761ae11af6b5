"""wake.wake_tick: submits wake the tick through the broker, coalesced to one enqueue per window per process."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from portal import tasks
from portal.lib import wake


class _Broker:
    def __init__(self) -> None:
        self.sent: list[float] = []  # countdowns; 0.0 for delay()
        self.down = False

    def delay(self) -> None:
        if self.down:
            raise ConnectionError("redis is down")
        self.sent.append(0.0)

    def apply_async(self, countdown: float = 0.0, **kwargs: Any) -> None:
        if self.down:
            raise ConnectionError("redis is down")
        self.sent.append(round(countdown, 3))


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[_Broker, list[float]]]:
    b, clock = _Broker(), [1000.0]
    monkeypatch.setattr(tasks.tick, "delay", b.delay)
    monkeypatch.setattr(tasks.tick, "apply_async", b.apply_async)
    monkeypatch.setattr(wake.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(wake, "_wake_due", 0.0)
    monkeypatch.setattr(wake, "_broker_retry_at", 0.0)
    tasks.tick.app.conf.task_always_eager = False  # as with a real broker
    yield b, clock
    tasks.tick.app.conf.task_always_eager = True  # as tests/conftest.py sets it


def test_a_burst_of_wakes_enqueues_one_tick_now_and_one_at_the_end_of_the_window(
    broker: tuple[_Broker, list[float]],
) -> None:
    b, clock = broker
    wake.wake_tick()
    assert b.sent == [0.0]  # the first wake: a tick right away
    clock[0] += 0.1
    wake.wake_tick()
    assert b.sent == [0.0, 0.9]  # that tick may already have run: one more, due at the window's end
    for _ in range(50):
        clock[0] += 0.01
        wake.wake_tick()
    assert b.sent == [0.0, 0.9]  # a tick is still due after each of these commits: nothing more
    clock[0] = 1001.2  # the tick due at 1001.0 may have run before this commit
    wake.wake_tick()
    assert b.sent == [0.0, 0.9, 0.8]
    clock[0] = 1010.0
    wake.wake_tick()
    assert b.sent == [0.0, 0.9, 0.8, 0.0]  # quiet for a while: right away again


def test_every_wake_is_followed_by_a_tick_due_after_it(broker: tuple[_Broker, list[float]]) -> None:
    b, clock = broker
    due: list[float] = []
    sent = 0
    for step in range(400):
        clock[0] = 1000.0 + step * 0.037
        wake.wake_tick()
        if len(b.sent) > sent:
            due.append(clock[0] + b.sent[-1])
            sent = len(b.sent)
        assert any(d >= clock[0] for d in due)
        assert max(due) - clock[0] <= wake.WAKE_COALESCE_SECONDS + 1e-9
    assert len(b.sent) <= 400 * 0.037 / wake.WAKE_COALESCE_SECONDS + 2


def test_a_broker_outage_records_nothing_and_the_wake_is_tried_again_later(
    broker: tuple[_Broker, list[float]],
) -> None:
    b, clock = broker
    b.down = True
    wake.wake_tick()  # logged, not raised: beat's next tick does the work
    b.down = False
    clock[0] += 0.1
    wake.wake_tick()  # within BROKER_RETRY_SECONDS: not tried, so a stream of submits pays once
    assert b.sent == []
    clock[0] += wake.BROKER_RETRY_SECONDS
    wake.wake_tick()
    assert b.sent == [0.0]


def test_eager_mode_ticks_on_every_wake(broker: tuple[_Broker, list[float]]) -> None:
    b, _ = broker
    tasks.tick.app.conf.task_always_eager = True
    for _ in range(3):
        wake.wake_tick()
    assert b.sent == [0.0, 0.0, 0.0]


def test_a_fresh_process_finds_the_tick_task_by_name() -> None:
    """Services wake the tick by name: a web or management process has not imported the tasks."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import django; django.setup(); import sys; from portal.lib import wake;"
        "assert 'portal.tasks' not in sys.modules; print(wake._tick().name)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).resolve().parents[3],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "portal.settings"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "portal.tasks.tick"
