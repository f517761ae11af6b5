"""Thin Celery tasks: the database holds the truth, these only wake things up."""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any

from celery import shared_task
from django.conf import settings

log = logging.getLogger(__name__)


@shared_task(name="portal.tasks.tick", ignore_result=True)
def tick() -> dict[str, object]:
    from portal.tick import run_tick

    result = run_tick()
    return {"ran": result.ran, "admitted": result.admitted, "preempted": result.preempted}


#: At most one tick is enqueued per this many seconds per web process; beat ticks every TICK_SECONDS anyway.
WAKE_COALESCE_SECONDS = 1.0
_wake_lock = threading.Lock()
_wake_due = 0.0  # time.monotonic() at which the latest tick this process enqueued becomes due


def wake_tick() -> None:
    """Ask for a tick soon after now, coalescing bursts (call it after the commit that needs scheduling).

    A broker round trip per submit costs more than the submit's own queries, so each
    process enqueues at most one tick per WAKE_COALESCE_SECONDS. It stays correct:
    a wake is skipped only while a tick this process enqueued is still due in the
    future, so that tick starts after the caller's commit. Otherwise the tick is
    enqueued now, or, within the window of the previous one, with a countdown to
    the window's end; every wake is followed by a tick within about a second. Eager
    mode (tests) ticks on every call. If the broker is down, nothing is recorded and
    beat's next tick does the work.
    """
    global _wake_due
    if tick.app.conf.task_always_eager:
        _safe_enqueue(tick.delay)
        return
    with _wake_lock:
        now = time.monotonic()
        if _wake_due > now:
            return
        due = max(now, _wake_due + WAKE_COALESCE_SECONDS)
        delay = due - now
        if delay <= 0.001:
            sent = _safe_enqueue(tick.delay)
        else:
            sent = _safe_enqueue(lambda: tick.apply_async(countdown=delay))
        if sent:
            _wake_due = due


def _safe_enqueue(send: Any) -> bool:
    # The broker only wakes things up: if it is down, beat's next tick does the work.
    try:
        send()
    except Exception:  # noqa: BLE001
        log.warning(
            "could not enqueue portal.tasks.tick; the periodic tick will pick the work up",
            exc_info=True,
        )
        return False
    return True


@shared_task(name="portal.tasks.reconcile", ignore_result=True)
def reconcile() -> dict[str, int]:
    from portal.reconcile import reconcile as reconcile_now

    counts = reconcile_now()
    if any(counts.get(k) for k in ("succeeded", "failed", "preempted", "node_lost", "cancelled")):
        # Devices came back: schedule now rather than at the next beat.
        tick.delay()
    return counts


@shared_task(name="portal.tasks.decisions_prune", ignore_result=True)
def decisions_prune() -> int:
    from portal.retention import decisions_prune as prune

    return prune()


@shared_task(name="portal.tasks.demo_trickle", ignore_result=True)
def demo_trickle() -> int:
    """Submit a synthetic request now and then so the demo queue visibly moves."""
    if not settings.DEMO_TRICKLE:
        return 0
    from portal.demo import submit_synthetic

    return submit_synthetic(rng=random.Random())
