"""/metrics as Prometheus reads it, and the decision log behind its counters."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from portal.metrics.collector import metrics_text
from portal.models import Attempt, Decision, DecisionTally, GpuRequest
from portal.services.requests import gpu_request_cancel
from portal.services.retention import decisions_prune
from portal.tick.apply import decisions_apply, reason_key
from portal.tick.reconcile import reconcile
from portal.tick.run import run_tick
from portal.tick.snapshot import build_snapshot
from scheduling import types as st
from tests.base import World, make_world, submit
from tests.chart.scrape import parse

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> World:
    return make_world()


def _as(name: str) -> str:
    from django.test.utils import override_settings

    with override_settings(METRICS_REPLICA=name):
        return metrics_text().decode()


def test_the_admission_wait_histogram_counts_real_waits(world: World) -> None:
    """It was always empty: buckets were stored under "1" and read under "1.0"."""
    start = timezone.now()
    with time_machine.travel(start, tick=False) as clock:
        running = [submit(world.bob, world.vision, count=8) for _ in range(4)]
        run_tick()
        at_once = sum(1 for r in running if r.attempts.exists())
        assert at_once >= 2
        # The pool is full (or vision's quota is): this one waits 90 s for its turn.
        waiting = submit(world.bob, world.vision, count=8)
        run_tick()
        assert not waiting.attempts.exists()
        clock.move_to(start + timedelta(seconds=90))
        for r in running:
            if r.attempts.exists():
                gpu_request_cancel(user=world.bob, gpu_request=r)
        reconcile()
        run_tick()
        assert waiting.attempts.exists()
    admitted = Attempt.objects.filter(number=1).count()
    m = parse(_as("web-0"))
    key = 'quartermaster_admission_wait_time_seconds_bucket{{class="training",le="{le}",priority="100",team="vision"}}'
    assert m[key.format(le="1.0")] == at_once
    assert m[key.format(le="60.0")] == at_once
    assert m[key.format(le="120.0")] == admitted > at_once
    assert m[key.format(le="+Inf")] == admitted
    total = 'quartermaster_admission_wait_time_seconds_sum{class="training",priority="100",team="vision"}'
    assert 89 * (admitted - at_once) <= m[total] <= 91 * (admitted - at_once)


def test_admissions_preemptions_and_evictions_carry_the_team(world: World) -> None:
    submit(world.bob, world.vision)
    run_tick()
    m = parse(_as("web-0"))
    assert m['quartermaster_admitted_requests_total{pool="a100-train",team="vision"}'] == 1


def test_one_replica_exports_the_database_numbers(world: World, settings: Any) -> None:
    """Every replica reads the same database; sum() over replicas counted everything twice."""
    submit(world.bob, world.vision)
    run_tick()
    leader = parse(_as("web-a"))
    follower = parse(_as("web-b"))
    assert leader['quartermaster_metrics_exporter{replica_role="leader"}'] == 1
    assert any(k.startswith("quartermaster_pending_requests") for k in leader) or any(
        k.startswith("quartermaster_admitted_requests_total") for k in leader
    )
    assert follower == {'quartermaster_metrics_exporter{replica_role="follower"}': 0}
    # The leader renews at each scrape; when it stops scraping, another replica takes over.
    assert parse(_as("web-a"))['quartermaster_metrics_exporter{replica_role="leader"}'] == 1
    later = timezone.now() + timedelta(seconds=settings.METRICS_LEASE_SECONDS + 1)
    with time_machine.travel(later, tick=False):
        taken = parse(_as("web-b"))
        assert taken['quartermaster_metrics_exporter{replica_role="leader"}'] == 1
        assert parse(_as("web-a")) == {'quartermaster_metrics_exporter{replica_role="follower"}': 0}


def test_a_scrape_reads_aggregates_not_rows(world: World) -> None:
    """The number of queries and rows a scrape reads does not grow with history."""

    def queries() -> tuple[int, int]:
        with CaptureQueriesContext(connection) as ctx:
            text = _as("web-0")
        return len(ctx.captured_queries), len(text.splitlines())

    for _ in range(3):
        submit(world.bob, world.vision)
    run_tick()
    queries()  # the first scrape creates the lease row
    small = queries()
    for _ in range(20):
        submit(world.bob, world.vision)
    run_tick()
    big = queries()
    assert big[0] == small[0]
    # Same teams, classes and pools: the same series, whatever the number of requests.
    assert big[1] - small[1] <= 4


def _decision(kind: str, code: str, days_old: float, world: World) -> Decision:
    d = Decision.objects.create(kind=kind, code=code, message="m", team=world.vision)
    Decision.objects.filter(pk=d.pk).update(created_at=timezone.now() - timedelta(days=days_old))
    return d


def test_pruning_the_decision_log_keeps_the_counters(world: World, settings: Any) -> None:
    submit(world.bob, world.vision)
    run_tick()
    for days in (200, 120, 91, 10):
        _decision("preempt", "reclaim", days, world)
    before = parse(_as("web-0"))
    assert decisions_prune() == 3  # default: 90 days
    assert Decision.objects.filter(kind="preempt").count() == 1
    assert DecisionTally.objects.get(kind="preempt", code="reclaim", team_name="vision").n == 3
    assert parse(_as("web-0")) == before
    assert decisions_prune() == 0
    settings.DECISION_RETENTION_DAYS = 5
    assert decisions_prune() >= 1
    assert parse(_as("web-0")) == before
    assert decisions_prune(days=0) == 0  # 0 keeps everything


def test_the_decision_log_ignores_detail_that_changes_every_tick(world: World) -> None:
    """ "N nodes are held for earlier large requests" changed every tick and wrote a row each time."""
    req = submit(world.bob, world.vision)
    GpuRequest.objects.filter(pk=req.pk).update(status_code="", status_message="")
    req.refresh_from_db()
    base = "waiting: no node in pool a100-train has 1 GPU free right now"
    before = Decision.objects.filter(request=req, kind="wait").count()

    def tick(tick_no: int, code: str, message: str) -> None:
        d = st.Decision(
            kind=st.DecisionKind.WAIT, request_id=str(req.pk), code=code, message=message,
            position=1,
        )  # fmt: skip
        decisions_apply(decisions=[d], ctx=build_snapshot(timezone.now())[1], tick_no=tick_no)

    for tick_no, suffix in enumerate(["", "; 3 nodes are held for earlier large requests",
                                      "; 2 nodes are held for earlier large requests", ""]):  # fmt: skip
        tick(tick_no, "no-capacity", base + suffix)
    assert Decision.objects.filter(request=req, kind="wait").count() == before + 1
    req.refresh_from_db()
    assert req.status_message == base  # the request still shows the latest full sentence
    tick(9, "quota-exhausted", "waiting: team vision uses 16 of 16 guaranteed GPUs")
    assert Decision.objects.filter(request=req, kind="wait").count() == before + 2
    assert reason_key("backoff", "waiting: requeued after attempt 1; may start again in 5 s") == (
        "backoff",
        "waiting: requeued after attempt 1",
    )
