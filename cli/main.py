"""The `qm` commands: log in, submit, watch the queue, read logs and events, cancel, checkpoints.

Each command is one or two calls of the portal's API (/api/v1/, the OpenAPI schema at
/api/schema/); the portal decides and explains, `qm` prints. docs/researchers.md is the guide.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import httpx
import yaml
from click.shell_completion import get_completion_class

from cli import config, output
from cli.client import (
    EXIT_FAILED,
    EXIT_REFUSED,
    EXIT_USAGE,
    Api,
    QmError,
    error_message,
    exit_code_for,
)
from cli.output import FORMATS, asks, duration, when

#: how often a wait polls the portal (the scheduler ticks every few seconds)
POLL_S = 2.0
#: how long `submit` waits for the scheduler's first decision before printing the queue reason
FIRST_DECISION_S = 10.0
TERMINAL = ("succeeded", "failed", "cancelled")
#: attempt states that still run (or are stopping): their log may still grow
ACTIVE_ATTEMPT = ("admitted", "running", "stopping")
#: lines sent back when a followed log reconnects, and the portal's mark of a new attempt
FOLLOW_OVERLAP = 5
ATTEMPT_MARK = "[qm] attempt "
#: long reasons are cut in tables (`qm why` prints them whole)
WHY_WIDTH = 70


class QmGroup(click.Group):
    """Turns a QmError into its message on stderr and its exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except QmError as exc:
            click.echo(f"Error: {exc.message}", err=True)
            ctx.exit(exc.exit_code)


def output_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "-o",
        "--output",
        "fmt",
        type=click.Choice(FORMATS),
        default="table",
        show_default=True,
        help="table for people; json or yaml for scripts",
    )(f)


def _api() -> Api:
    return Api(config.load())


def _short(text: str, width: int = WHY_WIDTH) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= width else text[: width - 1] + "…"


REQUEST_COLUMNS: list[tuple[str, Callable[[dict[str, Any]], Any]]] = [
    ("ID", lambda r: r["id"]),
    ("NAME", lambda r: r.get("name", "")),
    ("TEAM", lambda r: r["team"]),
    ("CLASS", lambda r: r["workload_class"]),
    ("ASKS", asks),
    ("STATE", lambda r: r.get("state", "pending")),
    ("POS", lambda r: r.get("queue_position")),
    ("WHY", lambda r: _short(r.get("reason", ""))),
    ("EST. START", lambda r: when(r.get("estimated_start"))),
]


@click.group(cls=QmGroup, context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Quartermaster from the shell: ask for GPUs, watch the queue, read logs.

    The portal and token come from `qm login` (stored in
    $XDG_CONFIG_HOME/quartermaster/config, mode 0600), or QM_URL and QM_TOKEN.

    Exit codes: 0 ok, 1 failed or unreachable, 2 usage, 3 not found or not allowed,
    4 refused by the portal (its message on stderr).
    """


# -- login ------------------------------------------------------------------------------


@cli.command()
@click.option("--url", help="the portal, e.g. https://gpus.example.com")
@click.option("--token", help="an API token (prompted for, hidden, when not given)")
@output_option
def login(url: str | None, token: str | None, fmt: str) -> None:
    """Check a portal URL and token, then store them for the next commands."""
    current = config.load()
    if not url:
        url = click.prompt("Portal URL", default=current.url or None)
    if not token:
        token = click.prompt("API token", hide_input=True)
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise click.BadParameter("Give the URL with http:// or https://.", param_hint="--url")
    settings = config.Settings(url=url, token=token.strip())
    # Checked before it is stored: a wrong token is said now, not at the next command.
    teams = Api(settings).pages("teams/", limit=0)
    path = config.save(settings)
    # a retired team takes no new requests: not one of "your teams" to submit for
    names = [t["name"] for t in teams if not t.get("retired_at")]
    if fmt != "table":
        output.dump({"url": url, "teams": names, "config": str(path)}, fmt)
        return
    click.echo(f"Signed in to {url}; your teams: {', '.join(names) or 'none'}.")
    click.echo(f"Saved to {path} (readable by you only).")


# -- submit -----------------------------------------------------------------------------

#: flag name -> API field, for the flags that are plain values
SUBMIT_FLAGS = {
    "team": "team",
    "name": "name",
    "workload_class": "workload_class",
    "pool": "pool",
    "profile": "profile",
    "count": "count",
    "pods": "pods",
    "cpu_milli": "cpu_milli",
    "memory_mib": "memory_mib",
    "image": "image",
    "checkpoint_every": "checkpoint_interval_s",
    "max_runtime": "max_runtime_s",
    "estimated_runtime": "estimated_runtime_s",
    "priority": "priority",
}


def _read_request_file(path: str) -> dict[str, Any]:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
        data: Any = yaml.safe_load(text)
    except (OSError, yaml.YAMLError) as exc:
        raise click.BadParameter(f"Cannot read it: {exc}", param_hint="-f") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise click.BadParameter("A request file is a mapping of fields.", param_hint="-f")
    # The form's and the flags' spellings are accepted beside the API's.
    aliases = {
        "class": "workload_class",
        "cpu": "cpu_milli",
        "memory": "memory_mib",
        "checkpoint_every": "checkpoint_interval_s",
        "max_runtime": "max_runtime_s",
        "estimated_runtime": "estimated_runtime_s",
    }
    body: dict[str, Any] = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        body[aliases.get(name, name)] = value
    return body


def _env_pairs(values: tuple[str, ...]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{item!r} is not NAME=value.", param_hint="--env")
        env[name] = value
    return env


def _first_decision(api: Api, request_id: int, wait_s: float) -> dict[str, Any] | None:
    deadline = time.monotonic() + wait_s
    while True:
        rows = api.get("decisions/", request=request_id)["results"]
        if rows:
            return dict(min(rows, key=lambda d: d["id"]))
        if time.monotonic() >= deadline:
            return None
        time.sleep(min(POLL_S, wait_s))


def _placed(detail: dict[str, Any]) -> str:
    attempt = detail.get("latest_attempt") or {}
    nodes = ", ".join(attempt.get("nodes") or []) or "(not yet known)"
    return f"pool {attempt.get('pool', '?')}, node {nodes}"


def _wait_until_running(api: Api, request_id: int, timeout_s: float) -> dict[str, Any]:
    """Poll until the request runs or ends. Progress goes to stderr: a spinner with its state,
    position and reason on a terminal, else a line each time one of them changes."""
    deadline = time.monotonic() + timeout_s if timeout_s else None
    err = output.console(stderr=True)
    status = err.status(f"Waiting for request #{request_id}") if err.is_terminal else None
    said = ""
    if status is not None:
        status.start()
    try:
        while True:
            detail: dict[str, Any] = api.get(f"requests/{request_id}/")
            state = detail["state"]
            if state == "running" or state in TERMINAL:
                return detail
            where = f", position {detail['queue_position']}" if detail["queue_position"] else ""
            start = when(detail.get("estimated_start"))
            line = f"#{request_id} {state}{where}: {_short(detail['reason'], 90)}" + (
                f" (estimated start {start})" if start else ""
            )
            if status is not None:
                status.update(line)
            elif line != said:
                click.echo(line, err=True)
                said = line
            if deadline is not None and time.monotonic() >= deadline:
                raise QmError(
                    f"Request #{request_id} is still {state} after {duration(int(timeout_s))}: "
                    f"{detail['reason']}"
                )
            time.sleep(POLL_S)
    finally:
        if status is not None:
            status.stop()


@cli.command(context_settings={"ignore_unknown_options": False})
@click.option("-f", "--file", "file", help="a YAML file of the request's fields (- for stdin)")
@click.option("--team", help="your team (optional if you are in one)")
@click.option("--name", help="a name to find it by")
@click.option("--class", "workload_class", help="workload class: interactive, training, ...")
@click.option("--pool", help='a pool, or "any"')
@click.option("--profile", help="device profile, e.g. whole or mig-3g.40gb")
@click.option("--count", type=click.IntRange(1), help="devices per pod")
@click.option("--pods", type=click.IntRange(1), help="pods: more than 1 is a gang")
@click.option("--cpu", "cpu_milli", type=click.IntRange(0), help="CPU per pod, millicores")
@click.option("--memory", "memory_mib", type=click.IntRange(0), help="host memory per pod, MiB")
@click.option("--image", help="container image")
@click.option("--env", "env", multiple=True, help="NAME=value (repeatable)")
@click.option("--checkpoint-every", type=click.IntRange(0), help="checkpoint interval, seconds")
@click.option("--max-runtime", type=click.IntRange(0), help="stop it after this many seconds")
@click.option("--estimated-runtime", type=click.IntRange(1), help="your estimate, seconds")
@click.option("--priority", type=click.IntRange(-100, 100), help="within your team's requests")
@click.option("--wait", is_flag=True, help="follow it until it runs; print its pool and node")
@click.option("--timeout", type=click.IntRange(0), default=0, help="give up waiting after s")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@output_option
def submit(
    file: str | None,
    env: tuple[str, ...],
    command: tuple[str, ...],
    wait: bool,
    timeout: int,
    fmt: str,
    **flags: Any,
) -> None:
    """Ask for GPUs; the command to run comes after `--`.

    \b
    qm submit --class training --image registry.example.com/me/train:1 --count 2 \\
        -- python train.py --epochs 3
    qm submit -f request.yaml --wait
    """
    body = _read_request_file(file) if file else {}
    for flag, field in SUBMIT_FLAGS.items():
        if flags.get(flag) is not None:
            body[field] = flags[flag]
    if env:
        body["env"] = {**(body.get("env") or {}), **_env_pairs(env)}
    if command:
        body["command"] = list(command)
    api = _api()
    created: dict[str, Any] = api.post("requests/", body)
    rid = created["id"]
    decision = _first_decision(api, rid, 0 if wait else FIRST_DECISION_S)
    detail = _wait_until_running(api, rid, timeout) if wait else api.get(f"requests/{rid}/")
    if wait and decision is None:
        decision = _first_decision(api, rid, 0)
    if fmt != "table":
        output.dump({**detail, "first_decision": decision}, fmt)
    else:
        named = f" ({detail['name']})" if detail.get("name") else ""
        click.echo(f"Submitted request #{rid}{named} for team {detail['team']}.")
        if decision is not None:
            click.echo(f"Decision: {decision['kind']}: {decision['message']}")
        else:
            click.echo(f"No decision yet: {detail['reason'] or detail['state']}")
        if wait:
            _say_how_it_went(detail)
    if wait:
        _exit_unless_ran(detail)


def _say_how_it_went(detail: dict[str, Any]) -> None:
    rid = detail["id"]
    if detail["state"] == "running":
        click.echo(f"Running: {_placed(detail)}.")
    elif detail.get("latest_attempt"):
        click.echo(f"Request #{rid} ran on {_placed(detail)} and {detail['state']}.")
        if detail["reason"]:
            click.echo(detail["reason"])
    else:
        click.echo(f"Request #{rid} {detail['state']} without running: {detail['reason']}")


def _exit_unless_ran(detail: dict[str, Any]) -> None:
    if detail["state"] in ("running", "succeeded"):
        return
    # Refused (never ran) is the portal's answer; a run that failed is a failure.
    code = EXIT_FAILED if detail.get("latest_attempt") else EXIT_REFUSED
    raise click.exceptions.Exit(code)


# -- the queue --------------------------------------------------------------------------


@cli.command("ls")
@click.option("--state", help="pending, admitted, running, succeeded, failed or cancelled")
@click.option("--mine", is_flag=True, help="only requests you submitted")
@click.option("--limit", type=click.IntRange(0), default=50, show_default=True, help="0: all")
@output_option
def list_requests(state: str | None, mine: bool, limit: int, fmt: str) -> None:
    """Requests you may see, newest first (like squeue)."""
    rows = _api().pages("requests/", limit, state=state, mine="1" if mine else None)
    if fmt != "table":
        output.dump(rows, fmt)
        return
    output.table(rows, REQUEST_COLUMNS, empty="No requests.")


@cli.command()
@click.option("--class", "workload_class", help="only this workload class")
@click.option("--team", help="only this team")
@click.option("--pool", help="only this pool")
@click.option("--limit", type=click.IntRange(0), default=50, show_default=True, help="0: all")
@output_option
def queue(
    workload_class: str | None, team: str | None, pool: str | None, limit: int, fmt: str
) -> None:
    """Pending requests in the order the scheduler takes them."""
    rows = _api().pages("queue/", limit, workload_class=workload_class, team=team, pool=pool)
    if fmt != "table":
        output.dump(rows, fmt)
        return
    output.table(rows, REQUEST_COLUMNS, empty="Nothing is waiting.")


@cli.command()
@click.argument("request_id", type=int)
@output_option
def why(request_id: int, fmt: str) -> None:
    """Why a request waits (or ran, or ended): the scheduler's decisions and the wait split."""
    api = _api()
    detail = api.get(f"requests/{request_id}/")
    decisions = sorted(
        api.pages("decisions/", 200, request=request_id), key=lambda d: (d["created_at"], d["id"])
    )
    if fmt != "table":
        keys = ("id", "name", "team", "state", "queue_position", "queue_position_note")
        data = {k: detail.get(k) for k in keys}
        data.update(
            reason_code=detail["reason_code"],
            reason=detail["reason"],
            estimated_start=detail["estimated_start"],
            wait=detail.get("wait", []),
            decisions=decisions,
        )
        output.dump(data, fmt)
        return
    where = f", position {detail['queue_position']}" if detail["queue_position"] else ""
    click.echo(
        f"#{request_id} {detail['name'] or '(no name)'} "
        f"({detail['team']}, {detail['workload_class']}): {detail['state']}{where}"
    )
    if detail["reason"]:
        click.echo(f"Why: {detail['reason']}")
    if detail.get("queue_position_note"):
        click.echo(f"Position: {detail['queue_position_note']}")
    if detail.get("estimated_start"):
        click.echo(f"Estimated start: {when(detail['estimated_start'])}")
    waited = [w for w in detail.get("wait", []) if w["seconds"]]
    split = ", ".join(f"{w['reason']} {duration(w['seconds'])}" for w in waited)
    click.echo(f"Waited: {split or 'not at all'}")
    click.echo("")
    output.table(
        decisions,
        [
            ("TIME", lambda d: when(d["created_at"])),
            ("KIND", lambda d: d["kind"]),
            ("POOL", lambda d: d.get("pool") or ""),
            ("DECISION", lambda d: d["message"]),
        ],
        empty="No decisions about it yet.",
    )


# -- logs and events --------------------------------------------------------------------


@cli.command()
@click.argument("request_id", type=int)
@click.option("-f", "--follow", is_flag=True, help="keep printing new lines until it ends")
@click.option("--pod", type=click.IntRange(0), default=0, help="a gang's pod, by rank")
@click.option("--tail", type=click.IntRange(0), default=200, show_default=True, help="last lines")
@output_option
def logs(request_id: int, follow: bool, pod: int, tail: int, fmt: str) -> None:
    """The log of a request's latest attempt (its pod of rank --pod)."""
    api = _api()
    if not follow:
        data = api.get(f"requests/{request_id}/logs/", tail=tail, pod=pod)
        if fmt != "table":
            output.dump(data, fmt)
        else:
            click.echo(data["text"], nl=False)
        return
    detail = api.get(f"requests/{request_id}/")
    if detail["latest_attempt"] is None and detail["state"] not in TERMINAL:
        click.echo(
            f"Request #{request_id} is {detail['state']}; its log follows once it starts.",
            err=True,
        )
    # The portal ends a stream after a while; reconnect with the last lines printed, so that
    # the next stream starts after them, until the request is over.
    printed: list[str] = []
    while True:
        params: dict[str, Any] = {"follow": 1, "tail": tail, "pod": pod}
        if printed:
            params["after"] = printed
        for line in api.stream_lines(f"requests/{request_id}/logs/", **params):
            click.echo(json.dumps({"line": line}) if fmt == "json" else line)
            if not line.startswith(ATTEMPT_MARK):
                printed = [*printed[-(FOLLOW_OVERLAP - 1) :], line]
        detail = api.get(f"requests/{request_id}/")
        attempt = detail["latest_attempt"] or {}
        if detail["state"] in TERMINAL and attempt.get("state") not in ACTIVE_ATTEMPT:
            return


@cli.command()
@click.argument("request_id", type=int)
@output_option
def events(request_id: int, fmt: str) -> None:
    """Events about a request's latest attempt: scheduling, image pulls, restarts, evictions."""
    data = _api().get(f"requests/{request_id}/events/")
    if fmt != "table":
        output.dump(data, fmt)
        return
    if data["attempt"] is None:
        click.echo(f"Request #{request_id} has not run yet, so there are no events.")
        return
    output.table(
        data["events"],
        [
            ("TIME", lambda e: when(e["at"])),
            ("TYPE", lambda e: e["type"]),
            ("REASON", lambda e: e["reason"]),
            ("OBJECT", lambda e: e["object"]),
            ("MESSAGE", lambda e: e["message"]),
        ],
        empty=f"No events about attempt {data['attempt']}.",
    )


# -- changes ----------------------------------------------------------------------------


@cli.command()
@click.argument("request_id", type=int)
@click.option("--reason", default="", help="why; goes into the audit log")
@output_option
def cancel(request_id: int, reason: str, fmt: str) -> None:
    """Cancel a pending request, or stop a running one."""
    data = _api().post(f"requests/{request_id}/cancel/", {"reason": reason})
    if fmt != "table":
        output.dump(data, fmt)
        return
    click.echo(f"Request #{request_id} is {data['state']}.")


@cli.command()
@output_option
def top(fmt: str) -> None:
    """Pools: devices free and allocated, and what waits for each (your teams' requests)."""
    api = _api()
    pools: list[dict[str, Any]] = api.get("pools/")
    waiting: dict[str, list[int]] = {}
    for r in api.pages("queue/", 0):
        counts = waiting.setdefault(r.get("pool") or "any", [0, 0])
        counts[0] += 1
        counts[1] += int(r.get("pods") or 1) * int(r["count"])
    rows = [
        {
            "pool": p["name"],
            "gpu_model": p["gpu_model"],
            "lifecycle": p["lifecycle"],
            "partitioning": p["partitioning"],
            "devices": p["devices"],
            "free_gpus": p["free_milli"] / 1000,
            "allocated_gpus": p["allocated_milli"] / 1000,
            "waiting_requests": waiting.get(p["name"], [0, 0])[0],
            "waiting_devices": waiting.get(p["name"], [0, 0])[1],
        }
        for p in pools
    ]
    if "any" in waiting:
        rows.append(
            {
                "pool": "any",
                "waiting_requests": waiting["any"][0],
                "waiting_devices": waiting["any"][1],
            }
        )
    if fmt != "table":
        output.dump(rows, fmt)
        return

    def gpus(v: float | None) -> str:
        return "" if v is None else (f"{v:g}")

    output.table(
        rows,
        [
            ("POOL", lambda r: r["pool"]),
            ("GPU", lambda r: r.get("gpu_model", "")),
            ("LIFECYCLE", lambda r: r.get("lifecycle", "")),
            ("DEVICES", lambda r: r.get("devices", "")),
            ("FREE", lambda r: gpus(r.get("free_gpus"))),
            ("ALLOCATED", lambda r: gpus(r.get("allocated_gpus"))),
            ("WAITING", lambda r: r["waiting_requests"]),
            ("ASKING", lambda r: r["waiting_devices"]),
        ],
        empty="No pools.",
    )


@cli.command()
@click.argument("request_id", type=int, required=False)
@click.option(
    "--report",
    is_flag=True,
    help="inside a workload: tell the portal a checkpoint is finished "
    "(QM_CHECKPOINT_URL, QM_ATTEMPT_TOKEN)",
)
@output_option
def checkpoint(request_id: int | None, report: bool, fmt: str) -> None:
    """A request's checkpoints: the interval, how many, the last one a retry resumes from."""
    if report:
        if request_id is not None:
            raise click.UsageError("--report takes no request id: the attempt's token names it.")
        data = _report_checkpoint()
    elif request_id is None:
        raise click.UsageError("Name the request: qm checkpoint ID.")
    else:
        detail = _api().get(f"requests/{request_id}/")
        attempt = detail.get("latest_attempt") or {}
        data = {
            "request": request_id,
            "checkpoint_interval_s": detail["checkpoint_interval_s"],
            "attempts": detail["attempts"],
            "attempt": attempt.get("number"),
            "attempt_state": attempt.get("state"),
            "checkpoints": attempt.get("checkpoints", 0),
            "last_checkpoint_at": attempt.get("last_checkpoint_at"),
        }
    if fmt != "table":
        output.dump(data, fmt)
        return
    if report:
        click.echo(
            f"Checkpoint recorded for attempt {data['attempt']} "
            f"({data['checkpoints']} so far, the last at {when(data['last_checkpoint_at'])})."
        )
        return
    interval = data["checkpoint_interval_s"]
    if not interval:
        click.echo(
            f"Request #{request_id} does not checkpoint "
            "(submit it with --checkpoint-every SECONDS)."
        )
        return
    click.echo(f"Request #{request_id} checkpoints every {duration(interval)}.")
    if data["attempt"] is None:
        click.echo("It has not run yet.")
        return
    last = when(data["last_checkpoint_at"])
    click.echo(
        f"Attempt {data['attempt']} ({data['attempt_state']}): {data['checkpoints']} "
        f"checkpoint(s)" + (f", the last at {last}." if last else "; none finished yet.")
    )
    click.echo(
        "A retry after a preemption or a lost node mounts the same directory with "
        "QM_RESUME=1 and loads the newest checkpoint from QM_CHECKPOINT_DIR."
    )


def _report_checkpoint() -> dict[str, Any]:
    url = os.environ.get("QM_CHECKPOINT_URL", "")
    token = os.environ.get("QM_ATTEMPT_TOKEN", "")
    if not url or not token:
        raise QmError(
            "QM_CHECKPOINT_URL and QM_ATTEMPT_TOKEN are not set: the portal sets them in a "
            "workload that checkpoints.",
            EXIT_USAGE,
        )
    try:
        response = httpx.post(url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    except httpx.HTTPError as exc:
        raise QmError(f"Cannot reach the portal at {url}: {exc}") from None
    if not response.is_success:
        raise QmError(error_message(response), exit_code_for(response.status_code))
    data: dict[str, Any] = response.json()
    return data


@cli.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> None:
    """Print the shell completion script: eval "$(qm completion bash)" in ~/.bashrc."""
    cls = get_completion_class(shell)
    assert cls is not None  # every listed shell has one
    click.echo(cls(cli, {}, "qm", "_QM_COMPLETE").source())


def main() -> None:
    cli(prog_name="qm")
