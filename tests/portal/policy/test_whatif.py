"""What-if from the shell on the site's own recorded history."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from portal.models import Attempt, GpuRequest, Pool
from portal.tick import whatif
from tests.base import World, make_world, submit

pytestmark = pytest.mark.django_db


def _ran(w: World, *, hours_ago: float, runtime_h: float, count: int = 8) -> GpuRequest:
    """A request of vision's that arrived `hours_ago` and ran `runtime_h` once started."""
    req = submit(w.bob, w.vision, count=count)
    arrived = timezone.now() - timedelta(hours=hours_ago)
    started = arrived + timedelta(minutes=1)
    GpuRequest.objects.filter(pk=req.pk).update(created_at=arrived, state="succeeded")
    Attempt.objects.create(
        request=req,
        number=1,
        state="succeeded",
        pool=Pool.objects.get(name="a100-train"),
        nodes=["a100-01"],
        workload_name=f"qm-{req.pk}-1",
        namespace="vision",
        gpus_milli=count * 1000,
        admitted_at=started,
        started_at=started,
        ended_at=started + timedelta(hours=runtime_h),
    )
    return req


def _history(w: World) -> None:
    # Eight 8-GPU jobs of 2 h within a few minutes: vision (16 nominal + 16 borrowing on a
    # 32-GPU pool) runs four at a time; the rest wait.
    for i in range(8):
        _ran(w, hours_ago=30 - i * 0.01, runtime_h=2)


def test_it_reads_the_real_arrivals_shapes_and_runtimes() -> None:
    w = make_world()
    req = _ran(w, hours_ago=10, runtime_h=3, count=4)
    old = _ran(w, hours_ago=24 * 9, runtime_h=1)
    cancelled = submit(w.bob, w.vision)
    GpuRequest.objects.filter(pk=cancelled.pk).update(state="cancelled")
    jobs, start, end = whatif.history(days=7)
    assert [j.id for j in jobs] == [str(req.pk)]
    (job,) = jobs
    assert job.runtime_ms == 3 * 3600 * 1000 and job.shape.count == 4
    assert (job.team, job.cls, job.pool) == ("vision", "training", "a100-train")
    assert end - start == 7 * 24 * 3600 * 1000
    assert str(old.pk) not in {j.id for j in jobs}


def test_the_command_prints_current_proposed_and_teams() -> None:
    w = make_world()
    _history(w)
    out = StringIO()
    call_command(
        "whatif",
        "--json",
        "--days",
        "3",
        "--set",
        "quota.vision.a100-train.borrowing=0",
        stdout=out,
    )
    result = json.loads(out.getvalue())
    assert set(result) == {"current", "proposed", "teams"}
    now, then = result["current"], result["proposed"]
    assert now["requests"] == then["requests"] == 8
    # No borrowing: two at a time instead of four, so the last waits about 6 h, not 2 h.
    assert 7000 <= now["wait_max_s"] <= 7400
    assert 21000 <= then["wait_max_s"] <= 21800
    vision = result["teams"]["vision"]
    assert vision["proposed"]["classes"]["training"]["wait_p95_s"] == then["wait_p95_s"]
    assert vision["current"]["entitlement_pct"] > 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--set", "quota.vision.nowhere=4"], "quota.vision.nowhere: no pool 'nowhere'"),
        (["--set", "policy.preempt_after_s=soon"], "policy.preempt_after_s"),
        (["--set", "novalue"], "expected KEY=VALUE"),
        (["--days", "0"], "--days"),
    ],
)
def test_bad_input_is_one_line_and_changes_nothing(argv: list[str], message: str) -> None:
    w = make_world()
    _history(w)
    before = list(Pool.objects.values_list("name", "inference_floor_milli"))
    with pytest.raises(CommandError) as err:
        call_command("whatif", "--json", *argv, stdout=StringIO())
    assert message in str(err.value) and "\n" not in str(err.value)
    assert list(Pool.objects.values_list("name", "inference_floor_milli")) == before


@pytest.mark.django_db(transaction=True)
def test_the_benchmark_seeds_history_and_times_the_whatif() -> None:
    out = StringIO()
    # --child runs in this process on the database it is given: here the test database.
    call_command(
        "bench_whatif", "--child", "--days", "2", "--per-day", "40", "--nodes", "10",
        "--gpus", "80", "--teams", "3", stdout=out,
    )  # fmt: skip
    result = json.loads(out.getvalue())
    assert result["requests"] == 80 == GpuRequest.objects.count()
    assert Attempt.objects.filter(ended_at__isnull=False).count() == 80
    assert result["seconds"] > 0 and result["history_s"] > 0
    assert result["current"]["requests"] == result["proposed"]["requests"] == 80
    assert result["current"]["rejected"] == 0
    assert result["current"]["utilization_pct"] > 0
