"""The tick's bulk apply step: what it writes, and a double booking inside a batch."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.utils import timezone

import scheduling
from portal.apply import decisions_apply
from portal.models import Allocation, Attempt, Decision, Device, GpuRequest, UsageRecord
from portal.snapshot import build_snapshot
from scheduling import types as st
from tests.base import make_world, submit

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _no_wake(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests run the tick's steps by hand: submits must not tick on their own."""
    monkeypatch.setattr("portal.wake.wake_tick", lambda: None)


def test_a_double_booking_in_the_batch_leaves_only_that_request_waiting() -> None:
    w = make_world()
    reqs = [submit(w.bob, w.vision) for _ in range(3)]
    now = timezone.now()
    snapshot, ctx = build_snapshot(now)
    decisions = scheduling.schedule(snapshot, snapshot.now_ms)
    admits = [d for d in decisions if d.kind == st.DecisionKind.ADMIT]
    assert len(admits) == 3
    # Another writer booked the device of the second admission since the snapshot.
    assert admits[1].placement is not None
    pod = admits[1].placement.pods[0]
    device = Device.objects.get(node__name=pod.node, index=pod.grants[0].device)
    other = submit(w.alice, w.vision)
    GpuRequest.objects.filter(pk=other.pk).update(state="admitted")
    squatter = Attempt.objects.create(
        request=other, number=1, pool=device.node.pool, nodes=[pod.node], workload_name="x",
        namespace="ns", gpus_milli=1000, admitted_at=now,
    )  # fmt: skip
    Allocation.objects.create(attempt=squatter, device=device, slot="gpu")
    with transaction.atomic():
        counts = decisions_apply(decisions=decisions, ctx=ctx, tick_no=7)
    assert counts["admit"] == 2
    states = dict(GpuRequest.objects.filter(pk__in=[r.pk for r in reqs]).values_list("pk", "state"))
    loser = int(admits[1].request_id)
    assert states[loser] == "pending"
    assert GpuRequest.objects.get(pk=loser).status_code == "conflict"
    assert sorted(s for pk, s in states.items() if pk != loser) == ["admitted", "admitted"]
    # Each admitted request has exactly one attempt, its allocations, usage and log row.
    for pk in states:
        n = 0 if pk == loser else 1
        assert Attempt.objects.filter(request_id=pk).count() == n
        assert UsageRecord.objects.filter(attempt__request_id=pk).count() == n
        assert Decision.objects.filter(request_id=pk, kind="admit", tick=7).count() == n
        assert Allocation.objects.filter(attempt__request_id=pk, active=True).count() == n


def test_apply_writes_only_what_changed() -> None:
    """A tick that decides what the last one did writes nothing."""
    w = make_world()
    for _ in range(40):
        submit(w.bob, w.vision, count=8)  # more than the pool holds at once
    for tick_no in (1, 2):  # the second renumbers the queue behind the first's admissions
        snapshot, ctx = build_snapshot(timezone.now())
        decisions = scheduling.schedule(snapshot, snapshot.now_ms)
        with transaction.atomic():
            decisions_apply(decisions=decisions, ctx=ctx, tick_no=tick_no)
    waiting = GpuRequest.objects.filter(state="pending")
    assert waiting.exists()
    before = dict(waiting.values_list("pk", "updated_at"))
    logged = Decision.objects.count()
    snapshot, ctx = build_snapshot(timezone.now())
    decisions = scheduling.schedule(snapshot, snapshot.now_ms)
    assert all(d.kind == st.DecisionKind.WAIT for d in decisions)
    statements: list[str] = []

    def record(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        statements.append(sql)
        return execute(sql, params, many, context)

    with transaction.atomic(), connection.execute_wrapper(record):
        counts = decisions_apply(decisions=decisions, ctx=ctx, tick_no=3)
    assert counts["wait"] == len(before)
    assert Decision.objects.count() == logged
    # Nothing changed, so nothing was written: no statement at all.
    assert statements == []
    assert dict(waiting.values_list("pk", "updated_at")) == before


def test_a_failed_bulk_launch_falls_back_to_one_launch_per_attempt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from portal import backends, services
    from portal.models import SimulatedWorkload
    from portal.tick import run_tick

    inner = backends.get_backend()

    class BulkBroken:
        name = "bulk-broken"

        def __init__(self) -> None:
            self.bulk_calls = 0

        def launch_many(self, specs: list[object]) -> None:
            self.bulk_calls += 1
            raise ConnectionError("apiserver unreachable")

        def __getattr__(self, name: str) -> object:
            return getattr(inner, name)

    backend = BulkBroken()
    monkeypatch.setattr(services, "get_backend", lambda: backend)
    w = make_world()
    reqs = [submit(w.bob, w.vision) for _ in range(2)]
    result = run_tick()
    assert result.admitted == 2 and backend.bulk_calls == 1
    attempts = Attempt.objects.filter(request__in=reqs)
    assert sorted(a.launch_tries for a in attempts) == [1, 1]
    names = set(SimulatedWorkload.objects.values_list("name", flat=True))
    assert {a.workload_name for a in attempts} <= names


def test_every_kind_of_decision_records_the_profile_and_a_preemption_its_lost_work() -> None:
    """Admit, wait, preempt and reject rows are built apart in the bulk apply: each carries
    the profile in force, and the preemption the work its victim loses."""
    w = make_world()
    victim = submit(w.carol, w.nlp, count=8)
    snapshot, ctx = build_snapshot(timezone.now())
    with transaction.atomic():
        decisions_apply(
            decisions=scheduling.schedule(snapshot, snapshot.now_ms), ctx=ctx, tick_no=1
        )
    attempt = Attempt.objects.get(request=victim)
    fresh, waiting, refused = (submit(w.bob, w.vision) for _ in range(3))
    snapshot, ctx = build_snapshot(timezone.now())
    ctx.profile_name, ctx.profile_version = "night", 4
    admit = next(
        d for d in scheduling.schedule(snapshot, snapshot.now_ms) if d.request_id == str(fresh.pk)
    )
    assert admit.kind == st.DecisionKind.ADMIT
    decisions = [
        admit,
        st.Decision(st.DecisionKind.WAIT, str(waiting.pk), "no-capacity", "waiting: full"),
        st.Decision(st.DecisionKind.PREEMPT, str(victim.pk), "reclaim", "reclaimed",
                    attempt_id=str(attempt.pk)),
        st.Decision(st.DecisionKind.REJECT, str(refused.pk), "too-big", "never fits"),
    ]  # fmt: skip
    with transaction.atomic():
        counts = decisions_apply(decisions=decisions, ctx=ctx, tick_no=2)
    assert counts["admit"] == counts["wait"] == counts["preempt"] == counts["reject"] == 1
    rows = Decision.objects.filter(tick=2)
    assert sorted(rows.values_list("kind", flat=True)) == ["admit", "preempt", "reject", "wait"]
    assert {(d.profile_name, d.profile_version) for d in rows} == {("night", 4)}
    preempt = rows.get(kind="preempt")
    assert preempt.message.startswith("reclaimed; it has not checkpointed, so it loses all")
    assert preempt.facts["lost_seconds"] >= 0 and preempt.facts["last_checkpoint_at"] is None
