"""Checkpoints end to end on the simulated cluster (docs/checkpoints.md).

The workload is told where to checkpoint, reports each finished checkpoint with its
attempt's token, and a preempted attempt loses only the work since that checkpoint;
its retry finds the same directory and QM_RESUME=1.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import time_machine
from django.core.exceptions import ValidationError
from django.db import transaction
from django.test import Client
from django.utils import timezone

from portal.backends.base import Outcome, WorkloadStatus
from portal.lib.readiness import attempt_token, ready_token_key
from portal.models import (
    Attempt,
    Decision,
    GpuRequest,
    SimulatedWorkload,
    UsageRecord,
)
from portal.services.attempts import attempt_observe, attempt_stop
from portal.services.checkpoints import attempt_checkpoint_record, checkpoints_release
from portal.services.profiles import policy_profile_ensure, policy_profile_update
from portal.services.requests import gpu_request_cancel
from portal.tick.reconcile import reconcile
from portal.tick.run import run_tick
from scheduling.types import Policy
from tests.base import World, make_world, submit

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def world() -> World:
    return make_world()


def _workload(attempt: Attempt) -> SimulatedWorkload:
    return SimulatedWorkload.objects.get(name=attempt.workload_name)


def _advance(attempt: Attempt, seconds: float) -> None:
    """Run the simulated workload forward by moving its clock, not by sleeping."""
    w = _workload(attempt)
    SimulatedWorkload.objects.filter(pk=w.pk).update(
        starts_at=w.starts_at - timedelta(seconds=seconds),
        ends_at=w.ends_at - timedelta(seconds=seconds),
    )


def _run_for(attempt: Attempt, *, started_ago_s: int, checkpoint_ago_s: int | None) -> None:
    """Make an admitted attempt one that has run for a while (and maybe checkpointed)."""
    now = timezone.now()
    begun = now - timedelta(seconds=started_ago_s)
    Attempt.objects.filter(pk=attempt.pk).update(
        state=Attempt.State.RUNNING,
        admitted_at=begun,
        started_at=begun,
        last_checkpoint_at=None
        if checkpoint_ago_s is None
        else now - timedelta(seconds=checkpoint_ago_s),
    )
    UsageRecord.objects.filter(attempt=attempt).update(started_at=begun)


# -- lost work ------------------------------------------------------------------------


def _fill_pool_and_reclaim(
    world: World, *, started_ago_s: int, checkpointed: int | None, checkpoint_ago_s: int = 60
) -> list[Attempt]:
    """Vision runs 8 GPUs; nlp borrows to run three 8-GPU training runs, `started_ago_s`
    old, the `checkpointed`-th of which checkpointed `checkpoint_ago_s` ago. The pool (32 GPUs) is
    full when vision asks for 8 more within its guarantee: nlp's borrowed capacity is
    reclaimed once the request has waited the policy's preempt_after_s."""
    submit(world.bob, world.vision, count=8)
    runs = [submit(world.carol, world.nlp, count=8, checkpoint_interval_s=600) for _ in range(3)]
    run_tick()
    attempts = [r.attempts.get() for r in runs]
    for i, a in enumerate(attempts):
        _run_for(
            a,
            started_ago_s=started_ago_s,
            checkpoint_ago_s=checkpoint_ago_s if i == checkpointed else None,
        )
    req = submit(world.alice, world.vision, count=8)
    waited = timezone.now() - timedelta(seconds=Policy().preempt_after_s + 60)
    GpuRequest.objects.filter(pk=req.pk).update(created_at=waited)
    run_tick()
    return attempts


def test_preempting_an_attempt_that_checkpointed_a_minute_ago_loses_a_minute(
    world: World,
) -> None:
    victim = _fill_pool_and_reclaim(world, started_ago_s=1800, checkpointed=1)[1]
    d = Decision.objects.get(kind="preempt")
    assert d.attempt_id == victim.pk  # the checkpointed one loses least
    assert "it loses 1 min of work since its last checkpoint" in d.message
    assert "(0.13 GPU-hours)" in d.message
    assert 55 <= d.facts["lost_seconds"] <= 65
    assert d.facts["last_checkpoint_at"] is not None

    reconcile()  # the simulated workload stops: preempted
    victim.refresh_from_db()
    assert victim.state == Attempt.State.PREEMPTED
    usage = UsageRecord.objects.get(attempt=victim)
    # 8 GPUs × 1 minute thrown away, out of the 30 minutes it ran.
    assert 8000 * 55 <= usage.lost_gpu_milli_seconds <= 8000 * 70
    assert usage.gpu_milli_seconds >= 8000 * 1795
    assert usage.charged is False


def test_work_lost_past_the_shipped_cap_protects_the_victim(world: World) -> None:
    # 10 minutes since the checkpoint × 8 GPUs = 4,800 GPU-seconds, above what an 8-GPU
    # request may cost a victim under the shipped profile (120 per GPU: 960): none is
    # reclaimed; the request waits for the borrowed work to end or for its promise.
    _fill_pool_and_reclaim(world, started_ago_s=1800, checkpointed=1, checkpoint_ago_s=600)
    assert Policy().victim_loss_per_gpu_s * 8 < 8 * 600
    assert not Decision.objects.filter(kind="preempt").exists()


def test_without_a_checkpoint_everything_since_the_start_is_lost(world: World) -> None:
    # Young enough (11 minutes × 8 GPUs) to stay under a victim loss cap of 900 GPU-seconds
    # per GPU of the preemptor (the shipped profile's 120 protects work that has not
    # checkpointed for 2 minutes from an 8-GPU reclaim).
    policy_profile_update(
        actor=world.dave, profile=policy_profile_ensure(), knobs={"victim_loss_per_gpu_s": 900}
    )
    _fill_pool_and_reclaim(world, started_ago_s=660, checkpointed=None)
    d = Decision.objects.get(kind="preempt")
    assert "it has not checkpointed, so it loses all 11 min of its work" in d.message
    reconcile()
    usage = UsageRecord.objects.get(attempt_id=d.attempt_id)
    assert 8000 * 655 <= usage.lost_gpu_milli_seconds <= 8000 * 670


def test_lost_work_reaches_the_metrics(world: World, client: Client, settings: Any) -> None:
    req = submit(world.bob, world.vision, count=2, checkpoint_interval_s=600)
    run_tick()
    attempt = req.attempts.get()
    _run_for(attempt, started_ago_s=1200, checkpoint_ago_s=300)
    attempt_observe(
        attempt_id=attempt.pk, status=WorkloadStatus(attempt.workload_name, "", Outcome.NODE_LOST)
    )
    settings.METRICS_TOKEN = "m-token"
    body = client.get("/metrics", HTTP_AUTHORIZATION="Bearer m-token").content.decode()
    line = next(
        ln
        for ln in body.splitlines()
        if ln.startswith('quartermaster_lost_gpu_seconds_total{pool="a100-train",team="vision"}')
    )
    assert 2 * 295 <= float(line.split()[-1]) <= 2 * 310  # 2 GPUs × 5 minutes


# -- the retry resumes --------------------------------------------------------------------


@pytest.mark.parametrize("ending", ["preempted", "node_lost"])
def test_the_retry_sees_the_same_directory_and_resumes(world: World, ending: str) -> None:
    req = submit(world.bob, world.vision, checkpoint_interval_s=600)
    run_tick()
    first = req.attempts.get()
    env1 = _workload(first).spec["env"]
    folder = Path(env1["QM_CHECKPOINT_DIR"])
    assert folder.is_dir() and folder.name == f"qm-ckpt-{req.pk}"
    assert env1["QM_CHECKPOINT_INTERVAL_S"] == "600"
    assert "QM_RESUME" not in env1  # the first attempt starts afresh

    if ending == "preempted":
        with transaction.atomic():
            attempt_stop(first, reason="preempted")
        reconcile()
    else:
        attempt_observe(
            attempt_id=first.pk,
            status=WorkloadStatus(first.workload_name, first.namespace, Outcome.NODE_LOST),
        )
    first.refresh_from_db()
    assert first.state == ending
    req.refresh_from_db()
    run_tick(now=req.requeue_at + timedelta(seconds=1))
    second = req.attempts.get(number=2)
    env2 = _workload(second).spec["env"]
    assert env2["QM_CHECKPOINT_DIR"] == str(folder)
    assert env2["QM_RESUME"] == "1"
    assert folder.is_dir()


def test_a_request_without_a_checkpoint_interval_gets_no_directory(world: World) -> None:
    req = submit(world.bob, world.vision)
    run_tick()
    env = _workload(req.attempts.get()).spec["env"]
    assert not [k for k in env if k.startswith("QM_")]


def test_a_user_may_not_set_the_checkpoint_variables(world: World) -> None:
    for name in ("QM_CHECKPOINT_DIR", "QM_RESUME", "QM_ATTEMPT_TOKEN"):
        with pytest.raises(ValidationError) as exc:
            submit(world.bob, world.vision, env={name: "/tmp"})
        assert "env" in exc.value.message_dict


# -- the simulated workload checkpoints ----------------------------------------------------


def test_the_simulated_workload_checkpoints_at_the_interval(world: World, settings: Any) -> None:
    settings.SIMULATED_SECONDS_PER_HOUR = 60  # 600 s of checkpoint interval = 10 s here
    req = submit(world.bob, world.vision, checkpoint_interval_s=600, estimated_runtime_s=3600)
    run_tick()
    attempt = req.attempts.get()
    w = _workload(attempt)
    folder = Path(w.spec["env"]["QM_CHECKPOINT_DIR"])

    with time_machine.travel(w.starts_at + timedelta(seconds=5), tick=False):
        reconcile()  # running, no checkpoint yet
    attempt.refresh_from_db()
    assert attempt.state == Attempt.State.RUNNING and attempt.last_checkpoint_at is None

    with time_machine.travel(w.starts_at + timedelta(seconds=25), tick=False):
        reconcile()  # checkpoints at 10 s and 20 s: the last one is reported
    attempt.refresh_from_db()
    assert attempt.last_checkpoint_at == w.starts_at + timedelta(seconds=20)
    written = sorted(folder.iterdir())
    assert [p.name for p in written] == [f"{attempt.workload_name}-000002.json"]
    assert json.loads(written[-1].read_text())["checkpoint"] == 2

    with time_machine.travel(w.starts_at + timedelta(seconds=35), tick=False):
        reconcile()
    later = Attempt.objects.get(pk=attempt.pk)
    assert later.last_checkpoint_at == w.starts_at + timedelta(seconds=30)
    assert later.checkpoints == 2

    # The request page shows it.
    client = Client()
    client.force_login(world.bob)
    page = client.get(f"/requests/{req.pk}/").content.decode()
    assert f"{later.last_checkpoint_at:%H:%M:%S} (2)" in page


def test_the_storage_goes_when_the_request_ends_for_good(world: World) -> None:
    req = submit(world.bob, world.vision, checkpoint_interval_s=600)
    run_tick()
    attempt = req.attempts.get()
    folder = Path(_workload(attempt).spec["env"]["QM_CHECKPOINT_DIR"])
    _advance(attempt, 5)
    reconcile()  # running
    assert folder.is_dir() and checkpoints_release() == 0
    _advance(attempt, 4000)
    reconcile()  # succeeded, and the folder is deleted after
    req.refresh_from_db()
    assert req.state == GpuRequest.State.SUCCEEDED
    assert not folder.exists() and req.checkpoints_deleted_at is not None


def test_a_cancelled_requests_storage_waits_for_its_attempt_to_stop(world: World) -> None:
    req = submit(world.bob, world.vision, checkpoint_interval_s=600)
    run_tick()
    attempt = req.attempts.get()
    folder = Path(_workload(attempt).spec["env"]["QM_CHECKPOINT_DIR"])
    assert checkpoints_release() == 0  # still running
    gpu_request_cancel(user=world.bob, gpu_request=req)
    # Cancelled, but its pod is still stopping: it may be writing a last checkpoint.
    assert checkpoints_release() == 0 and folder.is_dir()
    reconcile()
    assert not folder.exists()
    assert checkpoints_release() == 0  # once


# -- the endpoint ---------------------------------------------------------------------------


def _token(attempt: Attempt) -> str:
    return attempt_token(ready_token_key(), attempt.namespace, attempt.workload_name, attempt.pk)


def _report(attempt_id: int, token: str | None) -> Any:
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token is not None else {}
    return Client().post(f"/api/v1/attempts/{attempt_id}/checkpoint", **headers)


def test_the_workload_reports_a_checkpoint_with_its_token(world: World) -> None:
    req = submit(world.bob, world.vision, checkpoint_interval_s=600)
    run_tick()
    attempt = req.attempts.get()
    r = _report(attempt.pk, _token(attempt))
    assert r.status_code == 200, r.content
    attempt.refresh_from_db()
    assert r.json() == {
        "attempt": attempt.pk,
        "last_checkpoint_at": attempt.last_checkpoint_at.isoformat().replace("+00:00", "Z"),
        "checkpoints": 1,
    }
    assert abs((timezone.now() - attempt.last_checkpoint_at).total_seconds()) < 5
    first = attempt.last_checkpoint_at
    assert _report(attempt.pk, _token(attempt)).status_code == 200
    attempt.refresh_from_db()
    assert attempt.last_checkpoint_at >= first and attempt.checkpoints == 2


def test_last_checkpoint_at_never_moves_back(world: World) -> None:
    req = submit(world.bob, world.vision, checkpoint_interval_s=600)
    run_tick()
    attempt = req.attempts.get()
    now = timezone.now()
    assert attempt_checkpoint_record(attempt.pk, now) is True
    assert attempt_checkpoint_record(attempt.pk, now - timedelta(minutes=5)) is False
    assert attempt_checkpoint_record(attempt.pk, now) is False
    attempt.refresh_from_db()
    assert attempt.last_checkpoint_at == now and attempt.checkpoints == 1


def test_the_endpoint_refuses_other_tokens_and_ended_attempts(world: World) -> None:
    mine = submit(world.bob, world.vision, checkpoint_interval_s=600)
    theirs = submit(world.carol, world.nlp, checkpoint_interval_s=600)
    run_tick()
    a, b = mine.attempts.get(), theirs.attempts.get()

    # Another attempt's token, no token, a malformed header: 403, nothing written.
    assert _report(a.pk, _token(b)).status_code == 403
    assert _report(a.pk, None).status_code == 403
    r = Client().post(f"/api/v1/attempts/{a.pk}/checkpoint", HTTP_AUTHORIZATION=_token(a))
    assert r.status_code == 403
    # A signed-in user is not the workload.
    c = Client()
    c.force_login(world.bob)
    assert c.post(f"/api/v1/attempts/{a.pk}/checkpoint").status_code == 403
    a.refresh_from_db()
    assert a.last_checkpoint_at is None and a.checkpoints == 0

    # An unknown attempt answers exactly as a wrong token does.
    unknown = _report(999_999, _token(a))
    wrong = _report(a.pk, "0" * 64)
    assert unknown.status_code == wrong.status_code == 403
    assert unknown.json() == wrong.json()

    # An attempt that has ended: 409.
    attempt_observe(
        attempt_id=b.pk, status=WorkloadStatus(b.workload_name, b.namespace, Outcome.SUCCEEDED)
    )
    r = _report(b.pk, _token(b))
    assert r.status_code == 409 and "succeeded" in r.json()["detail"]


def test_a_stopping_workload_may_still_report_its_last_checkpoint(world: World) -> None:
    req = submit(world.bob, world.vision, checkpoint_interval_s=600)
    run_tick()
    attempt = req.attempts.get()
    with transaction.atomic():
        attempt_stop(attempt, reason="preempted")
    assert _report(attempt.pk, _token(attempt)).status_code == 200


def test_the_endpoint_is_in_the_schema(world: World) -> None:
    c = Client()
    c.force_login(world.bob)
    doc = c.get("/api/schema/", {"format": "json"}).json()
    op = doc["paths"]["/api/v1/attempts/{attempt_id}/checkpoint"]["post"]
    assert {"200", "403", "409"} <= set(op["responses"])


def test_the_documented_python_helper_saves_and_reports(
    world: World, live_server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The helper in docs/checkpoints.md, run as a training script would, over HTTP."""
    req = submit(world.bob, world.vision, checkpoint_interval_s=600)
    run_tick()
    attempt = req.attempts.get()
    doc = (Path(__file__).resolve().parents[3] / "docs" / "checkpoints.md").read_text()
    code = doc.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.setenv("QM_CHECKPOINT_DIR", str(tmp_path))
    monkeypatch.setenv("QM_CHECKPOINT_INTERVAL_S", "600")
    monkeypatch.setenv(
        "QM_CHECKPOINT_URL", live_server.url + f"/api/v1/attempts/{attempt.pk}/checkpoint"
    )
    monkeypatch.setenv("QM_ATTEMPT_TOKEN", _token(attempt))
    monkeypatch.delenv("QM_RESUME", raising=False)
    helper: dict[str, Any] = {}
    exec(compile(code, "checkpoints.md", "exec"), helper)  # noqa: S102 - our own documentation
    assert helper["resume_path"]() is None  # a first attempt starts afresh
    helper["save"](lambda p: Path(p).write_text("state"))
    assert (tmp_path / "latest.ckpt").read_text() == "state"
    attempt.refresh_from_db()
    assert attempt.last_checkpoint_at is not None and attempt.checkpoints == 1
    monkeypatch.setenv("QM_RESUME", "1")
    assert helper["resume_path"]() == str(tmp_path / "latest.ckpt")


def test_a_gang_shares_one_directory_and_rank_0_reports(world: World, settings: Any) -> None:
    settings.SIMULATED_SECONDS_PER_HOUR = 60
    req = submit(world.bob, world.vision, count=8, pods=2, checkpoint_interval_s=600)
    run_tick()
    attempt = req.attempts.get()
    members = SimulatedWorkload.objects.filter(name__startswith=f"{attempt.workload_name}-")
    dirs = {w.spec["env"]["QM_CHECKPOINT_DIR"] for w in members}
    assert members.count() == 2 and len(dirs) == 1
    rank0 = members.get(name=f"{attempt.workload_name}-0")
    with time_machine.travel(rank0.starts_at + timedelta(seconds=25), tick=False):
        reconcile()
    attempt.refresh_from_db()
    assert attempt.last_checkpoint_at == rank0.starts_at + timedelta(seconds=20)
