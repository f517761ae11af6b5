"""Logs and events: the simulated workload writes a log, an ended attempt keeps its last
lines, a failure says what happened, and the request page shows the tail to its team only."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client
from django.urls import reverse

from portal.backends import get_backend
from portal.lib.failures import error_line
from portal.models import GpuRequest, SimulatedWorkload
from portal.tick.reconcile import reconcile
from portal.tick.run import run_tick
from tests.base import World, make_world, submit

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def world() -> World:
    return make_world()


def _advance(req: GpuRequest, seconds: float) -> None:
    """Run the simulated workload forward by moving its clock, not by sleeping."""
    w = SimulatedWorkload.objects.get(name=req.attempts.get().workload_name)
    SimulatedWorkload.objects.filter(pk=w.pk).update(
        created_at=w.created_at - timedelta(seconds=seconds),
        starts_at=w.starts_at - timedelta(seconds=seconds),
        ends_at=w.ends_at - timedelta(seconds=seconds),
    )


def _client(user) -> Client:  # noqa: ANN001
    c = Client()
    c.force_login(user)
    return c


def test_the_simulated_workload_writes_a_log_file_as_a_training_script_would(world: World) -> None:
    req = submit(world.bob, world.vision, estimated_runtime_s=36_000)  # 600 s simulated
    run_tick()
    _advance(req, 12)
    reconcile()
    attempt = req.attempts.get()
    path = Path(settings.SIMULATED_LOG_DIR) / attempt.namespace / f"{attempt.workload_name}.log"
    lines = path.read_text().splitlines()
    assert lines[0].startswith(f"[qm] {attempt.workload_name} on a100-")
    steps = [x for x in lines if x.startswith("epoch 1 step ")]
    assert 10 <= len(steps) <= 13  # one a second
    assert " loss " in steps[-1] and "samples/s" in steps[-1]
    tail = get_backend().logs(attempt.workload_name, attempt.namespace, tail_lines=3)
    assert tail.splitlines() == lines[-3:]


def test_a_failure_says_exit_code_reason_and_last_log_line(world: World) -> None:
    req = submit(world.bob, world.vision, command=["python", "train.py", "exit", "3"])
    run_tick()
    _advance(req, 4000)
    reconcile()
    reconcile()
    req.refresh_from_db()
    attempt = req.attempts.get()
    assert req.state == GpuRequest.State.FAILED
    assert attempt.exit_code == 3
    # One sentence: what happened, the log's error line (not "exited with code 3" thrice).
    assert (
        req.status_message
        == attempt.end_reason
        == (
            "the workload failed: RuntimeError: CUDA error: an illegal memory access was "
            "encountered (exit code 3)"
        )
    )
    assert "RuntimeError: CUDA error" in attempt.log_tail
    assert attempt.log_tail.splitlines()[-1] == "exited with code 3"
    assert len(attempt.log_tail.splitlines()) <= 40
    # The workload is gone; the page still shows the kept lines and why it failed.
    SimulatedWorkload.objects.all().delete()
    r = _client(world.bob).get(reverse("portal:request-logs", args=[req.pk]))
    body = r.content.decode()
    assert r.status_code == 200
    assert "RuntimeError: CUDA error" in body and 'data-testid="failure"' in body
    assert "exit code 3" in body and "(exit code 3) · exit code 3" not in body  # said once
    assert 'hx-trigger="every 3s"' not in body  # over: nothing to follow


def test_the_log_panel_follows_a_running_request_and_shows_events(world: World) -> None:
    req = submit(world.bob, world.vision, estimated_runtime_s=36_000)
    run_tick()
    _advance(req, 5)
    reconcile()
    r = _client(world.bob).get(
        reverse("portal:request-logs", args=[req.pk]), HTTP_HX_REQUEST="true"
    )
    body = r.content.decode()
    assert r.status_code == 200
    assert body.lstrip().startswith('<div id="log-panel"')  # the partial only
    assert 'hx-trigger="every 3s"' in body
    assert "epoch 1 step 3 loss" in body
    for reason in ("Scheduled", "Pulled", "Started"):
        assert f'<td class="nowrap">{reason}</td>' in body


def test_the_log_downloads_as_a_text_file(world: World) -> None:
    req = submit(world.alice, world.vision, estimated_runtime_s=36_000)
    run_tick()
    _advance(req, 5)
    reconcile()
    r = _client(world.bob).get(reverse("portal:request-logs-download", args=[req.pk]))
    assert r.status_code == 200
    assert r["Content-Type"].startswith("text/plain")
    name = req.attempts.get().workload_name
    assert r["Content-Disposition"] == f'attachment; filename="{name}.log"'
    assert b"epoch 1 step 1 loss" in r.content


def test_another_teams_member_gets_no_log(world: World) -> None:
    req = submit(world.bob, world.vision, estimated_runtime_s=36_000)
    run_tick()
    _advance(req, 5)
    reconcile()
    carol = _client(world.carol)
    for name in ("portal:request-logs", "portal:request-logs-download"):
        r = carol.get(reverse(name, args=[req.pk]), HTTP_HX_REQUEST="true")
        assert r.status_code == 404
        assert b"epoch" not in r.content
    # The team's lead and a platform admin see it.
    for user in (world.alice, world.dave):
        assert _client(user).get(reverse("portal:request-logs", args=[req.pk])).status_code == 200


def test_a_pending_request_has_no_log_yet_but_is_followed(world: World) -> None:
    for i in range(5):
        submit(world.bob, world.vision, count=8, name=f"big-{i}")
    run_tick()
    waiting = GpuRequest.objects.filter(state=GpuRequest.State.PENDING).first()
    assert waiting is not None
    r = _client(world.bob).get(reverse("portal:request-logs", args=[waiting.pk]))
    body = r.content.decode()
    assert "Nothing has run yet" in body and 'hx-trigger="every 3s"' in body


@pytest.mark.parametrize(
    ("log", "line"),
    [
        (
            'Traceback (most recent call last):\n  File "t.py", line 3, in <module>\n'
            "RuntimeError: CUDA error: an illegal memory access was encountered\n"
            "exited with code 1\n",
            "RuntimeError: CUDA error: an illegal memory access was encountered",
        ),
        ("step 9 loss 0.1\nKilled\n", "Killed"),
        (
            "rank 3: NCCL WARN Call to connect returned Connection refused\nstep 1\n",
            "rank 3: NCCL WARN Call to connect returned Connection refused",
        ),
        (
            "reading shards\nError: cannot open /data/shard-7\nexited with code 2\n",
            "Error: cannot open /data/shard-7",
        ),
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        ),
        ("container main terminated: OOMKilled\n", "container main terminated: OOMKilled"),
        ("step 1\nstep 2\nexited with code 1\n", None),
    ],
)
def test_the_error_line_is_the_last_one_that_names_an_error(log: str, line: str | None) -> None:
    assert error_line(log) == line


def test_a_gangs_log_is_read_pod_by_pod_on_the_page(world: World) -> None:
    req = submit(world.bob, world.vision, count=1, pods=2, estimated_runtime_s=36_000)
    run_tick()
    assert len(req.attempts.get().nodes) == 2
    c = _client(world.bob)
    url = reverse("portal:request-logs", args=[req.pk])
    body = c.get(url).content.decode()
    assert 'aria-label="Pods of the gang"' in body
    assert body.count('aria-current="page"') == 1 and "?pod=1" in body
    second = c.get(url + "?pod=1", HTTP_HX_REQUEST="true").content.decode()
    assert f'hx-get="{url}?pod=1"' in second  # the panel follows the chosen pod
    assert c.get(url + "?pod=7").status_code == 400
    assert c.get(url + "?pod=x").status_code == 400


def test_the_log_of_a_request_that_never_ran_says_so(world: World) -> None:
    req = submit(world.bob, world.vision, count=1)  # not ticked: it never ran
    r = _client(world.bob).get(reverse("portal:request-logs-download", args=[req.pk]))
    assert r.status_code == 404
    assert "has not run yet, so it has no log" in r.content.decode()
    assert "Content-Disposition" not in r
