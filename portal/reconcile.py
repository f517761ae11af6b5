"""The reconciler: re-drive everything in flight from what the cluster backend reports."""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import datetime

from django.utils import timezone

from portal import services
from portal.apply import count, launch_attempt
from portal.models import Attempt

log = logging.getLogger(__name__)


def reconcile(now: datetime | None = None) -> dict[str, int]:
    """Re-drive everything in flight: inventory, then each active attempt's status."""
    from portal.backends import get_backend

    backend = get_backend()
    counts: dict[str, int] = defaultdict(int)
    try:
        counts["nodes"] = services.inventory_sync(nodes=backend.inventory())
    except Exception:  # noqa: BLE001
        log.exception("inventory sync failed")
    now = now or timezone.now()
    for attempt in Attempt.objects.filter(state__in=Attempt.ACTIVE_STATES).order_by("id"):
        status = backend.status(attempt.workload_name, attempt.namespace)
        if status.outcome.value == "missing" and attempt.state == Attempt.State.ADMITTED:
            # Admitted but never created (a launch lost after commit): create it now.
            launch_attempt(attempt.pk)
            counts["relaunched"] += 1
            count("reconciler_repairs")
            continue
        if attempt.state == Attempt.State.STOPPING and status.outcome.value not in (
            "missing",
            "preempted",
        ):
            # Ask again: a stop lost after commit must not hold devices forever.
            services.backend_call(
                "stop", attempt.workload_name, attempt.namespace, services.STOP_GRACE_SECONDS
            )
            count("reconciler_repairs")
        new_state = services.attempt_observe(attempt_id=attempt.pk, status=status, now=now)
        counts[new_state] += 1
    return dict(counts)
