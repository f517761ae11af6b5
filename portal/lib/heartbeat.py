"""Heartbeat files of the worker and beat, read by their probes (`manage.py probe`).

Each is a file under settings.HEARTBEAT_DIR whose modification time is the
heartbeat; the probes read the files only, never the broker or the database,
so that a Redis or PostgreSQL outage restarts nothing.

- `worker-alive`: touched every ALIVE_SECONDS by a thread of the worker's main
  process (from `worker_ready`): the process runs.
- `worker-task`: touched when a task (a tick, a reconcile, ...) finished
  without an error in this worker: it consumes and its work succeeds.
- `beat-alive`: touched by each turn of beat's scheduler loop.
- `beat-sent`: touched when beat handed a periodic task (the tick) to the broker.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from celery import signals
from celery.beat import PersistentScheduler

log = logging.getLogger(__name__)

WORKER_ALIVE = "worker-alive"
WORKER_TASK = "worker-task"
BEAT_ALIVE = "beat-alive"
BEAT_SENT = "beat-sent"
#: how often the worker's main process touches its alive file, seconds
ALIVE_SECONDS = 10.0


def _dir() -> Path:
    from django.conf import settings

    return Path(settings.HEARTBEAT_DIR)


def touch(name: str) -> None:
    """Record a heartbeat now; a file that cannot be written is logged, never raised."""
    try:
        path = _dir() / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
        os.utime(path)
    except OSError:
        log.warning("could not write the heartbeat %s", name, exc_info=True)


def age(name: str, now: float | None = None) -> float | None:
    """Seconds since the heartbeat `name`, or None if it was never written."""
    try:
        mtime = (_dir() / name).stat().st_mtime
    except OSError:
        return None
    return max(0.0, (time.time() if now is None else now) - mtime)


def _alive_loop(stop: threading.Event) -> None:
    while not stop.is_set():
        touch(WORKER_ALIVE)
        stop.wait(ALIVE_SECONDS)


_stop = threading.Event()


def _on_worker_ready(**kwargs: Any) -> None:
    # In the worker's main process, after the pool's children were forked.
    touch(WORKER_ALIVE)
    threading.Thread(target=_alive_loop, args=(_stop,), name="heartbeat", daemon=True).start()


def _on_worker_shutdown(**kwargs: Any) -> None:
    _stop.set()


def _on_task_success(**kwargs: Any) -> None:
    touch(WORKER_TASK)


def connect_worker_signals() -> None:
    """Called by portal/tasks.py, which every worker imports before it is ready."""
    signals.worker_ready.connect(_on_worker_ready, weak=False, dispatch_uid="qm-heartbeat-ready")
    signals.worker_shutdown.connect(
        _on_worker_shutdown, weak=False, dispatch_uid="qm-heartbeat-shutdown"
    )
    signals.task_success.connect(_on_task_success, weak=False, dispatch_uid="qm-heartbeat-task")


class HeartbeatScheduler(PersistentScheduler):  # type: ignore[misc]  # Celery ships no types
    """Beat's scheduler (settings.CELERY_BEAT_SCHEDULER) with its heartbeats."""

    def tick(self, *args: Any, **kwargs: Any) -> float:
        interval = float(super().tick(*args, **kwargs))
        touch(BEAT_ALIVE)
        return interval

    def apply_async(
        self, entry: Any, producer: Any = None, advance: bool = True, **kwargs: Any
    ) -> Any:
        # Raises (and beat logs it) when the broker refuses the task: no heartbeat then.
        result = super().apply_async(entry, producer, advance, **kwargs)
        touch(BEAT_SENT)
        return result
