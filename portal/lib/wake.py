"""Wake the scheduler after a commit that needs a tick, coalescing bursts; hand the
tick's admissions to the launch task.

The tasks are enqueued by their names through the Celery app (registered by
portal/tasks.py), so that services can wake them without importing the task
layer above them.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from celery.exceptions import NotRegistered

from portal.celery import app

log = logging.getLogger(__name__)

# The name of every Celery task, in one place: `portal/tasks.py` registers each task under its
# constant and callers send by the constant, so "find usages" leads from a call to its task.
TICK_TASK = "portal.tasks.tick"
LAUNCH_TASK = "portal.tasks.launch"
RECONCILE_TASK = "portal.tasks.reconcile"
NOTIFY_TASK = "portal.tasks.notify"
NOTIFY_LONG_WAITS_TASK = "portal.tasks.notify_long_waits"
DECISIONS_PRUNE_TASK = "portal.tasks.decisions_prune"
DEMO_TRICKLE_TASK = "portal.tasks.demo_trickle"
SERVING_SAMPLE_TASK = "portal.tasks.serving_sample"
UTILIZATION_TASK = "portal.tasks.utilization"
ROLLOUTS_TICK_TASK = "portal.tasks.rollouts_tick"
WHATIF_TASK = "portal.tasks.whatif_run"


_discover_lock = threading.Lock()


def _tick() -> Any:
    return _task(TICK_TASK)


def _task(name: str) -> Any:
    try:
        return app.tasks[name]
    except NotRegistered:
        # Celery discovers tasks lazily (a worker imports them when it starts); a web or
        # management process has not yet: discover them now, once. Under the lock, so that a
        # second request thread waits for the import instead of finding portal.tasks half
        # imported and the task not yet registered (a 500 on the first submits).
        with _discover_lock:
            try:
                return app.tasks[name]
            except NotRegistered:
                app.loader.import_default_modules()
                return app.tasks[name]


#: At most one tick is enqueued per this many seconds per web process; beat ticks every TICK_SECONDS anyway.
WAKE_COALESCE_SECONDS = 1.0
_wake_lock = threading.Lock()
_wake_due = 0.0  # time.monotonic() at which the latest tick this process enqueued becomes due
#: After the broker refused a wake, this process sends none for this many seconds: each submit
#: of a steady stream would otherwise pay a refused publish, and beat's next tick does the work.
BROKER_RETRY_SECONDS = 2.0
_broker_retry_at = 0.0  # time.monotonic() before which wakes are not sent


def wake_tick() -> None:
    """Ask for a tick soon after now, coalescing bursts (call it after the commit that needs scheduling).

    A broker round trip per submit costs more than the submit's own queries, so each
    process enqueues at most one tick per WAKE_COALESCE_SECONDS. It stays correct:
    a wake is skipped only while a tick this process enqueued is still due in the
    future, so that tick starts after the caller's commit. Otherwise the tick is
    enqueued now, or, within the window of the previous one, with a countdown to
    the window's end; every wake is followed by a tick within about a second. Eager
    mode (tests) ticks on every call. If the broker is down, nothing is recorded, no
    wake is sent for BROKER_RETRY_SECONDS, and beat's next tick (once the broker is
    back) finds the request in the database.
    """
    global _wake_due, _broker_retry_at
    tick = _tick()
    if app.conf.task_always_eager:
        _safe_enqueue(tick.delay)
        return
    with _wake_lock:
        now = time.monotonic()
        if _wake_due > now or _broker_retry_at > now:
            return
        due = max(now, _wake_due + WAKE_COALESCE_SECONDS)
        delay = due - now
        if delay <= 0.001:
            sent = _safe_enqueue(tick.delay)
        else:
            sent = _safe_enqueue(lambda: tick.apply_async(countdown=delay))
        if sent:
            _wake_due = due
        else:
            _broker_retry_at = time.monotonic() + BROKER_RETRY_SECONDS


def enqueue(name: str, *args: Any) -> bool:
    """Send a task now; False (logged) when the broker cannot take it, so the caller can
    do the work itself."""
    task = _task(name)
    return _safe_enqueue(lambda: task.delay(*args), name)


def _safe_enqueue(send: Any, name: str = TICK_TASK) -> bool:
    # The broker only wakes things up: if it is down, beat's next tick does the work.
    try:
        send()
    except Exception:  # noqa: BLE001
        log.warning("could not enqueue %s", name, exc_info=True)
        return False
    return True
