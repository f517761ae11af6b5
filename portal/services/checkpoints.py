"""Checkpoints a workload reports (docs/checkpoints.md): recorded, and released with their attempt."""

from __future__ import annotations

import hmac
import logging
from datetime import datetime

from django.core.exceptions import PermissionDenied
from django.db.models import F, Q
from django.utils import timezone

from portal.backends import get_backend
from portal.lib.readiness import attempt_token, ready_token_key
from portal.models import Attempt, GpuRequest

log = logging.getLogger(__name__)


class AttemptNotRunning(Exception):
    """A checkpoint reported for an attempt that has ended."""

    def __init__(self, state: str) -> None:
        super().__init__(f"attempt is {state}")
        self.state = state


def attempt_checkpoint_record(attempt_id: int, at: datetime) -> bool:
    """Record a finished checkpoint at `at`; True when it moved `last_checkpoint_at` on.

    Only forward: an older or repeated report changes nothing (reports may arrive
    out of order), and only while the attempt is active (a stopping workload may
    still checkpoint in its grace period).
    """
    moved = (
        Attempt.objects.filter(pk=attempt_id, state__in=Attempt.ACTIVE_STATES)
        .filter(Q(last_checkpoint_at__isnull=True) | Q(last_checkpoint_at__lt=at))
        .update(last_checkpoint_at=at, checkpoints=F("checkpoints") + 1)
    )
    return moved == 1


def attempt_checkpoint_report(
    *, attempt_id: int, token: str, now: datetime | None = None
) -> Attempt:
    """A workload reports a finished checkpoint with its attempt's token.

    Raises PermissionDenied for a wrong token and for an unknown attempt alike (the
    same answer, so that nobody learns which attempt ids exist), AttemptNotRunning
    once the attempt has ended.
    """
    now = now or timezone.now()
    attempt = Attempt.objects.filter(pk=attempt_id).first()
    if attempt is None:
        expected = attempt_token(ready_token_key(), "", "", attempt_id)
    else:
        expected = attempt_token(
            ready_token_key(), attempt.namespace, attempt.workload_name, attempt.pk
        )
    if not hmac.compare_digest(token.encode(), expected.encode()) or attempt is None:
        raise PermissionDenied("bad or missing bearer token")
    if attempt.state not in Attempt.ACTIVE_STATES:
        raise AttemptNotRunning(str(attempt.state))
    if not attempt_checkpoint_record(attempt.pk, now):
        # Ended between the read and the write, or a report already newer: say which.
        attempt.refresh_from_db()
        if attempt.state not in Attempt.ACTIVE_STATES:
            raise AttemptNotRunning(str(attempt.state))
    attempt.refresh_from_db()
    return attempt


def checkpoints_release(*, limit: int = 50) -> int:
    """Delete the checkpoint storage of requests that ended for good; returns how many.

    Run by the reconciler, so a deletion that failed is tried again. Waits until no
    attempt of the request is active (a stopping pod may still write to it).
    """
    backend = get_backend()
    done = 0
    ended = (
        GpuRequest.objects.filter(
            state__in=GpuRequest.TERMINAL_STATES,
            checkpoint_interval_s__gt=0,
            checkpoints_deleted_at__isnull=True,
        )
        .exclude(attempts__state__in=Attempt.ACTIVE_STATES)
        .select_related("team")
        .order_by("id")[:limit]
    )
    for req in ended:
        try:
            backend.checkpoints_delete(req.pk, req.team.namespace)
        except Exception:  # noqa: BLE001
            log.exception("deleting the checkpoints of request %s failed; retrying later", req.pk)
            continue
        GpuRequest.objects.filter(pk=req.pk).update(checkpoints_deleted_at=timezone.now())
        done += 1
    return done
