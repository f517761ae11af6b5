"""The reconciler: re-drive everything in flight from what the cluster backend reports."""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from portal.backends.base import STORED_LOG_LINES
from portal.models import Attempt
from portal.services.attempts import (
    STOP_GRACE_SECONDS,
    attempt_end_unlaunched,
    attempt_launch,
    attempt_observe,
    backend_call,
)
from portal.services.checkpoints import checkpoints_release
from portal.services.nodes import inventory_sync
from portal.tick.apply import count

log = logging.getLogger(__name__)

RECONCILE_LOCK_KEY = 0x51_4D_52_45_43  # "QMREC"
#: where there are no advisory locks (SQLite: one process in development), a process lock
_reconcile_local = threading.Lock()


@contextmanager
def reconcile_lock() -> Iterator[bool]:
    """Hold the reconcile lock while inside; yields False when another reconcile holds it.

    Two reconciles at once (beat's, and one woken after a tick) would observe the same
    attempt twice and could launch a lost Job twice. On PostgreSQL a session advisory lock
    (the reconcile spans many transactions), elsewhere a process-local lock.
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_lock(%s)", [RECONCILE_LOCK_KEY])
            got = bool(cur.fetchone()[0])
        try:
            yield got
        finally:
            if got:
                with connection.cursor() as cur:
                    cur.execute("SELECT pg_advisory_unlock(%s)", [RECONCILE_LOCK_KEY])
        return
    got = _reconcile_local.acquire(blocking=False)
    try:
        yield got
    finally:
        if got:
            _reconcile_local.release()


def reconcile(now: datetime | None = None) -> dict[str, int]:
    """Re-drive everything in flight (inventory, then each active attempt's status), unless
    another reconcile is at it: then nothing, `{"skipped": 1}`."""
    with reconcile_lock() as got:
        if not got:
            return {"skipped": 1}
        return _reconcile(now)


def _reconcile(now: datetime | None) -> dict[str, int]:
    from portal.backends import get_backend

    backend = get_backend()
    counts: dict[str, int] = defaultdict(int)
    try:
        counts["nodes"] = inventory_sync(nodes=backend.inventory())
    except Exception:  # noqa: BLE001
        log.exception("inventory sync failed")
    now = now or timezone.now()
    for attempt in Attempt.objects.filter(state__in=Attempt.ACTIVE_STATES).order_by("id"):
        pods = max(1, len(attempt.nodes))
        status = backend.status(attempt.workload_name, attempt.namespace, pods)
        if status.outcome.value == "missing" and attempt.state == Attempt.State.ADMITTED:
            # Admitted but never created (a launch lost after commit, or one the backend
            # failed): create it again, with backoff, a bounded number of times.
            if attempt.launch_tries >= settings.LAUNCH_RETRY_LIMIT:
                attempt_end_unlaunched(
                    attempt.pk,
                    code="launch-failed",
                    reason=f"its workload could not be created after {attempt.launch_tries} tries",
                    requeue=True,
                    now=now,
                )
                counts["launch_gave_up"] += 1
                continue
            if attempt.next_launch_at is not None and attempt.next_launch_at > now:
                counts["launch_backoff"] += 1
                continue
            attempt_launch(attempt.pk, now=now)
            counts["relaunched"] += 1
            count("reconciler_repairs")
            continue
        if attempt.state == Attempt.State.STOPPING and status.outcome.value not in (
            "missing",
            "preempted",
        ):
            # Ask again: a stop lost after commit must not hold devices forever.
            backend_call(
                "stop",
                attempt.workload_name,
                attempt.namespace,
                STOP_GRACE_SECONDS,
                pods,
            )
            count("reconciler_repairs")
        new_state = attempt_observe(
            attempt_id=attempt.pk,
            status=status,
            now=now,
            log_tail=_log_tail(backend, attempt, status),
        )
        counts[new_state] += 1
    released = checkpoints_release()
    if released:
        counts["checkpoints_deleted"] = released
    return dict(counts)


def _log_tail(backend: Any, attempt: Attempt, status: Any) -> str:
    """The workload's last lines once it has ended (kept on the attempt), read before the
    observe's transaction; "" while it runs, or if the backend cannot say. Of a gang, the
    pod whose ending the status reports: the one that failed says why."""
    if status.outcome.value in ("running", "pending"):
        return ""
    try:
        return str(
            backend.logs(
                attempt.workload_name,
                attempt.namespace,
                STORED_LOG_LINES,
                max(1, len(attempt.nodes)),
                min(status.pod, max(0, len(attempt.nodes) - 1)),
            )
        )
    except Exception:  # noqa: BLE001 - the log is a courtesy; the ending must still be recorded
        log.warning("could not read the log of %s", attempt.workload_name, exc_info=True)
        return ""
