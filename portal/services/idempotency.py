"""Idempotent API writes: one answer per (user, `Idempotency-Key`) for 24 hours.

The key's row is inserted in the same transaction as the write it guards, before it: a
second call with the key waits on the unique constraint until the first commits, then
gets its answer; a write that fails rolls its key back, so a retry may try again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from portal.models import IdempotencyKey

WINDOW = timedelta(hours=24)
MAX_KEY = 255
HEADER = "Idempotency-Key"


class IdempotencyKeyReused(Exception):
    """The key was used within the window for a different body."""


def fingerprint(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def idempotent_call(
    *, user: User, key: str, body: Any, write: Callable[[], tuple[int, Any]]
) -> tuple[int, Any, bool]:
    """Run `write` (returning status and body) once per key; return (status, body, replayed).

    Raises ValidationError naming the header for a bad key, IdempotencyKeyReused when the
    key came with another body.
    """
    if not key or len(key) > MAX_KEY or not key.isprintable():
        raise ValidationError({HEADER: [f"1 to {MAX_KEY} printable characters."]})
    digest = fingerprint(body)
    now = timezone.now()
    with transaction.atomic():
        # A key older than the window is free again.
        IdempotencyKey.objects.filter(user=user, key=key, created_at__lte=now - WINDOW).delete()
        try:
            with transaction.atomic():
                row = IdempotencyKey.objects.create(user=user, key=key, fingerprint=digest)
        except IntegrityError:
            first = IdempotencyKey.objects.get(user=user, key=key)
            if first.fingerprint != digest:
                raise IdempotencyKeyReused(key) from None
            return first.status_code, first.body, True
        status, answer = write()
        row.status_code, row.body = status, answer
        row.save(update_fields=["status_code", "body"])
    return status, answer, False


def idempotency_keys_prune(*, now: datetime | None = None) -> int:
    """Forget keys past the window; return how many."""
    cutoff = (now or timezone.now()) - WINDOW
    return IdempotencyKey.objects.filter(created_at__lte=cutoff).delete()[0]
