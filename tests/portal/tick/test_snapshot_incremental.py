"""The tick's snapshot reads only the pending rows written since its last read
(PostgreSQL: `changed_xact`, migration 0032): what it hands the core and the apply step
must equal a full read, whatever other writers did in between, and a tick rolled back
must leave nothing kept. Committed transactions: the read keeps what a commit made."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from portal.models import Allocation, Attempt, GpuRequest
from portal.services.requests import gpu_request_cancel
from portal.tick import snapshot as snapshot_module
from portal.tick.run import run_tick
from portal.tick.snapshot import build_snapshot
from tests.base import make_world, submit

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif("connection.vendor != 'postgresql'", reason="PostgreSQL's snapshots"),
]


@pytest.fixture(autouse=True)
def _fresh_kept() -> Any:
    """Each test starts with nothing kept (another test's rows are gone)."""
    snapshot_module._KEPT = snapshot_module._Kept(incremental=True)
    yield
    snapshot_module._KEPT = snapshot_module._Kept(incremental=True)


def _row_reads(queries: CaptureQueriesContext, table: str) -> list[str]:
    """The statements that read `table`'s rows for the snapshot."""
    return [q["sql"] for q in queries.captured_queries if f'"{table}"."id" AS "pk"' in q["sql"]]


def _kept_read_equals_a_full_one(table: str = "portal_gpurequest") -> list[str]:
    """The tick's kind of read (kept) against a preview's (full): the same pending
    requests in the same order, the same running work, and the same status for the
    apply step. Returns the kept read's statements that read `table`'s rows."""
    now = timezone.now()
    with CaptureQueriesContext(connection) as queries:
        kept, kept_ctx = build_snapshot(now, keep=True)
    full, full_ctx = build_snapshot(now)
    assert kept.pending == full.pending
    assert kept.running == full.running
    assert kept.nodes == full.nodes
    assert kept_ctx.requests == full_ctx.requests
    assert kept_ctx.active_slots == full_ctx.active_slots
    return _row_reads(queries, table)


def test_a_kept_read_equals_a_full_one_through_ticks_and_other_writers() -> None:
    w = make_world()
    rng = random.Random(7)
    # more than the pool holds: most wait, tick after tick
    for _ in range(24):
        submit(
            rng.choice((w.alice, w.bob)),
            w.vision,
            cls=rng.choice(("training", "interactive")),
            count=rng.choice((2, 4, 8)),
        )
    snapshot_module._KEPT = snapshot_module._Kept(incremental=True)  # a worker's first tick
    reads = _kept_read_equals_a_full_one()
    assert "pg_visible_in_snapshot" not in reads[-1]  # the first read reads everything
    for step in range(6):
        run_tick()
        pending = list(GpuRequest.objects.filter(state=GpuRequest.State.PENDING))
        if pending:
            # other writers between ticks: each kind of change the snapshot reads
            first, *rest = rng.sample(pending, len(pending))
            GpuRequest.objects.filter(pk=first.pk).update(priority=step + 1)
            if rest:
                gpu_request_cancel(user=w.alice, gpu_request=rest.pop(), reason="test")
            if rest:
                later = timezone.now() + timedelta(hours=1)
                GpuRequest.objects.filter(pk=rest.pop().pk).update(requeue_at=later)
            if rest:
                GpuRequest.objects.filter(pk=rest.pop().pk).update(status_code="preempting")
            if rest:
                GpuRequest.objects.filter(pk=rest.pop().pk).update(requeue_at=None)
        active = list(Attempt.objects.filter(state__in=Attempt.ACTIVE_STATES))
        if active:
            # running work changes too: its attempt's row, or its request's
            one, *others = rng.sample(active, len(active))
            Attempt.objects.filter(pk=one.pk).update(last_checkpoint_at=timezone.now())
            if others:
                GpuRequest.objects.filter(pk=others[0].request_id).update(priority=step + 3)
            if len(others) > 1:
                # an attempt that ended gives its devices back
                Allocation.objects.filter(attempt_id=others[1].pk).update(active=False)
        submit(w.carol, w.nlp, cls="interactive", count=4)
        with CaptureQueriesContext(connection) as queries:
            _kept_read_equals_a_full_one()
        # read since the last read only: one statement each, bounded by the last snapshot
        for table in ("portal_gpurequest", "portal_attempt", "portal_allocation"):
            reads = _row_reads(queries, table)
            assert len(reads) == 2 and "pg_visible_in_snapshot" in reads[0], table
            assert "pg_visible_in_snapshot" not in reads[1]  # the full read beside it
        assert active
    assert GpuRequest.objects.filter(state=GpuRequest.State.PENDING).count() >= 10


def _written_since_the_kept_read() -> int:
    """Request rows the kept read's snapshot could not see."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM portal_gpurequest"
            " WHERE NOT pg_visible_in_snapshot(changed_xact, %s::pg_snapshot)",
            [snapshot_module._KEPT.pending_rows.snapshot],
        )
        return int(cursor.fetchone()[0])


def test_the_ticks_own_status_writes_are_not_read_again() -> None:
    """The apply step writes the waiting requests' status untracked and keeps it: a tick
    with nothing new reads no request row; a row another writer touched is read."""
    w = make_world()
    for _ in range(12):
        submit(w.alice, w.vision, count=8)
    run_tick()
    run_tick()
    waiting = GpuRequest.objects.filter(state=GpuRequest.State.PENDING)
    assert waiting.exclude(status_message="").count() >= 2
    now = timezone.now()
    build_snapshot(now, keep=True)
    assert _written_since_the_kept_read() == 0
    run_tick()
    # The tick wrote statuses (positions, messages) and nothing else changed.
    assert _written_since_the_kept_read() == 0
    touched = waiting.first()
    assert touched is not None
    GpuRequest.objects.filter(pk=touched.pk).update(status_message="an operator's note")
    _kept_read_equals_a_full_one()
    assert snapshot_module._KEPT.pending_statuses[touched.pk].status_message == (
        "an operator's note"
    )


def test_a_row_written_by_a_transaction_open_during_the_read_is_read_once_it_commits() -> None:
    w = make_world()
    for _ in range(6):
        submit(w.alice, w.vision, count=8)
    req, another, *_ = GpuRequest.objects.filter(state=GpuRequest.State.PENDING)
    assert req.priority == 0
    build_snapshot(timezone.now(), keep=True)
    settings = connection.settings_dict
    other = psycopg.connect(
        host=settings["HOST"] or None,
        port=settings["PORT"] or None,
        dbname=settings["NAME"],
        user=settings["USER"] or None,
        password=settings["PASSWORD"] or None,
    )
    try:
        other.execute("UPDATE portal_gpurequest SET priority = 9 WHERE id = %s", [req.pk])
        # a write that commits meanwhile: the next snapshot lists the other as open
        GpuRequest.objects.filter(pk=another.pk).update(priority=1)
        during, _ = build_snapshot(timezone.now(), keep=True)  # the other is still open
        assert {p.id: p.priority for p in during.pending}[str(req.pk)] == 0
        other.commit()
    finally:
        other.close()
    after, _ = build_snapshot(timezone.now(), keep=True)
    assert {p.id: p.priority for p in after.pending}[str(req.pk)] == 9


def test_a_deleted_pending_row_is_noticed_and_everything_read_again() -> None:
    w = make_world()
    for _ in range(6):
        submit(w.alice, w.vision, count=8)
    gone, *stay = GpuRequest.objects.filter(state=GpuRequest.State.PENDING).order_by("pk")
    assert stay
    build_snapshot(timezone.now(), keep=True)
    GpuRequest.objects.filter(pk=gone.pk).delete()
    reads = _kept_read_equals_a_full_one()
    assert len(reads) == 2  # the changed rows, then (a row missing) all of them
    snapshot, _ = build_snapshot(timezone.now(), keep=True)
    assert [p.id for p in snapshot.pending] == [str(r.pk) for r in stay]


def test_a_tick_rolled_back_keeps_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its apply step wrote new statuses into the objects it was handed; the database
    has the old ones: the next read must not trust the objects."""
    import portal.tick.run as run_module

    w = make_world()
    for _ in range(6):
        submit(w.alice, w.vision, count=8)
    run_tick()
    kept = snapshot_module._KEPT
    assert kept.pending_rows.snapshot
    applied = run_module.decisions_apply

    def apply_then_fail(**kw: Any) -> Any:
        applied(**kw)
        for row in kw["ctx"].requests.values():
            assert row.status_message  # written into the handed objects
        raise RuntimeError("the tick fails after its apply step")

    GpuRequest.objects.filter(state=GpuRequest.State.PENDING).update(status_message="")
    monkeypatch.setattr(run_module, "decisions_apply", apply_then_fail)
    with pytest.raises(RuntimeError):
        run_tick()
    assert kept.pending_rows.snapshot == ""
    monkeypatch.undo()
    reads = _kept_read_equals_a_full_one()
    assert "pg_visible_in_snapshot" not in reads[0]
    assert all(
        row.status_message == "" for row in build_snapshot(timezone.now())[1].requests.values()
    )


def test_a_snapshot_from_another_server_reads_everything() -> None:
    """Transaction ids that went back (a restored backup answers now) cannot bound a
    read: the kept snapshot is not trusted."""
    w = make_world()
    for _ in range(8):
        submit(w.alice, w.vision, count=8)
    assert GpuRequest.objects.filter(state=GpuRequest.State.PENDING).exists()
    build_snapshot(timezone.now(), keep=True)
    kept = snapshot_module._KEPT
    far = 10**10
    kept.pending_rows.snapshot = kept.running_rows.snapshot = f"{far}:{far}:"
    # a change such a read would miss: the count of rows stays
    GpuRequest.objects.filter(state=GpuRequest.State.PENDING).update(priority=5)
    _kept_read_equals_a_full_one()
    assert kept.pending_rows.snapshot != f"{far}:{far}:"


def test_a_tick_in_another_worker_process_is_noticed() -> None:
    """Each worker process keeps its own read; another process's tick wrote statuses
    untracked in between, so this process's kept statuses are stale: it reads the
    pending rows whole. (Here a position that went down in the other tick and back up
    in this one: with stale statuses the write back up would be skipped.)"""
    w = make_world()
    for _ in range(8):
        submit(w.alice, w.vision, count=8)
    waiting = list(GpuRequest.objects.filter(state=GpuRequest.State.PENDING).order_by("pk"))
    assert len(waiting) >= 3
    run_tick()  # this process
    mine = snapshot_module._KEPT
    snapshot_module._KEPT = snapshot_module._Kept(incremental=True)  # another process
    GpuRequest.objects.filter(pk=waiting[0].pk).update(priority=-5)  # it falls behind
    run_tick()
    moved = {
        r.pk: r.queue_position for r in GpuRequest.objects.filter(pk__in=[r.pk for r in waiting])
    }
    snapshot_module._KEPT = mine  # this process again
    GpuRequest.objects.filter(pk=waiting[0].pk).update(priority=0)  # back to its place
    run_tick()
    stored = {
        r.pk: r.queue_position for r in GpuRequest.objects.filter(pk__in=[r.pk for r in waiting])
    }
    assert moved != stored  # positions went down and came back
    _kept_read_equals_a_full_one()
