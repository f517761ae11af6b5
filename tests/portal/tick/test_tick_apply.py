"""The tick's bulk apply step: what it writes, and a double booking inside a batch."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.utils import timezone

import scheduling
from portal.models import Allocation, Attempt, Decision, Device, GpuRequest, UsageRecord
from portal.tick.apply import decisions_apply
from portal.tick.snapshot import build_snapshot
from scheduling import types as st
from tests.base import make_world, submit

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _no_wake(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests run the tick's steps by hand: submits must not tick on their own."""
    monkeypatch.setattr("portal.lib.wake.wake_tick", lambda: None)


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
    from portal import backends
    from portal.models import SimulatedWorkload
    from portal.tick.run import run_tick

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
    monkeypatch.setattr("portal.services.attempts.get_backend", lambda: backend)
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


def _notes_by_definition(old: dict, new: dict) -> dict:
    """The rule position_notes counts, request by request (quadratic: the reference)."""
    from portal.tick.apply import _plural

    notes = {}
    for rid, n in new.items():
        o = old.get(rid)
        if not o or not n or o == n:
            continue
        ahead_now = [x for x, p in new.items() if x != rid and p < n]
        stayed = sum(1 for x in ahead_now if old.get(x) and old[x] < o)
        arrived = sum(1 for x in ahead_now if not old.get(x))
        passed = len(ahead_now) - stayed - arrived
        fell = sum(1 for x, p in new.items() if old.get(x) and old[x] < o and p > n)
        left = max(0, (o - 1) - stayed - fell)
        why = [
            _plural(left, "request", "requests") + " ahead of it started or left the queue"
            if left
            else "",
            _plural(fell, "request", "requests") + " fell behind it" if fell else "",
            _plural(arrived, "request", "requests")
            + " of higher class, priority or fair share arrived"
            if arrived
            else "",
            _plural(passed, "request", "requests")
            + " moved ahead (priority, fair share or escalation)"
            if passed
            else "",
        ]
        why = [w for w in why if w]
        notes[rid] = f"moved from #{o} to #{n}" + (f": {'; '.join(why)}" if why else "")
    return notes


@pytest.mark.django_db(transaction=False)
@pytest.mark.parametrize("seed", range(30))
def test_position_notes_count_as_the_rule_says(seed: int) -> None:
    import random

    from portal.tick.apply import position_notes

    rng = random.Random(seed)
    ids = [f"r{i}" for i in range(rng.randint(1, 60))]
    waited = rng.sample(ids, rng.randint(0, len(ids)))
    old = {rid: p for p, rid in enumerate(rng.sample(waited, len(waited)), start=1)}
    # Some leave (admitted, cancelled), some arrive; admitted ones leave gaps in the order.
    placed = [rid for rid in rng.sample(ids, len(ids)) if rng.random() < 0.8]
    new, p = {}, 0
    for rid in placed:
        p += rng.choice((1, 1, 1, 2))
        new[rid] = p
    assert position_notes(old, new) == _notes_by_definition(old, new)


def test_waits_write_their_notes_in_the_one_bulk_update() -> None:
    """A queue of 12 moves up by one: every note goes out with the wait fields, and the
    number of statements does not grow with the queue."""
    from django.test.utils import CaptureQueriesContext

    w = make_world()
    reqs = [submit(w.bob, w.vision) for _ in range(12)]
    for i, r in enumerate(reqs, start=1):
        GpuRequest.objects.filter(pk=r.pk).update(
            status_code="no-capacity", status_message="waiting: full", queue_position=i + 1
        )
    snapshot, ctx = build_snapshot(timezone.now())
    decisions = [
        st.Decision(st.DecisionKind.WAIT, str(r.pk), "no-capacity", "waiting: full", position=i)
        for i, r in enumerate(reqs, start=1)
    ]
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        decisions_apply(decisions=decisions, ctx=ctx, tick_no=3)
    notes = dict(
        GpuRequest.objects.filter(pk__in=[r.pk for r in reqs]).values_list("pk", "position_note")
    )
    assert (
        notes[reqs[0].pk] == "moved from #2 to #1: 1 request ahead of it started or left the queue"
    )
    assert notes[reqs[-1].pk].startswith("moved from #13 to #12: 1 request ahead")
    touching = [q["sql"] for q in queries.captured_queries if "portal_gpurequest" in q["sql"]]
    assert len(touching) <= 3, touching
    # Nothing moved the next tick: the notes stay, and nothing is written.
    snapshot, ctx = build_snapshot(timezone.now())
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        decisions_apply(decisions=decisions, ctx=ctx, tick_no=4)
    assert not [q for q in queries.captured_queries if q["sql"].startswith("UPDATE")]
    assert GpuRequest.objects.get(pk=reqs[0].pk).position_note == notes[reqs[0].pk]


def test_a_request_back_in_the_queue_drops_its_old_note() -> None:
    w = make_world()
    req = submit(w.bob, w.vision)
    GpuRequest.objects.filter(pk=req.pk).update(
        status_code="no-capacity",
        status_message="waiting: full",
        position_note="moved from #5 to #3",
    )
    snapshot, ctx = build_snapshot(timezone.now())
    wait = st.Decision(
        st.DecisionKind.WAIT, str(req.pk), "no-capacity", "waiting: full", position=7
    )
    with transaction.atomic():
        decisions_apply(decisions=[wait], ctx=ctx, tick_no=5)
    req.refresh_from_db()
    assert (req.queue_position, req.position_note) == (7, "")


def test_rejections_are_told_after_the_commit_through_one_hook(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = make_world()
    a, b = submit(w.bob, w.vision), submit(w.alice, w.vision)
    sent: list[tuple[int, str]] = []
    monkeypatch.setattr(
        "portal.services.notify._enqueue", lambda pk, event: sent.append((pk, event))
    )
    snapshot, ctx = build_snapshot(timezone.now())
    decisions = [
        st.Decision(st.DecisionKind.REJECT, str(a.pk), "too-big", "never fits"),
        st.Decision(st.DecisionKind.REJECT, str(b.pk), "too-big", "never fits"),
    ]
    with transaction.atomic():
        hooks = len(connection.run_on_commit)
        decisions_apply(decisions=decisions, ctx=ctx, tick_no=6)
        assert len(connection.run_on_commit) - hooks == 1
        assert sent == []
    assert sorted(sent) == sorted([(a.pk, "failure"), (b.pk, "failure")])
    assert set(GpuRequest.objects.filter(pk__in=[a.pk, b.pk]).values_list("state", flat=True)) == {
        "failed"
    }


def test_the_tick_hands_its_admissions_to_the_launch_task(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The decisions commit first; the workloads are created by the launch task, as
    kube-scheduler binds outside its scheduling cycle."""
    from portal.models import SimulatedWorkload
    from portal.tick.run import run_tick

    w = make_world()
    reqs = [submit(w.bob, w.vision), submit(w.alice, w.vision)]
    sent: list[tuple[str, tuple[object, ...]]] = []
    monkeypatch.setattr(
        "portal.lib.wake.enqueue", lambda name, *args: sent.append((name, args)) or True
    )
    assert run_tick().admitted == 2
    attempts = sorted(Attempt.objects.filter(request__in=reqs).values_list("pk", flat=True))
    assert [(name, sorted(args[0])) for name, args in sent] == [("portal.tasks.launch", attempts)]
    assert not SimulatedWorkload.objects.exists()  # nothing launched in the tick itself
    from portal.tasks import launch

    assert launch(*sent[0][1]) == {pk: "launched" for pk in attempts}
    assert SimulatedWorkload.objects.count() == 2


def test_with_the_broker_down_the_tick_launches_its_admissions_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from portal.models import SimulatedWorkload
    from portal.tick.run import run_tick

    w = make_world()
    submit(w.bob, w.vision)
    monkeypatch.setattr("portal.lib.wake.enqueue", lambda name, *args: False)
    assert run_tick().admitted == 1
    assert SimulatedWorkload.objects.count() == 1


def test_a_reconcile_before_the_launch_task_leaves_the_launch_to_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The reconciler must not count the launch task's pending work as a lost launch."""
    from datetime import timedelta

    from portal.models import SimulatedWorkload
    from portal.tasks import launch
    from portal.tick.reconcile import reconcile
    from portal.tick.run import run_tick

    w = make_world()
    submit(w.bob, w.vision)
    sent: list[tuple[object, ...]] = []
    monkeypatch.setattr("portal.lib.wake.enqueue", lambda name, *args: sent.append(args) or True)
    now = timezone.now()
    run_tick(now=now)
    counts = reconcile(now=now + timedelta(seconds=1))
    assert counts.get("relaunched", 0) == 0 and counts.get("launch_backoff") == 1
    assert not SimulatedWorkload.objects.exists()
    (ids,) = sent[0]
    assert list(launch(ids).values()) == ["launched"]
    assert SimulatedWorkload.objects.count() == 1


def test_a_request_cancelled_since_the_snapshot_is_not_admitted() -> None:
    w = make_world()
    kept, cancelled, retried = (submit(w.bob, w.vision) for _ in range(3))
    # A request that ran before: its next attempt takes the next number.
    Attempt.objects.create(
        request=retried, number=1, state="preempted", pool=retried.pool, nodes=["a100-01"],
        workload_name=f"qm-{retried.pk}-1", namespace="ns", gpus_milli=1000,
        admitted_at=timezone.now(),
    )  # fmt: skip
    snapshot, ctx = build_snapshot(timezone.now())
    decisions = scheduling.schedule(snapshot, snapshot.now_ms)
    assert sum(d.kind == st.DecisionKind.ADMIT for d in decisions) == 3
    GpuRequest.objects.filter(pk=cancelled.pk).update(state="cancelled")
    with transaction.atomic():
        counts = decisions_apply(decisions=decisions, ctx=ctx, tick_no=3)
    assert counts["admit"] == 2
    assert GpuRequest.objects.get(pk=cancelled.pk).state == "cancelled"
    assert not Attempt.objects.filter(request=cancelled).exists()
    assert not Decision.objects.filter(request=cancelled, kind="admit").exists()
    numbers = dict(Attempt.objects.filter(state="admitted").values_list("request_id", "number"))
    assert numbers == {kept.pk: 1, retried.pk: 2}
    for req in (kept, retried):
        attempt = Attempt.objects.get(request=req, state="admitted")
        row = GpuRequest.objects.get(pk=req.pk)
        assert (row.state, row.status_code, row.queue_position) == ("admitted", "admitted", None)
        assert row.status_message.startswith("admitted on ")
        assert UsageRecord.objects.filter(attempt=attempt).count() == 1
        assert Allocation.objects.filter(attempt=attempt, active=True).exists()
        assert Decision.objects.get(request=req, kind="admit", tick=3).attempt_id == attempt.pk
