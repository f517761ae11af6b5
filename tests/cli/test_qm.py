"""Every `qm` command against a live test server, with a real token over real HTTP."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from cli.client import error_message
from portal.api import requests as requests_api
from portal.lib.readiness import attempt_token, ready_token_key
from portal.models import Decision, GpuRequest
from portal.selectors import requests as request_selectors
from portal.services.requests import gpu_request_cancel
from portal.tick.reconcile import reconcile
from portal.tick.run import run_tick
from tests.base import World, submit
from tests.cli.conftest import Qm

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "registry.example.com/vision/train:1.0"


def _running(world: World, **kw: Any) -> GpuRequest:
    """A request whose simulated workload has started (a second after its launch)."""
    req = submit(world.bob, world.vision, estimated_runtime_s=36_000, **kw)
    run_tick()
    deadline = time.monotonic() + 10
    while req.state != GpuRequest.State.RUNNING and time.monotonic() < deadline:
        time.sleep(0.2)
        reconcile()
        req.refresh_from_db()
    assert req.state == GpuRequest.State.RUNNING
    return req


def _waiting(world: World) -> GpuRequest:
    """A request that waits: four run on a100-train's four 8-GPU nodes, the fifth waits."""
    for i in range(5):
        submit(world.bob, world.vision, count=8, name=f"big-{i}")
    run_tick()
    req = GpuRequest.objects.filter(state=GpuRequest.State.PENDING).order_by("id").first()
    assert req is not None
    return req


# -- login ------------------------------------------------------------------------------


def test_login_checks_the_token_and_stores_it_for_the_owner_only(qm: Qm) -> None:
    r = qm("login", "--url", qm.url, "--token", qm.token, QM_URL="", QM_TOKEN="")
    assert r.exit_code == 0, r.output
    assert "your teams: vision" in r.output
    path = qm.config_home / "quartermaster" / "config"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert qm.token in path.read_text() and qm.url in path.read_text()
    # The next command reads the file: no QM_URL or QM_TOKEN needed.
    r = qm("ls", QM_URL="", QM_TOKEN="")
    assert r.exit_code == 0, r.output


def test_login_names_only_live_teams(qm: Qm, world: World) -> None:
    from portal.models import Membership
    from portal.services.teams import team_retire

    Membership.objects.create(user=world.bob, team=world.nlp, role="member")
    team_retire(actor=world.dave, team=world.nlp, confirm=True)
    r = qm("login", "--url", qm.url, "--token", qm.token, QM_URL="", QM_TOKEN="")
    assert r.exit_code == 0, r.output
    assert "your teams: vision." in r.output


def test_login_prompts_for_the_token_without_echoing_it(qm: Qm) -> None:
    r = qm("login", "--url", qm.url, input=f"{qm.token}\n", QM_URL="", QM_TOKEN="")
    assert r.exit_code == 0, r.output
    assert qm.token not in r.output


def test_a_refused_token_is_not_stored_and_exits_3(qm: Qm) -> None:
    r = qm("login", "--url", qm.url, "--token", "not-a-token", QM_URL="", QM_TOKEN="")
    assert r.exit_code == 3
    assert "qm login" in r.stderr
    assert not (qm.config_home / "quartermaster" / "config").exists()


def test_environment_overrides_the_file_and_nothing_configured_is_usage(qm: Qm) -> None:
    assert qm("login", "--url", qm.url, "--token", qm.token).exit_code == 0
    r = qm("ls", QM_TOKEN="wrong")
    assert r.exit_code == 3  # QM_TOKEN wins over the stored one
    r = qm("ls", QM_URL="", QM_TOKEN="", XDG_CONFIG_HOME=str(qm.config_home / "empty"))
    assert r.exit_code == 2 and "qm login" in r.stderr


def test_an_unreachable_portal_exits_1(qm: Qm) -> None:
    r = qm("ls", QM_URL="http://127.0.0.1:9")
    assert r.exit_code == 1 and "Cannot reach the portal" in r.stderr


# -- submit -----------------------------------------------------------------------------


def test_submit_prints_the_id_and_the_first_decision(qm: Qm, world: World) -> None:
    r = qm(
        "submit", "--class", "training", "--pool", "a100-train", "--count", "2",
        "--image", IMAGE, "--name", "bert", "--env", "EPOCHS=3", "--checkpoint-every", "600",
        "--", "python", "train.py", "--lr", "3e-4",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    req = GpuRequest.objects.get()
    assert req.name == "bert" and req.count == 2 and req.submitted_by == world.bob
    assert req.command == ["python", "train.py", "--lr", "3e-4"]
    assert req.env == {"EPOCHS": "3"} and req.checkpoint_interval_s == 600
    assert f"Submitted request #{req.pk} (bert) for team vision." in r.output
    first = Decision.objects.filter(request=req).order_by("id").first()
    assert first is not None
    assert f"Decision: {first.kind}: {first.message}" in r.output


def test_submit_reads_a_request_file_and_flags_win(qm: Qm, tmp_path: Path) -> None:
    path = tmp_path / "request.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "class": "training",
                "pool": "a100-train",
                "image": IMAGE,
                "count": 1,
                "command": ["python", "train.py"],
                "estimated-runtime": 600,
            }
        )
    )
    data = qm.json("submit", "-f", str(path), "--count", "2")
    assert data["count"] == 2 and data["estimated_runtime_s"] == 600
    assert data["command"] == ["python", "train.py"] and data["first_decision"]["request"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--class", "nope", "--image", IMAGE], "workload_class: No such workload class."),
        (["--class", "training"], "image: This field is required."),
        (["--class", "training", "--image", IMAGE, "--pool", "mars"], "pool: No such pool."),
    ],
)
def test_a_refused_submit_exits_4_with_the_portals_message(
    qm: Qm, args: list[str], message: str
) -> None:
    r = qm("submit", *args)
    assert r.exit_code == 4, r.output
    assert r.stderr.count(message) == 1, r.stderr
    assert not GpuRequest.objects.exists()


@pytest.mark.parametrize(
    "args", [["--env", "NOEQUALS"], ["--count", "0"], ["--frobnicate"], ["-o", "xml"]]
)
def test_bad_usage_exits_2(qm: Qm, args: list[str]) -> None:
    r = qm("submit", "--class", "training", "--image", IMAGE, *args)
    assert r.exit_code == 2
    assert not GpuRequest.objects.exists()


def test_submit_wait_follows_it_until_it_runs_and_names_pool_and_node(
    qm: Qm, world: World, beat: Any
) -> None:
    beat()
    r = qm(
        "submit", "--class", "training", "--pool", "a100-train", "--image", IMAGE,
        "--estimated-runtime", "36000", "--wait", "--timeout", "60",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    attempt = GpuRequest.objects.get().attempts.get()
    assert f"Running: pool a100-train, node {attempt.nodes[0]}." in r.stdout
    assert "Decision: admit:" in r.stdout
    # Progress on stderr (not a terminal here: a line per change, no spinner).
    assert f"#{attempt.request_id} admitted: admitted on {attempt.nodes[0]}" in r.stderr


def test_submit_wait_exits_4_when_the_request_ends_without_running(
    qm: Qm, world: World, beat: Any
) -> None:
    _waiting(world)

    def cancel_the_new_one() -> None:
        req = GpuRequest.objects.filter(name="doomed").first()
        if req is not None and req.state == GpuRequest.State.PENDING:
            gpu_request_cancel(user=world.bob, gpu_request=req, reason="changed my mind")

    beat(cancel_the_new_one)
    r = qm(
        "submit", "--class", "training", "--pool", "a100-train", "--count", "8",
        "--image", IMAGE, "--name", "doomed", "--wait", "--timeout", "60",
    )  # fmt: skip
    assert r.exit_code == 4, r.output
    assert "cancelled without running" in r.stdout
    assert "pending, position 2: waiting: team vision" in r.stderr


# -- the queue --------------------------------------------------------------------------


def test_ls_prints_a_squeue_like_table_and_json_and_yaml(qm: Qm, world: World) -> None:
    waiting = _waiting(world)
    r = qm("ls")
    assert r.exit_code == 0, r.output
    header = r.output.splitlines()[0].split()
    assert header == ["ID", "NAME", "TEAM", "CLASS", "ASKS", "STATE", "POS", "WHY", "EST.", "START"]
    row = next(x for x in r.output.splitlines() if x.startswith(f"{waiting.pk} "))
    assert "vision" in row and "training" in row and "8 whole" in row and "pending" in row
    rows = qm.json("ls")
    assert {x["id"] for x in rows} == set(GpuRequest.objects.values_list("id", flat=True))
    r = qm("ls", "--state", "pending", "-o", "yaml")
    assert [x["id"] for x in yaml.safe_load(r.stdout)] == [waiting.pk]
    r = qm("ls", "--state", "nope")
    assert r.exit_code == 4 and "state: Choose one of" in r.stderr


def test_queue_lists_pending_requests_in_order_with_position_and_why(qm: Qm, world: World) -> None:
    waiting = _waiting(world)
    rows = qm.json("queue")
    assert [x["id"] for x in rows] == [waiting.pk]
    assert rows[0]["name"] == waiting.name and rows[0]["state"] == "pending"
    r = qm("queue")
    line = next(x for x in r.output.splitlines() if x.startswith(f"{waiting.pk} "))
    waiting.refresh_from_db()
    assert f" {waiting.queue_position} " in line
    assert waiting.status_message[:30] in line
    assert qm("queue", "--team", "nlp").exit_code == 4  # not bob's team: no such team


def test_why_prints_the_decisions_and_the_wait_split(qm: Qm, world: World) -> None:
    waiting = _waiting(world)
    r = qm("why", str(waiting.pk))
    assert r.exit_code == 0, r.output
    waiting.refresh_from_db()
    assert f"Why: {waiting.status_message}" in r.output
    assert "Waited: " in r.output
    for d in Decision.objects.filter(request=waiting):
        assert d.message in r.output
    data = qm.json("why", str(waiting.pk))
    assert [w["reason"] for w in data["wait"]][:2] == ["unschedulable", "quota"]
    assert data["decisions"] and data["reason"] == waiting.status_message


# -- logs and events --------------------------------------------------------------------


def test_logs_prints_the_tail_and_a_gangs_pods(qm: Qm, world: World) -> None:
    req = _running(world, count=8, pods=2, cpu_milli=16000, memory_mib=65536)
    name = req.attempts.get().workload_name
    r = qm("logs", str(req.pk))
    assert r.exit_code == 0, r.output
    assert r.output.startswith(f"[qm] {name}-0 on ")
    r = qm("logs", str(req.pk), "--pod", "1")
    assert r.output.startswith(f"[qm] {name}-1 on ")
    assert qm.json("logs", str(req.pk), "--tail", "1")["pods"] == 2
    r = qm("logs", str(req.pk), "--pod", "2")
    assert r.exit_code == 4 and "pod: Attempt 1 has 2 pod(s)" in r.stderr


def test_logs_of_a_request_that_never_ran_exits_4_saying_so(qm: Qm, world: World) -> None:
    waiting = _waiting(world)
    r = qm("logs", str(waiting.pk))
    assert r.exit_code == 4
    assert f"Request #{waiting.pk} has not run yet, so it has no log." in r.stderr


def test_logs_follow_streams_until_the_request_ends(
    qm: Qm, world: World, beat: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The portal ends each stream after 0.7 s: qm reconnects, neither repeating nor skipping.
    monkeypatch.setattr(request_selectors, "LOG_FOLLOW_MAX_S", 0.7)
    connections: list[str] = []
    monkeypatch.setattr(
        requests_api,
        "request_log_follow",
        _counting(request_selectors.request_log_follow, connections),
    )
    req = _running(world)
    started = time.monotonic()

    def cancel_after_3_s() -> None:
        r = GpuRequest.objects.get(pk=req.pk)
        if time.monotonic() - started > 3 and r.state == GpuRequest.State.RUNNING:
            gpu_request_cancel(user=world.bob, gpu_request=r)

    beat(cancel_after_3_s)
    r = qm("logs", "-f", str(req.pk), "--tail", "1")
    assert r.exit_code == 0, r.output
    steps = [int(x.split()[3]) for x in r.output.splitlines() if x.startswith("epoch 1 step ")]
    # Lines printed while following: more than the one-line tail, each once, in order.
    assert len(steps) >= 3 and steps == list(range(steps[0], steps[-1] + 1))
    assert GpuRequest.objects.get(pk=req.pk).state == GpuRequest.State.CANCELLED
    assert len(connections) >= 3


def _counting(follow: Any, calls: list[str]) -> Any:
    def wrapped(*args: Any, **kw: Any) -> Any:
        calls.append(repr(kw.get("after")))
        return follow(*args, **kw)

    return wrapped


def test_events_prints_the_workloads_events(qm: Qm, world: World) -> None:
    req = _running(world)
    r = qm("events", str(req.pk))
    assert r.exit_code == 0, r.output
    assert r.output.split()[:5] == ["TIME", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    for reason in ("Scheduled", "Pulled", "Started"):
        assert reason in r.output
    data = qm.json("events", str(req.pk))
    assert data["attempt"] == 1 and data["events"]
    waiting = _waiting(world)
    r = qm("events", str(waiting.pk))
    assert r.exit_code == 0 and "has not run yet" in r.output


def test_another_teams_request_is_not_found_exit_3(qm: Qm, world: World, as_user: Any) -> None:
    req = _running(world)
    carol = as_user(world.carol)
    for args in (["why"], ["logs"], ["logs", "-f"], ["events"], ["cancel"], ["checkpoint"]):
        r = carol(*args, str(req.pk))
        assert r.exit_code == 3, (args, r.output)
        assert "epoch" not in r.output
    assert qm("why", "999999").exit_code == 3
    assert GpuRequest.objects.get(pk=req.pk).state == GpuRequest.State.RUNNING


# -- changes ----------------------------------------------------------------------------


def test_cancel_ends_it_and_a_second_cancel_is_refused(qm: Qm, world: World) -> None:
    waiting = _waiting(world)
    r = qm("cancel", str(waiting.pk), "--reason", "wrong image")
    assert r.exit_code == 0, r.output
    assert f"Request #{waiting.pk} is cancelled." in r.output
    r = qm("cancel", str(waiting.pk))
    assert r.exit_code == 4 and "already cancelled" in r.stderr


def test_top_shows_pools_free_allocated_and_waiting(qm: Qm, world: World) -> None:
    _waiting(world)
    rows = {p["pool"]: p for p in qm.json("top")}
    a100 = rows["a100-train"]
    assert a100["allocated_gpus"] == 32 and a100["waiting_requests"] == 1
    assert a100["waiting_devices"] == 8
    assert a100["free_gpus"] + a100["allocated_gpus"] == a100["devices"]
    r = qm("top")
    assert r.output.split()[:8] == [
        "POOL", "GPU", "LIFECYCLE", "DEVICES", "FREE", "ALLOCATED", "WAITING", "ASKING",
    ]  # fmt: skip
    line = next(x for x in r.output.splitlines() if x.startswith("a100-train"))
    assert line.split()[-4:] == [f"{a100['free_gpus']:g}", "32", "1", "8"]


def test_checkpoint_shows_the_last_one_and_reports_from_a_workload(qm: Qm, world: World) -> None:
    req = _running(world, checkpoint_interval_s=600)
    r = qm("checkpoint", str(req.pk))
    assert r.exit_code == 0, r.output
    assert "checkpoints every 10m 0s" in r.output and "none finished yet" in r.output
    attempt = req.attempts.get()
    # Inside the workload: the attempt's own token, no user token.
    r = qm(
        "checkpoint",
        "--report",
        QM_TOKEN="",
        QM_CHECKPOINT_URL=f"{qm.url}/api/v1/attempts/{attempt.pk}/checkpoint",
        QM_ATTEMPT_TOKEN=attempt_token(
            ready_token_key(), attempt.namespace, attempt.workload_name, attempt.pk
        ),
    )
    assert r.exit_code == 0, r.output
    assert "Checkpoint recorded for attempt" in r.output
    data = qm.json("checkpoint", str(req.pk))
    assert data["checkpoints"] == 1 and data["last_checkpoint_at"]
    assert qm("checkpoint", "--report", QM_ATTEMPT_TOKEN="").exit_code == 2
    assert qm("checkpoint").exit_code == 2


def test_completion_prints_a_shell_script(qm: Qm) -> None:
    r = qm("completion", "bash")
    assert r.exit_code == 0 and "_QM_COMPLETE" in r.output and "complete " in r.output


# -- as a program -----------------------------------------------------------------------


def test_python_m_cli_runs_as_a_program_with_its_exit_codes(qm: Qm, world: World) -> None:
    waiting = _waiting(world)
    env = {**os.environ, **qm.env()}
    run = subprocess.run(
        [sys.executable, "-m", "cli", "ls", "-o", "json"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert waiting.pk in [x["id"] for x in json.loads(run.stdout)]
    run = subprocess.run(
        [sys.executable, "-m", "cli", "logs", str(waiting.pk)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 4 and "has not run yet" in run.stderr


# -- error bodies -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (404, {"detail": "Not found."}, "Not found."),
        (
            400,
            {"count": ["Too many."], "non_field_errors": ["Pick one."]},
            "count: Too many.\nPick one.",
        ),
        (
            400,
            {
                "type": "about:blank",
                "title": "Invalid input",
                "status": 400,
                "detail": "The request has 1 invalid field.",
                "code": "invalid",
                "errors": {"pool": ["No such pool."]},
            },
            "The request has 1 invalid field.\npool: No such pool.",
        ),
        (
            400,
            {"title": "Invalid input", "errors": [{"pointer": "#/count", "detail": "Too big."}]},
            "Invalid input\ncount: Too big.",
        ),
        (409, {"title": "Conflict", "status": 409, "code": "not_started"}, "Conflict"),
        (
            # The portal's own: a detail that only joins the field errors is not said twice.
            400,
            {
                "type": "urn:quartermaster:problem:invalid",
                "title": "Bad Request",
                "status": 400,
                "detail": "count: Must be at least 1.; image: This field may not be blank.",
                "code": "invalid",
                "errors": {
                    "count": ["Must be at least 1."],
                    "image": ["This field may not be blank."],
                },
            },
            "count: Must be at least 1.\nimage: This field may not be blank.",
        ),
    ],
)
def test_the_message_comes_from_drf_errors_and_problem_details(
    status: int, body: dict[str, Any], message: str
) -> None:
    content_type = "application/problem+json" if "title" in body else "application/json"
    response = httpx.Response(
        status, content=json.dumps(body), headers={"Content-Type": content_type}
    )
    assert error_message(response) == message


def test_the_researchers_guide_shows_every_command() -> None:
    from cli.main import cli

    guide = (ROOT / "docs" / "researchers.md").read_text()
    for name in cli.commands:
        assert f"qm {name}" in guide, name
    for slurm in ("sbatch", "squeue", "scancel", "sacct"):
        assert f"`{slurm}" in guide
    for runai in ("runai submit", "runai list", "runai logs", "runai delete"):
        assert runai in guide
