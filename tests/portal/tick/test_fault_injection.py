"""Database- and Celery-level cases of fault injection (FI-nn): each
test injects one fault and checks what the tick and the database do.

The Kubernetes-level cases (FI-03, FI-07 to FI-13, FI-15 to FI-17) are in tests/k8s/;
FI-04 (lost launch), FI-14 (backoff and its limit) and FI-22 (a second tick is a
no-op and counted) are in tests/portal/tick/test_tick.py.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, connections
from django.utils import timezone

from portal.models import (
    Allocation,
    Attempt,
    AuditEvent,
    Decision,
    GpuRequest,
    Membership,
    Pool,
    Quota,
    SchedulerState,
)
from portal.services.requests import _wake_scheduler
from portal.services.teams import quota_set
from portal.tick.run import TICK_LOCK_KEY, run_tick
from tests.base import make_world, submit

pytestmark = pytest.mark.django_db(transaction=True)
_real_wake = _wake_scheduler


@pytest.fixture(autouse=True)
def _no_wake(monkeypatch: pytest.MonkeyPatch) -> None:
    """Submits do not tick on their own here: each test decides when ticks run."""
    monkeypatch.setattr("portal.services.requests._wake_scheduler", lambda: None)


def _assert_invariants() -> None:
    active = Allocation.objects.filter(active=True)
    # INV-2: no slot in two active allocations.
    assert active.count() == len(set(active.values_list("device_id", "slot")))
    # INV-3: at most one active attempt per request.
    per_request = Attempt.objects.filter(state__in=Attempt.ACTIVE_STATES).values_list(
        "request_id", flat=True
    )
    assert len(per_request) == len(set(per_request))
    # INV-1: each team within nominal + borrowing limit in each pool.
    for q in Quota.objects.all():
        held = sum(
            Attempt.objects.filter(
                state__in=Attempt.ACTIVE_STATES, request__team=q.team, pool=q.pool
            ).values_list("gpus_milli", flat=True)
        )
        limit = q.nominal_milli + (
            q.borrowing_limit_milli if q.borrowing_limit_milli is not None else 10**9
        )
        assert held <= limit, f"{q.team}@{q.pool}: {held} > {limit}"


def test_fi01_concurrent_ticks_never_double_book() -> None:
    """FI-01: two threads, their own connections, ticking concurrently."""
    w = make_world()
    for i in range(24):
        submit(w.bob if i % 2 else w.alice, w.vision, count=1 + i % 4)
        submit(w.carol, w.nlp, count=2)
    before = SchedulerState.objects.get_or_create(pk=1)[0]
    errors: list[BaseException] = []

    def ticker() -> None:
        try:
            for _ in range(8):
                run_tick()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=ticker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    _assert_invariants()
    admits = Decision.objects.filter(kind="admit").values_list("request_id", flat=True)
    assert len(admits) == len(set(admits)) > 0
    state = SchedulerState.objects.get(pk=1)
    assert (state.ticks + state.skipped_ticks) - (before.ticks + before.skipped_ticks) == 16


def test_fi05_a_submit_succeeds_with_the_broker_down(monkeypatch: pytest.MonkeyPatch) -> None:
    """FI-05: the broker is down during submits; requests are kept and scheduled by the next tick."""
    from portal import tasks

    def down() -> None:
        raise ConnectionError("redis is down")

    monkeypatch.setattr(tasks.tick, "delay", down)
    monkeypatch.setattr("portal.services.requests._wake_scheduler", _real_wake)
    w = make_world()
    req = submit(w.bob, w.vision)
    assert GpuRequest.objects.get(pk=req.pk).state == "pending"
    run_tick()
    assert GpuRequest.objects.get(pk=req.pk).state == "admitted"


def test_fi06_a_tick_that_dies_midway_leaves_nothing_half_applied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """FI-06: the tick fails after writing its admissions; all of it rolls back, the next one succeeds."""
    from portal.models import Decision
    from portal.tick import apply

    w = make_world()
    reqs = [submit(w.bob, w.vision) for _ in range(3)]
    real_insert = apply.insert_rows
    written: list[str] = []

    def insert_then_die(model: type, *args: object, **kwargs: object) -> list[int]:
        if model is Decision:  # the attempts and allocations are in by now
            raise ConnectionError("server closed the connection unexpectedly")
        written.append(model.__name__)
        return real_insert(model, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(apply, "insert_rows", insert_then_die)
    with pytest.raises(ConnectionError):
        run_tick()
    assert {"Attempt", "Allocation"} <= set(written)
    assert not Attempt.objects.exists() and not Allocation.objects.exists()
    assert set(GpuRequest.objects.values_list("state", flat=True)) == {"pending"}
    assert SchedulerState.objects.get(pk=1).failed_ticks == 1
    monkeypatch.setattr(apply, "insert_rows", real_insert)
    run_tick()
    assert GpuRequest.objects.filter(pk__in=[r.pk for r in reqs], state="admitted").count() == 3


def test_fi18_lowering_a_quota_blocks_admissions_but_keeps_running_work() -> None:
    """FI-18: a quota lowered below current usage."""
    w = make_world()
    pool = Pool.objects.get(name="a100-train")
    running = submit(w.bob, w.vision, count=4)
    run_tick()
    quota_set(actor=w.dave, team=w.vision, pool=pool, nominal_milli=0, borrowing_limit_milli=0)
    later = submit(w.bob, w.vision, count=1)
    run_tick()
    assert GpuRequest.objects.get(pk=running.pk).state == "admitted"
    assert Attempt.objects.get(request=running).state == "admitted"
    later.refresh_from_db()
    assert later.state == "pending" and later.status_message


def test_fi19_a_request_of_someone_who_left_the_team_is_cancelled_and_audited() -> None:
    """FI-19: the submitter is removed from the team while the request is pending."""
    w = make_world()
    req = submit(w.bob, w.vision)
    Membership.objects.filter(user=w.bob, team=w.vision).delete()
    run_tick()
    req.refresh_from_db()
    assert req.state == "cancelled" and "no longer a member" in req.end_reason
    assert not req.attempts.exists()
    assert AuditEvent.objects.filter(
        action="request.cancel", object_id=str(req.pk), actor=None
    ).exists()


def test_member_caps_hold_requests_back_with_a_reason() -> None:
    """A lead's per-member cap is enforced at admission, not only stored."""
    w = make_world()
    Membership.objects.filter(user=w.bob, team=w.vision).update(gpu_cap_milli=2000)
    first = submit(w.bob, w.vision, count=2)
    second = submit(w.bob, w.vision, count=1)
    other = submit(w.alice, w.vision, count=1)
    run_tick()
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.state == "admitted"
    assert second.state == "pending" and second.status_code == "member-cap"
    assert "cap in team vision is 2 GPUs" in second.status_message
    assert GpuRequest.objects.get(pk=other.pk).state == "admitted"
    assert Decision.objects.filter(request=second, code="member-cap").count() == 1


def test_fi21_a_killed_lock_holder_does_not_stop_the_next_tick() -> None:
    """FI-21: process A holds the tick lock and dies; B's next tick admits."""
    w = make_world()
    req = submit(w.bob, w.vision)
    if connection.vendor == "postgresql":
        other = connections.create_connection("default")
        other.connect()
        other.set_autocommit(False)
        with other.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", [TICK_LOCK_KEY])
        assert run_tick().ran is False
        with other.cursor() as cur:
            cur.execute("SELECT pg_backend_pid()")
            holder_pid = cur.fetchone()[0]
        other.close()  # the holder dies: PostgreSQL drops its transaction and the lock
        # The server ends the backend asynchronously after the socket closes; the
        # lock is gone once the backend is, which may take a moment on a loaded host.
        deadline = time.monotonic() + 30
        with connection.cursor() as cur:
            while time.monotonic() < deadline:
                cur.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [holder_pid])
                if cur.fetchone()[0] == 0:
                    break
                time.sleep(0.05)
        assert run_tick().ran is True
    else:
        SchedulerState.objects.update_or_create(
            pk=1, defaults={"lease_until": timezone.now() + timedelta(seconds=120)}
        )
        assert run_tick().ran is False
        assert run_tick(now=timezone.now() + timedelta(seconds=121)).ran is True
    assert GpuRequest.objects.get(pk=req.pk).state == "admitted"
