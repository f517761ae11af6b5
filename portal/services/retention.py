"""Retention of the decision log: rows older than DECISION_RETENTION_DAYS are folded into
`DecisionTally` (so that /metrics counters never go down) and deleted, in bounded batches."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, F
from django.utils import timezone

from portal.models import Decision, DecisionTally

BATCH = 5000


def decisions_prune(*, now: datetime | None = None, days: int | None = None) -> int:
    """Fold and delete decisions older than `days` (default DECISION_RETENTION_DAYS); return
    how many were deleted. 0 days or less keeps everything."""
    days = settings.DECISION_RETENTION_DAYS if days is None else days
    if days <= 0:
        return 0
    cutoff = (now or timezone.now()) - timedelta(days=days)
    deleted = 0
    while True:
        with transaction.atomic():
            ids = list(
                Decision.objects.filter(created_at__lt=cutoff)
                .order_by("id")
                .values_list("id", flat=True)[:BATCH]
            )
            if not ids:
                return deleted
            batch = Decision.objects.filter(id__in=ids)
            for r in (
                batch.values("kind", "code", "team__name", "pool__name")
                .annotate(n=Count("id"))
                .order_by()
            ):
                key = {
                    "kind": r["kind"],
                    "code": r["code"],
                    "team_name": r["team__name"] or "",
                    "pool_name": r["pool__name"] or "",
                }
                tally, _ = DecisionTally.objects.select_for_update().get_or_create(**key)
                DecisionTally.objects.filter(pk=tally.pk).update(n=F("n") + r["n"])
            deleted += batch.delete()[0]
