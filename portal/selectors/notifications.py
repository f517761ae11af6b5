"""What happened to a user's own requests, newest first: the in-app list of notifications."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.core.paginator import Page, Paginator
from django.db.models import CharField, F, Value

from portal.models import Attempt, GpuRequest

PER_PAGE = 25

#: how an attempt that ended is told, by its state
ENDED = {
    Attempt.State.SUCCEEDED: "finished",
    Attempt.State.FAILED: "failed",
    Attempt.State.PREEMPTED: "was preempted",
    Attempt.State.NODE_LOST: "stopped: its node was lost",
}


@dataclass(frozen=True)
class Happening:
    at: datetime
    #: "started", or one of ENDED's states
    kind: str
    words: str
    request: GpuRequest
    note: str


def happenings(user: Any, page: str | int | None = None) -> Page[Happening]:
    """One page of the starts and ends of the attempts of `user`'s requests, newest first, in
    three queries whatever the page: the count, the page of one UNION, its requests."""
    # unordered parts: SQLite refuses an ORDER BY (Attempt's default) inside a UNION
    mine = Attempt.objects.filter(request__submitted_by=user).order_by()
    text: CharField[str, str] = CharField()
    started = (
        mine.filter(started_at__isnull=False)
        .annotate(at=F("started_at"), kind=Value("started", output_field=text))
        .annotate(note=Value("", output_field=text))
        .values_list("id", "request_id", "at", "kind", "note")
    )
    ended = (
        mine.filter(ended_at__isnull=False, state__in=list(ENDED))
        .annotate(at=F("ended_at"), kind=F("state"))
        .annotate(note=F("end_reason"))
        .values_list("id", "request_id", "at", "kind", "note")
    )
    rows = started.union(ended, all=True).order_by("-at", "-id")
    found: Page[Any] = Paginator(rows, PER_PAGE).get_page(page)
    requests = GpuRequest.objects.select_related("team").in_bulk({r[1] for r in found.object_list})
    found.object_list = [
        Happening(at, kind, ENDED.get(kind, "started"), requests[request_id], note)
        for _, request_id, at, kind, note in found.object_list
    ]
    return found
