"""Reads of requests: the filtered list, an attempt's facts, the log tail and events."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count, Max, Min, Q, QuerySet

from portal import access
from portal.access import AnyUser
from portal.models import Attempt, GpuRequest, Team, WorkloadClass


def request_list(
    user: AnyUser,
    *,
    mine: bool = False,
    team: Team | None = None,
    state: str = "",
    workload_class: WorkloadClass | None = None,
    q: str = "",
    with_counts: bool = True,
) -> QuerySet[GpuRequest]:
    """Requests the user may see, newest first; `mine` keeps only the user's own.

    `q` searches the name and image (and matches a request number). With `with_counts`
    each row carries `attempt_count`; pages that paginate thousands of rows pass False
    and call `request_attempt_facts()` on the page's rows instead (a grouped count
    under the paginator's COUNT costs a scan per page view).
    """
    qs = access.requests_visible(user)
    if mine:
        qs = qs.filter(submitted_by=user)  # type: ignore[misc]
    if team is not None:
        qs = qs.filter(team=team)
    if state:
        qs = qs.filter(state=state)
    if workload_class is not None:
        qs = qs.filter(workload_class=workload_class)
    if q:
        match = Q(name__icontains=q) | Q(image__icontains=q)
        if q.lstrip("#").isdigit():
            match |= Q(pk=int(q.lstrip("#")))
        qs = qs.filter(match)
    if with_counts:
        qs = qs.annotate(attempt_count=Count("attempts"))
    return qs.order_by("-created_at", "-id")


def request_attempt_facts(rows: Sequence[GpuRequest]) -> None:
    """Set `attempt_count`, `first_started` and `last_ended` on a page of requests: one query."""
    facts = {
        f["request_id"]: f
        for f in Attempt.objects.filter(request_id__in=[r.pk for r in rows])
        .values("request_id")
        .annotate(n=Count("id"), first=Min("started_at"), last=Max("ended_at"))
    }
    for r in rows:
        f = facts.get(r.pk, {})
        r.attempt_count = f.get("n", 0)  # type: ignore[attr-defined]
        r.first_started = f.get("first")  # type: ignore[attr-defined]
        r.last_ended = f.get("last")  # type: ignore[attr-defined]


@dataclass
class LogView:
    """What the request page shows of its latest attempt's log."""

    attempt: Attempt | None
    text: str
    #: read from the running workload now (else the lines kept when it ended)
    live: bool
    events: list[Any] = field(default_factory=list)


#: lines the request page shows; the download has up to LOG_DOWNLOAD_LINES
LOG_PAGE_LINES = 200
LOG_DOWNLOAD_LINES = 10_000


def request_logs(
    req: GpuRequest, *, tail_lines: int = LOG_PAGE_LINES, events: bool = True
) -> LogView:
    """The latest attempt's log tail and events: from the backend while the attempt is
    active (or, for a download, while the backend still has it), else the stored tail."""
    from portal.backends import get_backend

    attempt = req.attempts.order_by("-number").first()
    if attempt is None:
        return LogView(None, "", live=False)
    backend = get_backend()
    pods = max(1, len(attempt.nodes))
    active = attempt.state in Attempt.ACTIVE_STATES
    text = ""
    if active or tail_lines > LOG_PAGE_LINES:
        try:
            text = backend.logs(attempt.workload_name, attempt.namespace, tail_lines, pods)
        except Exception:  # noqa: BLE001 - an unreachable cluster shows no log, not a 500
            text = ""
    if not text and not active:
        text = attempt.log_tail
    found: list[Any] = []
    if events:
        try:
            found = backend.events(attempt.workload_name, attempt.namespace, pods)
        except Exception:  # noqa: BLE001
            found = []
    return LogView(attempt, text, live=active, events=found)
