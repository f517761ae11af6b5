from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from portal.backends.base import Outcome, WorkloadStatus
from portal.models import Allocation, Attempt, Decision, GpuRequest, SchedulerState, UsageRecord
from portal.services.attempts import attempt_observe, attempt_stop, release_attempt
from portal.services.requests import gpu_request_cancel
from portal.tick.reconcile import reconcile
from portal.tick.run import TICK_LOCK_KEY, run_tick
from tests.base import make_world, submit

pytestmark = pytest.mark.django_db(transaction=True)


def _advance(req: GpuRequest, seconds: float) -> None:
    """Run the simulated workload forward by moving its clock, not by sleeping."""
    from portal.models import SimulatedWorkload

    w = SimulatedWorkload.objects.get(name=req.attempts.get().workload_name)
    SimulatedWorkload.objects.filter(pk=w.pk).update(
        starts_at=w.starts_at - timedelta(seconds=seconds),
        ends_at=w.ends_at - timedelta(seconds=seconds),
    )


def test_it_admits_runs_and_finishes_a_request_releasing_quota_once() -> None:
    w = make_world()
    req = submit(w.bob, w.vision, count=2)
    run_tick()
    req.refresh_from_db()
    assert req.state == GpuRequest.State.ADMITTED
    attempt = req.attempts.get()
    assert Allocation.objects.filter(attempt=attempt, active=True).count() == 2
    assert Decision.objects.filter(request=req, kind="admit").count() == 1

    _advance(req, 2)
    reconcile()
    req.refresh_from_db()
    assert req.state == GpuRequest.State.RUNNING

    _advance(req, 3600)
    reconcile()
    req.refresh_from_db()
    attempt.refresh_from_db()
    assert req.state == GpuRequest.State.SUCCEEDED
    assert attempt.released_at is not None
    assert not Allocation.objects.filter(attempt=attempt, active=True).exists()
    usage = UsageRecord.objects.get(attempt=attempt)
    assert usage.ended_at is not None and usage.gpu_milli_seconds >= 0

    # A late, duplicated ending changes nothing: quota is released exactly once.
    released_at = attempt.released_at
    assert release_attempt(attempt, now=timezone.now(), charged=True) is False
    attempt_observe(attempt_id=attempt.pk, status=WorkloadStatus("x", "y", Outcome.FAILED))
    attempt.refresh_from_db()
    assert attempt.released_at == released_at and attempt.state == Attempt.State.SUCCEEDED


def test_it_fails_a_request_whose_workload_exits_non_zero() -> None:
    w = make_world()
    req = submit(w.bob, w.vision, command=["python", "train.py", "exit", "3"])
    run_tick()
    _advance(req, 4000)
    reconcile()  # running
    reconcile()  # ended
    req.refresh_from_db()
    assert req.state == GpuRequest.State.FAILED
    assert req.attempts.get().exit_code == 3


def test_it_requeues_a_preempted_attempt_with_backoff_and_does_not_charge_it(
    settings: object,
) -> None:
    w = make_world()
    req = submit(w.bob, w.vision)
    run_tick()
    attempt = req.attempts.get()
    with transaction.atomic():
        attempt_stop(attempt, reason="preempted")
    reconcile()
    req.refresh_from_db()
    attempt.refresh_from_db()
    assert attempt.state == Attempt.State.PREEMPTED and attempt.released_at is not None
    assert req.state == GpuRequest.State.PENDING and req.requeue_count == 1
    delay = (req.requeue_at - timezone.now()).total_seconds()
    assert 50 <= delay <= 66  # base 60 s plus up to 10% jitter
    assert UsageRecord.objects.get(attempt=attempt).charged is False
    # Not before its requeue time ...
    run_tick()
    req.refresh_from_db()
    assert req.state == GpuRequest.State.PENDING
    # ... and admitted again after it, as attempt 2.
    run_tick(now=req.requeue_at + timedelta(seconds=1))
    req.refresh_from_db()
    assert req.state == GpuRequest.State.ADMITTED
    assert req.attempts.filter(number=2).exists()


def test_it_gives_up_after_the_requeue_limit(settings: object) -> None:
    settings.REQUEUE_LIMIT = 1  # type: ignore[attr-defined]
    w = make_world()
    req = submit(w.bob, w.vision)
    for _ in range(2):
        run_tick(now=timezone.now() + timedelta(hours=2))
        attempt = req.attempts.filter(state__in=Attempt.ACTIVE_STATES).get()
        attempt_observe(attempt_id=attempt.pk, status=WorkloadStatus("n", "ns", Outcome.NODE_LOST))
    req.refresh_from_db()
    assert req.state == GpuRequest.State.FAILED
    assert "gave up after 1 requeues" in req.end_reason


def test_it_relaunches_an_admitted_attempt_whose_launch_was_lost() -> None:
    from portal.models import SimulatedWorkload

    w = make_world()
    req = submit(w.bob, w.vision)
    run_tick()
    SimulatedWorkload.objects.all().delete()
    # Not at once (relaunches back off), but after the backoff.
    assert reconcile().get("launch_backoff") == 1
    counts = reconcile(now=timezone.now() + timedelta(minutes=1))
    assert counts.get("relaunched") == 1
    assert SimulatedWorkload.objects.filter(name=req.attempts.get().workload_name).count() == 1


def test_it_keeps_cancelled_running_work_on_its_devices_until_the_pod_is_gone() -> None:
    w = make_world()
    req = submit(w.bob, w.vision)
    run_tick()
    gpu_request_cancel(user=w.bob, gpu_request=req)
    attempt = req.attempts.get()
    assert attempt.state == Attempt.State.STOPPING
    assert Allocation.objects.filter(attempt=attempt, active=True).exists()
    reconcile()
    attempt.refresh_from_db()
    assert attempt.state == Attempt.State.CANCELLED
    assert not Allocation.objects.filter(attempt=attempt, active=True).exists()


def test_it_writes_one_wait_decision_per_change_of_reason() -> None:
    w = make_world()
    reqs = [submit(w.bob, w.vision, count=8) for _ in range(6)]
    run_tick()
    run_tick()
    waiting = [r for r in reqs if GpuRequest.objects.get(pk=r.pk).state == GpuRequest.State.PENDING]
    assert waiting, "the pool holds 4 nodes of 8 GPUs; some of 6 eight-GPU requests must wait"
    for r in waiting:
        r.refresh_from_db()
        assert r.status_message and r.queue_position
        assert Decision.objects.filter(request=r, kind="wait").count() == 1


def test_it_skips_a_tick_while_another_holds_the_lock() -> None:
    make_world()
    state, _ = SchedulerState.objects.get_or_create(pk=1)
    if connection.vendor == "postgresql":
        other = connections.create_connection("default")
        other.connect()
        other.set_autocommit(False)
        with other.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", [TICK_LOCK_KEY])
        try:
            result = run_tick()
        finally:
            other.rollback()
            other.close()
    else:
        SchedulerState.objects.filter(pk=1).update(
            lease_until=timezone.now() + timedelta(minutes=1)
        )
        result = run_tick()
    assert result.ran is False
    assert SchedulerState.objects.get(pk=1).skipped_ticks == state.skipped_ticks + 1
    if connection.vendor != "postgresql":
        SchedulerState.objects.filter(pk=1).update(lease_until=None)
    assert run_tick().ran is True


def test_a_reconcile_is_skipped_while_another_one_holds_the_lock() -> None:
    import threading

    from portal.tick.reconcile import reconcile_lock

    make_world()
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        try:
            with reconcile_lock() as got:
                assert got
                held.set()
                release.wait(10)
        finally:
            connection.close()

    t = threading.Thread(target=holder)
    t.start()
    assert held.wait(10)
    try:
        assert reconcile() == {"skipped": 1}
    finally:
        release.set()
        t.join(10)
    assert "skipped" not in reconcile()


def test_the_next_tick_starts_from_the_packer_state_the_last_one_left() -> None:
    """`scheduling.keeper` in the worker: each tick brings the state the last one left to
    what runs now (the keeper's own tests check, tick by tick, that it then decides as a
    state built anew); here the portal's ticks keep it and it holds what runs."""
    from portal.tick import run as run_module
    from portal.tick.snapshot import build_snapshot
    from scheduling import cycle
    from scheduling.profile import load

    w = make_world()
    # (each submit wakes a tick of its own)
    reqs = [submit(w.alice, w.vision) for _ in range(3)]
    gpu_request_cancel(user=w.alice, gpu_request=reqs[0])
    submit(w.carol, w.nlp)
    run_tick()
    kept = run_module._KEEPER._kept
    assert kept is not None
    admitted = {k[1:] for k in kept.taken if k.startswith("+")}
    held = {k for k in kept.taken if not k.startswith("+")}
    held |= {
        str(pk)
        for pk in Attempt.objects.filter(request_id__in=admitted).values_list("pk", flat=True)
    }
    active = Attempt.objects.filter(state__in=Attempt.ACTIVE_STATES).values_list("pk", flat=True)
    assert held == {str(pk) for pk in active}
    assert len(held) >= 3
    # what it holds is what a state built from the database holds
    snapshot, _ = build_snapshot(timezone.now())
    fresh = cycle.cluster_state(snapshot, load("default").policy())
    for node in snapshot.nodes:
        assert kept.state.free_capacity(node.name) == fresh.free_capacity(node.name)
