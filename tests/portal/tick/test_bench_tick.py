"""`manage.py bench_tick`: one whole tick at a small size on the test database."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from portal.models import Allocation, Attempt, Decision, GpuRequest, Node, SimulatedWorkload

pytestmark = pytest.mark.django_db(transaction=True)

KEYS = {
    "pending",
    "gpus",
    "seconds",
    "cpu_seconds",
    "cpu_by_step",
    "decisions",
    "snapshot_s",
    "schedule_s",
    "apply_s",
    "queries",
    "peak_rss_mb",
}


def test_a_small_run_prints_one_json_object_with_the_tick_split_into_its_steps() -> None:
    out = StringIO()
    # --child runs in this process on the database it is given: here the test database.
    # Without --nodes, one node per 8 GPUs (as `--gpus 50000` alone must work).
    call_command(
        "bench_tick", "--child", "--json", "--pending", "50", "--gpus", "80",
        "--teams", "3", stdout=out,
    )  # fmt: skip
    result = json.loads(out.getvalue())
    assert set(result) >= KEYS
    assert result["pending"] == 50 and result["gpus"] == 80
    assert Node.objects.count() == 10
    assert result["cpu_seconds"] > 0 and result["decisions"] >= 50
    assert set(result["cpu_by_step"]) >= {"snapshot", "schedule", "apply"}
    assert result["queries"] > 0 and result["peak_rss_mb"] > 0
    for key in ("seconds", "snapshot_s", "schedule_s", "apply_s"):
        assert result[key] > 0, key
    assert result["seconds"] >= result["snapshot_s"] + result["schedule_s"] + result["apply_s"]
    # The tick really ran: 60 % of the devices were held, the rest went to the queue.
    assert result["admitted"] > 0
    assert Allocation.objects.filter(active=True).values("device").distinct().count() <= 80
    # The bench also times the tick after it, which may admit what the first one reserved
    # room for or what became due meanwhile.
    admitted = result["admitted"] + result["next_tick"]["admitted"]
    # and the quiet one 20 minutes later (whatever became due by then may start)
    later = result["later_tick"]
    assert set(later) >= {"cpu_seconds", "cpu_by_step", "queries", "decisions", "admitted"}
    assert later["decisions"] >= 50 - admitted - later["admitted"]
    assert later["queries"] > 0
    admitted += later["admitted"]
    # then one in a process with nothing kept, and one back in the first process
    for key in ("other_process_tick", "back_in_process_tick"):
        assert result[key]["queries"] > 0 and result[key]["decisions"] > 0, key
        admitted += result[key]["admitted"]
    assert GpuRequest.objects.filter(state="admitted").count() == admitted
    assert Attempt.objects.filter(state="admitted").count() == admitted
    # Launched after commit (the simulated backend), and every request got a decision.
    assert SimulatedWorkload.objects.count() >= result["admitted"]
    assert Decision.objects.filter(tick=1).count() >= 50


def test_bad_sizes_are_refused_with_one_line() -> None:
    with pytest.raises(CommandError, match="--gpus"):
        call_command("bench_tick", "--child", "--nodes", "10", "--gpus", "5")
    with pytest.raises(CommandError, match="--database-url"):
        call_command("bench_tick", "--database-url", "sqlite:///x.db")
