"""Reads of requests: the filtered list, an attempt's facts, the log tail and events."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
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
    #: pods of the attempt (a gang's), each with its own log
    pods: int = 1


#: lines the request page shows; the download has up to LOG_DOWNLOAD_LINES
LOG_PAGE_LINES = 200
LOG_DOWNLOAD_LINES = 10_000
#: a followed log is read this often, and for at most this long per connection: under
#: gunicorn's worker timeout (30 s), which a sync worker busy with one response cannot
#: reset; clients reconnect with the lines they have (`after`)
LOG_FOLLOW_POLL_S = 2.0
LOG_FOLLOW_MAX_S = 25.0
#: lines read at each poll of a followed log (more than a workload prints between polls)
LOG_FOLLOW_WINDOW = 1000
#: last lines sent that a poll looks for, to continue where the last one ended
_FOLLOW_OVERLAP = 20


class NoSuchPod(ValueError):
    """A pod rank past the attempt's gang."""


def _latest_attempt(req: GpuRequest) -> Attempt | None:
    return req.attempts.order_by("-number").first()


def _attempt_log(attempt: Attempt, tail_lines: int, pod: int, read_ended: bool) -> str:
    """The pod's log: from the backend while the attempt is active (or when asked), else the
    lines kept when it ended (rank 0's, the only ones kept)."""
    from portal.backends import get_backend

    active = attempt.state in Attempt.ACTIVE_STATES
    text = ""
    if active or read_ended:
        try:
            text = get_backend().logs(
                attempt.workload_name,
                attempt.namespace,
                tail_lines,
                _pods(attempt),
                pod,
            )
        except Exception:  # noqa: BLE001 - an unreachable cluster shows no log, not a 500
            text = ""
    if not text and not active and pod == 0 and attempt.log_tail:
        kept = attempt.log_tail.splitlines()[-tail_lines:]
        text = "".join(f"{line}\n" for line in kept)
    return text


def _pods(attempt: Attempt) -> int:
    return max(1, len(attempt.nodes))


def request_logs(
    req: GpuRequest,
    *,
    tail_lines: int = LOG_PAGE_LINES,
    events: bool = True,
    pod: int = 0,
    read_ended: bool = False,
) -> LogView:
    """The latest attempt's log tail and events: from the backend while the attempt is
    active (or, for a download or `read_ended`, while the backend still has it), else the
    stored tail. `pod` picks a gang's pod by rank; past the gang it raises NoSuchPod."""
    from portal.backends import get_backend

    attempt = _latest_attempt(req)
    if attempt is None:
        return LogView(None, "", live=False)
    pods = _pods(attempt)
    if not 0 <= pod < pods:
        raise NoSuchPod(f"Attempt {attempt.number} has {pods} pod(s): choose 0 to {pods - 1}.")
    active = attempt.state in Attempt.ACTIVE_STATES
    read_ended = read_ended or tail_lines > LOG_PAGE_LINES
    text = _attempt_log(attempt, tail_lines, pod, read_ended) if tail_lines else ""
    found: list[Any] = []
    if events:
        try:
            found = get_backend().events(attempt.workload_name, attempt.namespace, pods)
        except Exception:  # noqa: BLE001
            found = []
    return LogView(attempt, text, live=active, events=found, pods=pods)


def _continuation(seen: list[str], lines: list[str]) -> list[str] | None:
    """The lines of a fresh read that come after those already sent, found by looking for
    the last sent lines in the read from its end; None when the read holds none of them."""
    tail = seen[-_FOLLOW_OVERLAP:]
    for end in range(len(lines), 0, -1):
        k = min(len(tail), end)
        if lines[end - k : end] == tail[-k:]:
            return lines[end:]
    return None


def _continues(seen: list[str], lines: list[str]) -> list[str]:
    """As `_continuation`; a read that holds none of the sent lines (more printed than one
    window between polls) is sent whole."""
    if not seen:
        return lines
    new = _continuation(seen, lines)
    return lines if new is None else new


def request_log_follow(
    request_id: int,
    *,
    tail_lines: int = LOG_PAGE_LINES,
    pod: int = 0,
    poll_s: float | None = None,
    max_s: float | None = None,
    after: Sequence[str] = (),
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[str]:
    """The log's last `tail_lines` lines, then each new line as the workload prints it, until
    the request is over (or `max_s` passed). A pending request's log comes once it starts;
    each new attempt (a retry) is announced and followed from its first line.

    `after`: the last lines a client already has (it reconnects when a stream ends after
    `max_s`); the stream starts after them, or with the tail where the log no longer holds them.

    Authorization is the caller's, before the first line; rows are re-read at each poll.
    """
    poll_s = LOG_FOLLOW_POLL_S if poll_s is None else poll_s
    deadline = clock() + (LOG_FOLLOW_MAX_S if max_s is None else max_s)
    seen: list[str] = []
    number: int | None = None
    # Only the first read is cut to the asked tail: what comes later is all new.
    first = True
    while True:
        req = GpuRequest.objects.filter(pk=request_id).first()
        if req is None:
            return
        attempt = _latest_attempt(req)
        if attempt is not None:
            if attempt.number != number:
                if number is not None:
                    yield f"[qm] attempt {attempt.number} of request #{request_id} started\n"
                number, seen = attempt.number, []
            if pod < _pods(attempt):
                lines = _attempt_log(attempt, LOG_FOLLOW_WINDOW, pod, read_ended=True).splitlines()
                new = _continues(seen, lines)
                if first:
                    resumed = _continuation(list(after), lines) if after else None
                    new = (
                        resumed if resumed is not None else new[-tail_lines:] if tail_lines else []
                    )
                for line in new:
                    yield f"{line}\n"
                if lines:
                    # Everything read is accounted for, sent or not (the part before a tail).
                    seen = lines[-_FOLLOW_OVERLAP:]
        first = False
        ended = attempt is None or attempt.state not in Attempt.ACTIVE_STATES
        if (req.state in GpuRequest.TERMINAL_STATES and ended) or clock() >= deadline:
            return
        sleep(poll_s)
