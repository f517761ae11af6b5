"""The tick's apply step: write the core's decisions (admissions, waits, preemptions,
rejections) in the tick's transaction, and hand what was admitted to the launch task once
it commits.

Writes are batched, a fixed number of statements whatever the queue's length: the
admitted requests are claimed in one statement, their attempts, allocations and usage
records inserted in bulk, the decision log in one insert, and the waiting requests whose
status changed updated together (their queue position notes with them). Only what
changed is written. The owners of rejected requests are told once the tick commits.
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Count, F, Model

from portal.lib import wake
from portal.lib.bulk import (
    Row,
    RowMaker,
    bulk_set,
    bulk_set_sent,
    insert_rows,
)
from portal.models import (
    Allocation,
    Attempt,
    Decision,
    GpuRequest,
    NotificationPreference,
    SchedulerState,
    UsageRecord,
)
from portal.services import notify
from portal.services.attempts import attempt_stop, attempts_launch, lost_work
from portal.services.requests import gpu_request_cancel_not_member
from portal.tick import waits
from portal.tick.snapshot import ALLOCATION_FIELDS, WAIT_FIELDS, Context, DeviceRow, QueuedRow
from scheduling import types as st

log = logging.getLogger(__name__)


def _slots(device: DeviceRow, grant: st.DeviceGrant, taken: set[str]) -> list[str]:
    """The Allocation slots a grant occupies on a device (see Allocation's docstring)."""
    if grant.mig is not None:
        return [f"m{i}" for i in range(grant.mig.start, grant.mig.start + grant.mig.size)]
    if device.partitioning == "time-slicing":
        shares = [f"s{k}" for k in range(device.replicas)]
        if grant.milli >= 1000:
            return shares
        free = [s for s in shares if s not in taken]
        return free[:1] or ["s-overbooked"]
    return ["gpu"]


def _allocations(
    attempt_id: int, d: st.Decision, ctx: Context, rows: list[Any], make: Callable[..., Any]
) -> list[Any]:
    """Append the allocations of `d`'s placement to `rows`, each made by `make` from the
    values of ALLOCATION_FIELDS."""
    assert d.placement is not None
    for pod in d.placement.pods:
        for g in pod.grants:
            device = ctx.devices[(pod.node, g.device)]
            taken = ctx.active_slots[device.pk]
            for slot in _slots(device, g, taken):
                taken.add(slot)
                mig = g.mig
                rows.append(
                    make(attempt_id, device.pk, slot, g.milli, g.gpu_memory_mib, "", -1, 0)
                    if mig is None
                    else make(
                        attempt_id,
                        device.pk,
                        slot,
                        0,
                        g.gpu_memory_mib,
                        mig.profile,
                        mig.start,
                        mig.size,
                    )
                )
    return rows


def _attempt(d: st.Decision, req: QueuedRow, ctx: Context, number: int) -> dict[str, Any]:
    assert d.placement is not None
    return {
        "request_id": req.pk,
        "number": number,
        "pool_id": ctx.pools[d.pool].pk,
        "nodes": list(d.placement.nodes),
        "workload_name": f"qm-{req.pk}-{number}",
        "namespace": ctx.teams[req.team_id][1],
        "gpus_milli": req.gpus_milli,
        "borrowing": d.borrowing,
        # The request's last decision said it waited for preempted attempts to stop.
        "admitted_by_preemption": req.status_code == "preempting",
        "admitted_at": ctx.now,
        # The launch task has this long before the reconciler takes the launch over as lost.
        "next_launch_at": ctx.now + timedelta(seconds=settings.LAUNCH_RETRY_BASE_SECONDS),
    }


#: a usage record's values, in the order `_usage` gives them
USAGE_FIELDS = ("attempt_id", "team_id", "workload_class_id", "pool_id", "gpus_milli", "started_at")


def _usage(attempt_id: int, req: QueuedRow, pool_id: int, ctx: Context) -> tuple[Any, ...]:
    return (attempt_id, req.team_id, req.workload_class_id, pool_id, req.gpus_milli, ctx.now)


class Claimed(NamedTuple):
    """The admissions the tick claimed, with their attempts' numbers and (PostgreSQL)
    keys already drawn."""

    decisions: list[st.Decision]
    numbers: dict[int, int]  # request pk -> its attempts so far
    pks: list[int] | None


@contextmanager
def _claim(ds: list[st.Decision], ctx: Context) -> Iterator[Callable[[], Claimed]]:
    """Claim and admit the requests `ds` admits, if still pending (cancelled since the
    snapshot: nothing to do). Yields `claimed`: on PostgreSQL the claim runs on the server
    while the block computes, and the block must not use the database before calling it."""
    if not ds:
        nothing = Claimed([], {}, None)
        yield lambda: nothing
        return
    reqs = {d.request_id: ctx.requests[d.request_id] for d in ds}
    # An admitted request's status, as WAIT_FIELDS hold a waiting one's.
    fields = ("state", "updated_at", *WAIT_FIELDS)

    def admitted(d: st.Decision) -> tuple[Any, ...]:
        req = reqs[d.request_id]
        head = (req.pk, GpuRequest.State.ADMITTED, ctx.now, "admitted", d.message)
        return (*head, None, False, None, "", *_wait_ends(req, ctx))

    if connection.vendor == "postgresql":
        # One statement claims and admits, and returns each claimed request's attempt
        # count and its new attempt's key (three statements otherwise).
        attempts = connection.ops.quote_name(Attempt._meta.db_table)
        with bulk_set_sent(
            GpuRequest,
            fields,
            [admitted(d) for d in ds],
            only_if={"state": GpuRequest.State.PENDING},
            returning=f"t.id, (SELECT count(*) FROM {attempts} a WHERE a.request_id = t.id), "
            f"nextval(pg_get_serial_sequence('{Attempt._meta.db_table}', 'id'))",
        ) as done:

            def claimed() -> Claimed:
                got = {request_pk: (n, attempt_pk) for request_pk, n, attempt_pk in done()}
                kept = [d for d in ds if reqs[d.request_id].pk in got]
                return Claimed(
                    kept,
                    {pk: n for pk, (n, _) in got.items()},
                    [got[reqs[d.request_id].pk][1] for d in kept],
                )

            yield claimed
        return
    pks = set(
        GpuRequest.objects.select_for_update()
        .filter(pk__in=[r.pk for r in reqs.values()], state=GpuRequest.State.PENDING)
        .values_list("pk", flat=True)
    )
    kept = [d for d in ds if reqs[d.request_id].pk in pks]
    bulk_set(GpuRequest, fields, [admitted(d) for d in kept])
    numbers = dict(
        Attempt.objects.filter(request_id__in=pks)
        .order_by()
        .values_list("request_id")
        .annotate(n=Count("id"))
    )
    result = Claimed(kept, numbers, None)
    yield lambda: result


def _admit_claimed(
    claimed: Claimed, ctx: Context, tick_no: int, waiting: list[tuple[Any, ...]]
) -> dict[str, int]:
    """Insert the claimed admissions' attempts, allocations and usage records, and write
    the `waiting` requests' new status (WAIT_FIELDS) meanwhile; returns the new attempts'
    ids by request id (absent: not admitted). The status is written untracked: the
    snapshot's rows (`ctx.requests`, kept for the next tick) hold it already."""
    ds = claimed.decisions
    if not ds:
        bulk_set(GpuRequest, WAIT_FIELDS, waiting, untracked=True)
        return {}
    reqs = {d.request_id: ctx.requests[d.request_id] for d in ds}

    def number(d: st.Decision) -> int:
        return claimed.numbers.get(reqs[d.request_id].pk, 0) + 1

    def dependents(ids: list[int]) -> tuple[list[Row], list[Row]]:
        # Rows made from values, not dicts: tens of thousands of each.
        allocation_row = RowMaker(Allocation).positional(*ALLOCATION_FIELDS)
        usage_row = RowMaker(UsageRecord).positional(*USAGE_FIELDS)
        allocations: list[Row] = []
        for d, attempt_id in zip(ds, ids, strict=True):
            _allocations(attempt_id, d, ctx, allocations, allocation_row)
        usage = [
            usage_row(*_usage(attempt_id, reqs[d.request_id], row["pool_id"], ctx))
            for d, attempt_id, row in zip(ds, ids, rows, strict=True)
        ]
        return allocations, usage

    slots_before = {k: set(v) for k, v in ctx.active_slots.items()}
    with bulk_set_sent(GpuRequest, WAIT_FIELDS, waiting, untracked=True) as waited:
        # While the server writes the waiting requests: the admissions' rows.
        rows = [_attempt(d, reqs[d.request_id], ctx, number(d)) for d in ds]
        prepared = dependents(claimed.pks) if claimed.pks is not None else None
        waited()
    made: dict[str, int] = {}
    try:
        with transaction.atomic():
            ids = insert_rows(Attempt, rows, ids=claimed.pks is None, pks=claimed.pks)
            allocations, usage = prepared or dependents(ids)
            insert_rows(Allocation, allocations)
            insert_rows(UsageRecord, usage)
            made = {d.request_id: attempt_id for d, attempt_id in zip(ds, ids, strict=True)}
    except IntegrityError:
        # The database refused a double booking somewhere in the batch: admit one by one,
        # so that only the conflicting requests wait for the next tick.
        ctx.active_slots.clear()
        ctx.active_slots.update(slots_before)
        for d in ds:
            attempt_id = _admit_one(d, reqs[d.request_id], ctx, number(d), tick_no)
            if attempt_id is not None:
                made[d.request_id] = attempt_id
    launched = [made[d.request_id] for d in ds if d.request_id in made]
    if launched:
        transaction.on_commit(lambda: launch_soon(launched))
    return made


def _wait_ends(req: QueuedRow, ctx: Context) -> tuple[Any, ...]:
    """The wait columns of a request the tick admits: its last stretch folded in."""
    assert req.wait is not None and req.created_at is not None
    return req.wait.fold(ctx.now, req.created_at, "").values()


def _admit_one(
    d: st.Decision, req: QueuedRow, ctx: Context, number: int, tick_no: int
) -> int | None:
    try:
        with transaction.atomic():
            attempt = Attempt.objects.create(**_attempt(d, req, ctx, number))
            Allocation.objects.bulk_create(
                _allocations(attempt.pk, d, ctx, [], _model_row(Allocation, ALLOCATION_FIELDS))
            )
            usage = _usage(attempt.pk, req, attempt.pool_id, ctx)
            UsageRecord.objects.create(**dict(zip(USAGE_FIELDS, usage, strict=True)))
    except IntegrityError:
        log.error("tick %s: allocation conflict for request %s; left pending", tick_no, req.pk)
        GpuRequest.objects.filter(pk=req.pk).update(
            state=GpuRequest.State.PENDING,
            status_code="conflict",
            status_message="waiting: placement conflict, retrying",
        )
        return None
    return attempt.pk


def _model_row(model: type[Model], fields: tuple[str, ...]) -> Callable[..., Model]:
    """A maker of `model` instances from the values of `fields`, in that order."""

    def make(*values: Any) -> Model:
        return model(**dict(zip(fields, values, strict=True)))

    return make


def launch_soon(attempt_ids: list[int]) -> None:
    """Launch the tick's admissions in the launch task, not in the tick.

    The decisions are committed; creating the workloads is the backend's slow part (one
    Job per attempt on Kubernetes), and the next tick need not wait for it, as
    kube-scheduler binds outside its scheduling cycle. If the broker is down they are
    launched here; a launch lost after that is created again by the reconciler.
    """
    if not wake.enqueue(wake.LAUNCH_TASK, attempt_ids):
        launch_attempts(attempt_ids)


def launch_attempts(attempt_ids: list[int]) -> None:
    attempts_launch(attempt_ids)


#: the fact values a decision row keeps (JSON's); a tuple, not a union: `isinstance`
#: with a union built per value was most of `_facts` at 100,000 decisions
_JSON_TYPES = (str, int, float, bool, list, dict, type(None))


def _facts(d: st.Decision) -> dict[str, Any]:
    out = {k: v for k, v in d.facts.items() if isinstance(v, _JSON_TYPES)}
    if d.escalated:
        out["escalated"] = True
    if d.borrowing:
        out["borrowing"] = True
    return out


class _Log:
    """The tick's decision log rows, made as COPY takes them.

    One time, the tick's number and its profile for all rows (`RowMaker`). Alike requests
    share their decision's facts (`scheduling.cycle`: one decision, copied): their facts
    are filtered and serialized once, and their estimated starts made once.
    """

    def __init__(self, ctx: Context, tick_no: int) -> None:
        self.maker = RowMaker(Decision, tick=tick_no, **_profile(ctx))
        self._row = self.maker.positional(
            "request_id", "team_id", "kind", "code", "message", "facts", same_json=True
        )
        self.admitted = self.maker.positional(
            "request_id",
            "attempt_id",
            "team_id",
            "pool_id",
            "node",
            "kind",
            "code",
            "message",
            "facts",
            same_json=True,
        )
        self.tz = ctx.now.tzinfo
        # keyed by the facts' id: the decisions (and so their facts) live as long as this
        self._facts: dict[tuple[int, bool, bool], tuple[object, dict[str, Any]]] = {}
        self._starts: dict[int, datetime] = {}

    def facts(self, d: st.Decision) -> dict[str, Any]:
        """`_facts`, once per facts object."""
        key = (id(d.facts), d.escalated, d.borrowing)
        made = self._facts.get(key)
        if made is None:
            made = self._facts[key] = (d.facts, _facts(d))
        return made[1]

    def row(self, req: QueuedRow, kind: str, d: st.Decision, message: str) -> Row:
        """A waiting or rejected request's row."""
        return self._row(req.pk, req.team_id, kind, d.code, message, self.facts(d))

    def start(self, estimate_ms: int) -> datetime:
        """The estimated start of `estimate_ms` (epoch milliseconds) as a time."""
        start = self._starts.get(estimate_ms)
        if start is None:
            start = self._starts[estimate_ms] = datetime.fromtimestamp(
                int(estimate_ms) / 1000, tz=self.tz
            )
        return start


def _profile(ctx: Context) -> dict[str, Any]:
    """The scheduling profile in force, as each of the tick's decisions records it."""
    return {
        "profile_name": ctx.profile_name,
        "profile_version": ctx.profile_version,
        "policy_version": ctx.policy_version,
    }


def reason_key(code: str, message: str) -> tuple[str, str]:
    """What the decision log compares between ticks: the code and the reason's main clause.

    What follows "; " is detail that moves from tick to tick while the reason stays
    ("3 nodes are held for earlier large requests", "may start again in 41 s"); logging
    each change of it wrote a row per waiting request per tick.
    """
    return code, message.split("; ", 1)[0]


def _wait(
    d: st.Decision,
    ctx: Context,
    log: _Log,
    log_rows: list[Row | st.Decision],
    changed: list[tuple[Any, ...]],
    notes: dict[str, str] | None = None,
) -> None:
    # Runs once per waiting request (70,000 at 100,000 pending): kept to plain operations.
    req = ctx.requests[d.request_id]
    code, new_message = d.code, d.message[:500]
    facts = d.facts
    estimate = facts.get("estimated_start_ms") if facts else None
    estimated_start = log.start(estimate) if isinstance(estimate, int) else None
    # reason_key, inlined: the code, then the reason's main clause.
    if req.status_code != code or (
        req.status_message.partition("; ")[0] != new_message.partition("; ")[0]
    ):
        # The decision log records changes of reason, not every tick's repetition.
        log_rows.append(log.row(req, Decision.Kind.WAIT, d, new_message))
    position = d.position or None
    # A note explains the last move: kept while the position holds, dropped when the
    # request comes back without one (new, requeued) or moves with no note computed.
    kept = req.position_note if position == req.queue_position else ""
    note = notes.get(d.request_id, kept) if notes else kept
    escalated = d.escalated
    # Where the wait went: a change of reason closes the stretch (portal/tick/waits.py).
    wait = req.wait
    assert wait is not None and req.created_at is not None
    reason = waits.reason_of(code, d.request_id in ctx.provisioning)
    folded = reason != wait.reason
    if folded:
        wait = req.wait = wait.fold(ctx.now, req.created_at, reason)
    if (
        folded
        or req.status_code != code
        or req.status_message != new_message
        or req.queue_position != position
        or req.escalated != escalated
        or req.estimated_start != estimated_start
        or req.position_note != note
    ):
        req.status_code = code
        req.status_message = new_message
        req.queue_position = position
        req.escalated = escalated
        req.estimated_start = estimated_start
        req.position_note = note
        changed.append(
            (req.pk, code, new_message, position, escalated, estimated_start, note, *wait.values())
        )


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


class _Counts:
    """A Fenwick tree over queue positions: how many added positions are below a bound."""

    def __init__(self, size: int) -> None:
        self.tree = [0] * (size + 1)

    def add(self, position: int) -> None:
        while position < len(self.tree):
            self.tree[position] += 1
            position += position & -position

    def below(self, bound: int) -> int:
        """How many added positions are < bound."""
        i, total = min(bound - 1, len(self.tree) - 1), 0
        while i > 0:
            total += self.tree[i]
            i -= i & -i
        return total


def position_notes(old: dict[Any, int | None], new: dict[Any, int]) -> dict[Any, str]:
    """Why each queued request's position changed since the last tick, in words.

    `old`: positions stored after the last tick (None: not waiting then); `new`: this
    tick's positions of the waiting requests (admitted ones keep none). Of the `o - 1`
    requests ahead before, some are still ahead, some fell behind, and the rest started
    or left (unseen now); of the `n - 1` ahead now, the others arrived (new, or back
    after a requeue) or passed it (a stronger class, priority or fair share, an
    escalation). Only requests whose position changed get a note.

    Every request behind one that starts moves, so this runs in O(q log q) for a
    queue of q: requests that waited both times are points (old, new), and a sweep
    over old positions with a Fenwick tree over new ones counts those ahead both times.
    """
    placed = {rid: n for rid, n in new.items() if n}
    moved = sorted((o, n, rid) for rid, n in placed.items() if (o := old.get(rid)) and o != n)
    if not moved:
        return {}
    ahead_now = sorted(placed.values())
    arrived_at = sorted(n for rid, n in placed.items() if not old.get(rid))
    # Requests that waited then and now, by their old position.
    both = sorted((o, n) for rid, n in placed.items() if (o := old.get(rid)))
    tree = _Counts(ahead_now[-1] + 1)
    added = 0
    notes: dict[Any, str] = {}
    for o, n, rid in moved:
        while added < len(both) and both[added][0] < o:
            tree.add(both[added][1])
            added += 1
        stayed = tree.below(n)  # ahead then and now
        fell = added - tree.below(n + 1)  # ahead then, behind now
        arrived = bisect_left(arrived_at, n)
        passed = bisect_left(ahead_now, n) - stayed - arrived
        left = max(0, (o - 1) - stayed - fell)
        why = []
        if left:
            why.append(
                _plural(left, "request", "requests") + " ahead of it started or left the queue"
            )
        if fell:
            why.append(_plural(fell, "request", "requests") + " fell behind it")
        if arrived:
            why.append(
                _plural(arrived, "request", "requests")
                + " of higher class, priority or fair share arrived"
            )
        if passed:
            why.append(
                _plural(passed, "request", "requests")
                + " moved ahead (priority, fair share or escalation)"
            )
        notes[rid] = f"moved from #{o} to #{n}" + (f": {'; '.join(why)}" if why else "")
    return notes


def _preempt_all(ds: list[st.Decision], ctx: Context, tick_no: int) -> list[dict[str, Any]]:
    """Stop the victims (few: `Policy.max_preemptions_per_tick`); their log rows, in order,
    each saying the work it loses."""
    if not ds:
        return []
    attempts = Attempt.objects.select_related("request", "pool").in_bulk(
        [int(d.attempt_id) for d in ds if d.attempt_id.isdigit()]
    )
    rows = []
    for d in ds:
        attempt = attempts.get(int(d.attempt_id)) if d.attempt_id.isdigit() else None
        if attempt is None or attempt.state not in (Attempt.State.ADMITTED, Attempt.State.RUNNING):
            continue
        attempt_stop(attempt, reason="preempted")
        clause, lost = lost_work(attempt, ctx.now)
        rows.append(
            {
                "tick": tick_no,
                "request_id": attempt.request_id,
                "attempt_id": attempt.pk,
                "team_id": attempt.request.team_id,
                "pool_id": attempt.pool_id,
                "node": ",".join(attempt.nodes),
                "kind": Decision.Kind.PREEMPT,
                "code": d.code,
                "message": f"{d.message}; {clause}"[:500],
                "facts": {**_facts(d), **lost},
                **_profile(ctx),
            }
        )
    return rows


def _reject_all(ds: Iterable[st.Decision], ctx: Context) -> None:
    """Fail the rejected requests still pending: one statement per distinct reason; their
    owners are told after the commit (one hook for the tick)."""
    by_reason: dict[tuple[str, str], list[int]] = defaultdict(list)
    for d in ds:
        by_reason[(d.code, d.message)].append(ctx.requests[d.request_id].pk)
    notify.notify_many_later(
        [pk for pks in by_reason.values() for pk in pks], NotificationPreference.Event.FAILURE
    )
    for (code, message), pks in by_reason.items():
        GpuRequest.objects.filter(pk__in=pks, state=GpuRequest.State.PENDING).update(
            state=GpuRequest.State.FAILED,
            end_reason=message[:300],
            status_code=code,
            status_message=message[:500],
            queue_position=None,
        )


def decisions_apply(*, decisions: list[st.Decision], ctx: Context, tick_no: int) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    # Preemptions first, so their decisions precede the admissions they make room for.
    ordered = sorted(decisions, key=lambda d: d.kind != st.DecisionKind.PREEMPT)
    by_kind: dict[str, list[st.Decision]] = defaultdict(list)
    for d in ordered:
        kind = "cancel" if d.kind == st.DecisionKind.REJECT and d.code == "not-a-member" else d.kind
        by_kind[kind].append(d)
        counts[str(kind)] += 0  # a kind the core decided is counted, even if nothing came of it
    log = _Log(ctx, tick_no)
    log_rows: list[Row] = [
        log.maker(r) for r in _preempt_all(by_kind[st.DecisionKind.PREEMPT], ctx, tick_no)
    ]
    if log_rows:
        counts["preempt"] = len(log_rows)
    _reject_all(by_kind[st.DecisionKind.REJECT], ctx)
    # The log in the core's order; an admission's row is written once its attempt is.
    entries: list[Row | st.Decision] = []
    changed: list[tuple[Any, ...]] = []
    with _claim(by_kind[st.DecisionKind.ADMIT], ctx) as claim:
        # While the server claims the admissions: the waiting requests' new status and
        # the log's rows for waits and rejections (no database until `claim()`).
        notes = position_notes(
            {rid: r.queue_position for rid, r in ctx.requests.items()},
            {d.request_id: d.position for d in by_kind[st.DecisionKind.WAIT] if d.position},
        )
        for d in ordered:
            if d.kind == st.DecisionKind.ADMIT:
                entries.append(d)
            elif d.kind == st.DecisionKind.WAIT:
                _wait(d, ctx, log, entries, changed, notes)
                counts["wait"] += 1
            elif d.kind == st.DecisionKind.REJECT and d.code != "not-a-member":
                queued = ctx.requests[d.request_id]
                entries.append(log.row(queued, Decision.Kind.REJECT, d, d.message[:500]))
                counts["reject"] += 1
        claimed = claim()
    made = _admit_claimed(claimed, ctx, tick_no, changed)
    for e in entries:
        if not isinstance(e, st.Decision):
            log_rows.append(e)
        elif e.request_id in made:
            assert e.placement is not None
            queued = ctx.requests[e.request_id]
            counts["admit"] += 1
            log_rows.append(
                log.admitted(
                    queued.pk,
                    made[e.request_id],
                    queued.team_id,
                    ctx.pools[e.pool].pk,
                    ",".join(e.placement.nodes),
                    Decision.Kind.ADMIT,
                    e.code,
                    e.message,
                    log.facts(e),
                )
            )
    insert_rows(Decision, log_rows)
    for d in by_kind["cancel"]:
        # The core's member rules: the submitter left the team behind the services' back.
        req = GpuRequest.objects.select_related("team").get(pk=ctx.requests[d.request_id].pk)
        counts["cancel"] += gpu_request_cancel_not_member(
            req, actor=None, now=ctx.now, tick=tick_no
        )
    return dict(counts)


def count(counter: str) -> None:
    """Add one to a SchedulerState counter (skipped ticks, repairs, ...)."""
    with transaction.atomic():
        SchedulerState.objects.get_or_create(pk=1)
        SchedulerState.objects.filter(pk=1).update(**{counter: F(counter) + 1})
