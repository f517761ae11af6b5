"""The scheduling tick, in one transaction:

1. lock: one tick at a time (a PostgreSQL advisory lock, or a lease row on SQLite);
2. snapshot: read the database into frozen plain data (portal/tick/snapshot.py), and the
   active scheduling profile (`PolicyProfile`: the shipped default until an admin
   changes it);
3. schedule: `scheduling.schedule()`, a pure function, with the profile's `Policy`,
   returns decisions; each records the profile's name and version. The packer's state
   is kept from tick to tick in the worker (`scheduling.keeper`): the same decisions;
4. apply: write the decisions (portal/tick/apply.py); launches go to the backend on commit;
5. record: the tick's number, duration and histogram.

Compute, then apply: `scheduling/` sees frozen plain data and returns decisions;
everything that writes happens in step 4. The reconciler (portal/tick/reconcile.py)
re-drives what is in flight separately.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from portal.models import PolicyVersion, SchedulerState
from portal.services.profiles import policy_profile_ensure
from portal.tick.apply import count, decisions_apply
from portal.tick.snapshot import build_snapshot
from scheduling import types as st
from scheduling.keeper import StateKeeper

# Any 64-bit number unique to this application.
TICK_LOCK_KEY = 0x51_4D_54_49_43_4B  # "QMTICK"
LEASE = timedelta(seconds=120)


@dataclass
class TickResult:
    ran: bool
    decisions: int = 0
    admitted: int = 0
    preempted: int = 0
    seconds: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)


TICK_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def tick_bucket(seconds: float) -> str:
    """The histogram bucket a tick duration falls in (its upper bound, or +Inf)."""
    for bound in TICK_BUCKETS:
        if seconds <= bound:
            return str(bound)
    return "+Inf"


def _try_lock(now: datetime) -> bool:
    """Take the single-tick lock for the current transaction."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_xact_lock(%s)", [TICK_LOCK_KEY])
            return bool(cur.fetchone()[0])
    # SQLite: a lease row claimed by a conditional UPDATE.
    SchedulerState.objects.get_or_create(pk=1)
    claimed = SchedulerState.objects.filter(
        Q(lease_until__isnull=True) | Q(lease_until__lt=now), pk=1
    ).update(lease_until=now + LEASE)
    return claimed == 1


#: the packer's state from one tick to the next, per process (`scheduling.keeper`)
_KEEPER = StateKeeper()


def schedule(snapshot: st.Snapshot, now_ms: int, policy: st.Policy) -> list[st.Decision]:
    """Step 3: `scheduling.schedule`, from the state the last tick in this process left."""
    return _KEEPER.schedule(snapshot, now_ms, policy)


@contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector for the tick.

    A tick at 10,000 pending requests allocates a few hundred thousand small objects,
    freed by reference counting; the collector's passes over the whole heap while they
    accumulate cost about a tenth of the tick. It runs again when the tick ends.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def run_tick(now: datetime | None = None) -> TickResult:
    """One scheduling pass. A tick that finds the lock taken is skipped and counted."""
    try:
        with _no_cyclic_gc():
            return _run_tick(now)
    except Exception:
        count("failed_ticks")
        raise


def _run_tick(now: datetime | None) -> TickResult:
    started = time.perf_counter()
    now = now or timezone.now()
    with transaction.atomic():
        # 1. lock
        if not _try_lock(now):
            skipped = True
        else:
            skipped = False
            state, _ = SchedulerState.objects.get_or_create(pk=1)
            tick_no = state.ticks + 1
            # 2. snapshot, with the active scheduling profile
            profile = policy_profile_ensure().profile()
            policy = profile.policy()
            snapshot, ctx = build_snapshot(now, policy, keep=True, tick_no=tick_no)
            ctx.profile_name, ctx.profile_version = profile.name, profile.version
            ctx.policy_version = (
                PolicyVersion.objects.order_by("-number").values_list("number", flat=True).first()
            )
            # 3. schedule
            decisions = schedule(snapshot, snapshot.now_ms, policy)
            # 4. apply
            counts = decisions_apply(decisions=decisions, ctx=ctx, tick_no=tick_no)
            # 5. record
            elapsed = time.perf_counter() - started
            histogram = dict(state.tick_histogram)
            bucket = tick_bucket(elapsed)
            histogram[bucket] = histogram.get(bucket, 0) + 1
            SchedulerState.objects.filter(pk=1).update(
                ticks=tick_no,
                last_tick_at=now,
                last_tick_ms=int(elapsed * 1000),
                lease_until=None,
                tick_histogram=histogram,
                tick_seconds_sum=F("tick_seconds_sum") + elapsed,
            )
    if skipped:
        count("skipped_ticks")
        return TickResult(ran=False)
    return TickResult(
        ran=True,
        decisions=len(decisions),
        admitted=counts.get("admit", 0),
        preempted=counts.get("preempt", 0),
        seconds=time.perf_counter() - started,
        counts=counts,
    )
