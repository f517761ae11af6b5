"""`manage.py chaos`: stop Redis, then PostgreSQL, under a steady stream of API submits and page
views, with a real web (gunicorn), worker and beat; print a table of what the clients saw.

    python manage.py chaos --database-url postgres://root@127.0.0.1:5441/qm_chaos \\
        --redis-url redis://127.0.0.1:6391/0 --yes \\
        --redis-stop "redis-cli -p 6391 shutdown nosave" \\
        --redis-start "redis-server --port 6391 --daemonize yes --save '' --appendonly no" \\
        --pg-stop "pg_ctlcluster --skip-systemctl-redirect 15 chaos stop -m fast" \\
        --pg-start "pg_ctlcluster --skip-systemctl-redirect 15 chaos start"

The servers and the commands that stop and start them are parameters: point them at servers
of your own, never at ones others use. The database named by --database-url is dropped and
filled (it needs --yes). A fault with no stop/start commands is not run.

The parent re-runs itself as a child with DATABASE_URL and REDIS_URL set to those servers.
The child migrates and seeds the demo, starts gunicorn, a worker and beat, then for each fault:
`--warmup` seconds of load, the stop command, `--*-outage` seconds, the start command,
`--after` seconds of load; the load stops, and the child waits (at most `--settle` seconds)
until every accepted submit has a decision in the database. Each client request is one of
POST /api/v1/requests/, GET /api/v1/requests/, GET / and GET /queue/ (signed in) and GET
/readyz, at `--rate` requests per second in all. Per fault it reports:

- requests, 2xx, 503 (the database's documented answer, with Retry-After), 500 and others;
- accepted submits (201), lost ones (a 201 whose request is not in the database), and decided
  ones (with at least one scheduling decision);
- `api_back_s`: from the start command's return to the first 2xx submit after it (0 when the
  API never failed);
- `decided_s`: from the start command's return until every submit accepted so far has a
  decision (the scheduling caught up);
- the worker's liveness probe at the end of the outage (`manage.py probe worker --live`).

`--worker-kill` adds a row: the worker gets SIGKILL under the same load and the supervisor
starts it again (`outage_s` until its new heartbeat; `restarts` counts it).

`--kubeconfig` with `--apiserver-restart` / `--etcd-restart` (e.g. `scripts/controlplane
restart-apiserver STATE`) adds the control plane rows, run by a second child on the database
recreated for it: see `portal/management/chaos_cluster.py` and docs/reliability.md.

The exit status is 1 when any fault saw a 500 or lost a submit, or left one undecided, or
launched an attempt twice or left a request unlaunched.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from http.client import HTTPConnection, HTTPException
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from django.core.management.base import BaseCommand, CommandError, CommandParser

SUBMIT = {
    "workload_class": "interactive",
    "pool": "l4-shared",
    "profile": "shared-250m-5gb",
    "count": 1,
    "image": "registry.example.com/chaos/notebook:1",
    "command": ["sleep", "60"],
}
KINDS = ("submit", "api_list", "page_home", "page_queue", "readyz", "submit")


class Command(BaseCommand):
    help = (
        "Stop Redis and PostgreSQL, kill the worker, restart the API server and etcd under load;"
        " print a table."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database-url", required=True, help="a THROWAWAY PostgreSQL database")
        parser.add_argument("--redis-url", required=True, help="a Redis of your own")
        parser.add_argument(
            "--yes", action="store_true", help="confirm --database-url may be dropped"
        )
        parser.add_argument("--redis-stop", default="", help="shell command that stops that Redis")
        parser.add_argument("--redis-start", default="", help="shell command that starts it again")
        parser.add_argument(
            "--pg-stop", default="", help="shell command that stops that PostgreSQL"
        )
        parser.add_argument("--pg-start", default="", help="shell command that starts it again")
        parser.add_argument(
            "--redis-outage", type=float, default=30.0, help="seconds Redis is down"
        )
        parser.add_argument(
            "--pg-outage", type=float, default=15.0, help="seconds PostgreSQL is down"
        )
        parser.add_argument(
            "--warmup", type=float, default=5.0, help="seconds of load before a fault"
        )
        parser.add_argument("--after", type=float, default=15.0, help="seconds of load after it")
        parser.add_argument(
            "--settle", type=float, default=90.0, help="most seconds to wait for decisions"
        )
        parser.add_argument(
            "--worker-kill", action="store_true", help="SIGKILL the worker under load (a row)"
        )
        parser.add_argument(
            "--worker-outage", type=float, default=5.0, help="seconds of load after the kill"
        )
        parser.add_argument(
            "--kubeconfig", default="", help="a control plane of your own (scripts/controlplane)"
        )
        parser.add_argument(
            "--apiserver-restart", default="", help="shell command that restarts its apiserver"
        )
        parser.add_argument(
            "--etcd-restart", default="", help="shell command that restarts its etcd"
        )
        parser.add_argument(
            "--launches", type=int, default=8, help="submits per control plane fault"
        )
        parser.add_argument("--rate", type=float, default=10.0, help="client requests per second")
        parser.add_argument("--tick-seconds", type=int, default=1)
        parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
        parser.add_argument("--child", action="store_true", help=__import__("argparse").SUPPRESS)
        parser.add_argument(
            "--child-cluster", action="store_true", help=__import__("argparse").SUPPRESS
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        if opts["child"] or opts["child_cluster"]:
            rows = (_child_cluster if opts["child_cluster"] else _child)(opts, self.stderr)
            self.stdout.write(json.dumps(rows))
            return
        if not opts["yes"]:
            raise CommandError(
                "--database-url is dropped and filled: add --yes if it is a throwaway one"
            )
        if not urlsplit(opts["database_url"]).scheme.startswith("postgres"):
            raise CommandError("--database-url must be a PostgreSQL URL")
        web = bool(
            (opts["redis_stop"] and opts["redis_start"])
            or (opts["pg_stop"] and opts["pg_start"])
            or opts["worker_kill"]
        )
        cluster = bool(opts["kubeconfig"] and (opts["apiserver_restart"] or opts["etcd_restart"]))
        if not (web or cluster):
            raise CommandError("no fault to run: name the stop/start or restart commands")
        table: list[dict[str, Any]] = []
        if web:
            table += self._run_child(opts, "--child")
        if cluster:
            table += self._run_child(opts, "--child-cluster")
        if opts["json"]:
            self.stdout.write(json.dumps(table, indent=2))
        else:
            self.stdout.write(format_table(table))
        if not all(r["ok"] for r in table):
            raise CommandError(
                "a fault saw a 500, lost a submit, left one undecided, "
                "launched an attempt twice or left one unlaunched"
            )

    def _run_child(self, opts: dict[str, Any], mode: str) -> list[dict[str, Any]]:
        """The rows of one child (`--child`: the web's faults, `--child-cluster`: the control
        plane's), on the database recreated for it."""
        _recreate_database(opts["database_url"])
        tmp = Path(tempfile.mkdtemp(prefix="qm-chaos-"))
        env = {k: v for k, v in os.environ.items() if k not in ("SQLITE_PATH",)}
        env.update(
            DATABASE_URL=opts["database_url"],
            REDIS_URL=opts["redis_url"],
            QM_VAR_DIR=str(tmp),
            CELERY_TASK_ALWAYS_EAGER="false" if mode == "--child" else "true",
            TICK_SECONDS=str(opts["tick_seconds"]),
            MAX_PENDING_PER_USER="1000000",
            MAX_PENDING_PER_TEAM="1000000",
            THROTTLE_USER="1000000/min",
            THROTTLE_TOKEN="1000000/min",
            THROTTLE_ANON="1000000/min",
            DEMO_TRICKLE="false",
            DEBUG="false",
            LOG_LEVEL="WARNING",
            SIMULATED_SECONDS_PER_HOUR="5",
        )
        # One key for the child that signs the sessions and the web that reads them.
        env.setdefault("SECRET_KEY", "chaos-" + os.urandom(16).hex())
        env.pop("SIMULATED_CLUSTER", None)  # the demo's cluster, whatever the caller's
        argv = [sys.executable, "manage.py", "chaos", mode]
        for key, value in opts.items():
            if key in ("child", "child_cluster", "json", "yes") or value in ("", None, False):
                continue
            if key in (
                "verbosity",
                "settings",
                "pythonpath",
                "traceback",
                "no_color",
                "force_color",
            ):
                continue
            if key == "skip_checks":
                continue
            argv += [f"--{key.replace('_', '-')}"] + ([] if value is True else [str(value)])
        try:
            done = subprocess.run(
                argv, env=env, cwd=_root(), stdout=subprocess.PIPE, text=True, check=False
            )
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        out = done.stdout.strip()
        rows: list[dict[str, Any]] = (
            json.loads(out[out.rfind("\n[") + 1 if "\n[" in out else 0 :])
            if done.returncode == 0
            else []
        )
        if done.returncode == 0 and all(r["ok"] for r in rows):
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            # Kept for the post-mortem: the web's, worker's and beat's log.
            self.stderr.write(f"chaos: the processes' log is kept in {tmp / 'processes.log'}")
        if done.returncode != 0:
            raise CommandError(f"chaos child failed with exit code {done.returncode}")
        return rows


COLUMNS = (
    ("fault", "fault"),
    ("outage_s", "outage s"),
    ("requests", "requests"),
    ("ok_2xx", "2xx"),
    ("s503", "503"),
    ("s500", "500"),
    ("other", "other"),
    ("accepted", "accepted"),
    ("lost", "lost"),
    ("decided", "decided"),
    ("api_back_s", "API back s"),
    ("decided_s", "decided s"),
    ("p95_ms", "p95 ms"),
    ("max_ms", "max ms"),
    ("worker_live", "worker live"),
    ("restarts", "restarts"),
)


#: the control plane rows (`portal/management/chaos_cluster.py`)
CLUSTER_COLUMNS = (
    ("fault", "fault"),
    ("outage_s", "outage s"),
    ("requests", "requests"),
    ("attempts", "attempts"),
    ("jobs", "Jobs"),
    ("double", "double launches"),
    ("launched", "launched"),
    ("stuck", "stuck"),
    ("tick_errors", "tick errors"),
    ("launched_s", "launched s"),
)


def format_table(rows: list[dict[str, Any]]) -> str:
    """The rows as Markdown tables, the web's faults then the control plane's (docs quote them
    as printed)."""
    tables = []
    for columns, part in (
        (COLUMNS, [r for r in rows if "jobs" not in r]),
        (CLUSTER_COLUMNS, [r for r in rows if "jobs" in r]),
    ):
        if not part:
            continue
        head = "| " + " | ".join(title for _, title in columns) + " |"
        rule = "|" + "|".join("---" for _ in columns) + "|"
        body = ["| " + " | ".join(str(r.get(k, "")) for k, _ in columns) + " |" for r in part]
        tables.append("\n".join([head, rule, *body]))
    return "\n\n".join(tables)


def _root() -> str:
    return str(Path(__file__).resolve().parents[3])


def _recreate_database(url: str) -> None:
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    if not name or not name.replace("_", "").isalnum():
        raise CommandError("--database-url must name a database (letters, digits, _)")
    admin = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


# ---------------------------------------------------------------------------
# The child: DATABASE_URL and REDIS_URL point at the chaos servers


def _child(opts: dict[str, Any], err: Any) -> list[dict[str, Any]]:
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    clients = _seed()
    procs = _start_processes()
    rows: list[dict[str, Any]] = []
    try:
        _wait_http(procs["port"])
        _wait_heartbeats()
        warm = _Load(procs["port"], clients, rate=1.0)
        for seq in range(
            2 * len(KINDS)
        ):  # each gunicorn worker's first requests import and connect
            warm._one(seq)
        faults: list[tuple[str, Any, Any, float]] = []
        if opts.get("redis_stop") and opts.get("redis_start"):
            faults.append(
                ("redis", _shelled(opts["redis_stop"]), _shelled(opts["redis_start"]),
                 opts["redis_outage"])
            )  # fmt: skip
        if opts.get("pg_stop") and opts.get("pg_start"):
            faults.append(
                ("postgresql", _shelled(opts["pg_stop"]), _shelled(opts["pg_start"]),
                 opts["pg_outage"])
            )  # fmt: skip
        if opts.get("worker_kill"):
            worker = procs["supervised"][0]
            faults.append(
                ("worker kill", worker.kill_hard, worker.wait_restarted, opts["worker_outage"])
            )
        for name, stop, start, outage in faults:
            err.write(f"chaos: {name}, {outage:.0f} s\n")
            rows.append(
                _run_fault(
                    name, stop, start, outage, opts, procs["port"], clients, procs["supervised"]
                )
            )
            err.write(f"chaos: {json.dumps(rows[-1])}\n")
    finally:
        for proc in procs["all"]:
            _stop(proc)
    return rows


def _child_cluster(opts: dict[str, Any], err: Any) -> list[dict[str, Any]]:
    """The control plane rows (`portal/management/chaos_cluster.py`) on a fresh database."""
    from django.core.management import call_command

    from portal.management.chaos_cluster import run_cluster_faults

    call_command("migrate", verbosity=0)
    faults = [
        (name, opts[key])
        for name, key in (
            ("API server restart", "apiserver_restart"),
            ("etcd restart", "etcd_restart"),
        )
        if opts.get(key)
    ]
    return run_cluster_faults(
        opts["kubeconfig"], faults, submits=opts["launches"], settle_s=opts["settle"], err=err
    )


def _seed() -> dict[str, Any]:
    """The demo's cluster, teams and users; an API token and a page session per researcher."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    from portal.demo.seed import seed
    from portal.services.tokens import token_create

    seed()
    users = []
    for username, team in (("researcher", "vision"), ("nlp-researcher", "nlp")):
        user = get_user_model().objects.get(username=username)
        _, secret = token_create(user=user, name="chaos", scope="read+submit")
        page = Client()
        page.force_login(user)
        users.append({"token": secret, "team": team, "session": page.cookies["sessionid"].value})
    return {"users": users}


def _start_processes() -> dict[str, Any]:
    port = _free_port()
    log = open(Path(os.environ["QM_VAR_DIR"]) / "processes.log", "w")  # noqa: SIM115
    common: dict[str, Any] = {
        "cwd": _root(),
        "env": os.environ.copy(),
        "stdout": log,
        "stderr": log,
    }
    web = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "portal.wsgi:application", "--bind", f"127.0.0.1:{port}",
         "--workers", "2", "--worker-class", "gthread", "--threads", "4", "--timeout", "60",
         "--log-level", "warning"],
        **common,
    )  # fmt: skip
    worker = _Supervised(
        [sys.executable, "-m", "celery", "-A", "portal", "worker", "--pool", "prefork",
         "--concurrency", "2", "--loglevel", "INFO"],
        common,
    )  # fmt: skip
    beat = _Supervised(
        [sys.executable, "-m", "celery", "-A", "portal", "beat", "--loglevel", "WARNING",
         "--schedule", str(Path(os.environ["QM_VAR_DIR"]) / "beat-schedule")],
        common,
    )  # fmt: skip
    return {"port": port, "all": [web, worker, beat], "supervised": [worker, beat]}


class _Supervised:
    """A worker or beat restarted when it exits, as the kubelet restarts a container (the
    chart's pods have restartPolicy Always): a fault that kills one is then a restart the
    table counts, not an outage that never ends."""

    def __init__(self, args: list[str], common: dict[str, Any]) -> None:
        self.args, self.common = args, common
        self.restarts = 0
        self.proc = subprocess.Popen(args, **common)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while not self.stopping.wait(0.5):
            if self.proc.poll() is not None:
                # the new process first: who sees the count grow finds it running
                self.proc = subprocess.Popen(self.args, **self.common)
                self.restarts += 1

    def poll(self) -> int | None:
        return self.proc.poll()

    def kill_hard(self) -> None:
        """SIGKILL, as the OOM killer or a lost node would: the watcher starts it again."""
        self.killed_at_restarts = self.restarts
        self.proc.kill()

    def wait_restarted(self, timeout: float = 120.0) -> None:
        """Until the process killed by `kill_hard` runs again and its heartbeat is fresh."""
        from portal.lib import heartbeat

        deadline = time.monotonic() + timeout
        while self.restarts <= getattr(self, "killed_at_restarts", self.restarts - 1):
            if time.monotonic() > deadline:
                raise CommandError("the killed worker was not started again")
            time.sleep(0.2)
        restarted = time.monotonic()
        while (heartbeat.age(heartbeat.WORKER_ALIVE) or 1e9) > time.monotonic() - restarted:
            if time.monotonic() > deadline:
                raise CommandError("the restarted worker wrote no heartbeat")
            time.sleep(0.2)

    def send_signal(self, sig: int) -> None:
        self.stopping.set()
        self.proc.send_signal(sig)

    def wait(self, timeout: float | None = None) -> int:
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        self.stopping.set()
        self.proc.kill()


def _stop(proc: Any) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


class _Load:
    """Client threads sending one request per 1/rate seconds in all, each on a new connection."""

    def __init__(self, port: int, clients: dict[str, Any], rate: float, threads: int = 6) -> None:
        self.port, self.clients, self.rate = port, clients, rate
        self.results: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.seq = 0
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]
        self.period = len(self.threads) / rate

    def start(self) -> None:
        for i, t in enumerate(self.threads):
            t.start()
            time.sleep(self.period / len(self.threads) if i < len(self.threads) - 1 else 0)

    def finish(self) -> list[dict[str, Any]]:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)
        return self.results

    def _run(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            with self.lock:
                seq = self.seq
                self.seq += 1
            self._one(seq)
            self.stop.wait(max(0.0, self.period - (time.monotonic() - started)))

    def _one(self, seq: int) -> None:
        kind = KINDS[seq % len(KINDS)]
        user = self.clients["users"][seq % len(self.clients["users"])]
        headers = {"Host": "localhost"}
        body = None
        if kind == "submit":
            method, path = "POST", "/api/v1/requests/"
            body = json.dumps({**SUBMIT, "team": user["team"], "name": f"chaos-{seq}"})
            headers.update(
                {"Authorization": f"Bearer {user['token']}", "Content-Type": "application/json"}
            )
        elif kind == "api_list":
            method, path = "GET", "/api/v1/requests/"
            headers["Authorization"] = f"Bearer {user['token']}"
        elif kind == "readyz":
            method, path = "GET", "/readyz"
        else:
            method, path = "GET", "/" if kind == "page_home" else "/queue/"
            headers["Cookie"] = f"sessionid={user['session']}"
        at = time.monotonic()
        status, request_id = 0, None
        try:
            conn = HTTPConnection("127.0.0.1", self.port, timeout=30)
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            status = resp.status
            conn.close()
            if kind == "submit" and status == 201:
                request_id = json.loads(data)["id"]
        except (OSError, HTTPException, ValueError):
            status = 0  # no answer at all: counted under "other"
        with self.lock:
            self.results.append(
                {
                    "kind": kind,
                    "at": at,
                    "status": status,
                    "ms": (time.monotonic() - at) * 1000,
                    "id": request_id,
                }
            )


def _run_fault(
    name: str,
    stop: Callable[[], object],
    start: Callable[[], object],
    outage: float,
    opts: dict[str, Any],
    port: int,
    clients: dict[str, Any],
    supervised: list[Any] | None = None,
) -> dict[str, Any]:
    restarts_before = sum(p.restarts for p in supervised or [])
    load = _Load(port, clients, opts["rate"])
    load.start()
    time.sleep(opts["warmup"])
    stop()
    down_at = time.monotonic()
    # The worker's liveness probe, run a quarter into the outage, beside the load.
    probe: dict[str, bool] = {}
    time.sleep(outage / 4)
    prober = threading.Thread(target=lambda: probe.update(live=_probe_worker_live()))
    prober.start()
    time.sleep(max(0.0, outage - (time.monotonic() - down_at)))
    start()
    back_at = time.monotonic()
    decided_s = _wait_decided(load, back_at, opts["after"], opts["settle"])
    results = load.finish()
    prober.join(timeout=60)
    worker_live = probe.get("live", False)
    accepted = [r["id"] for r in results if r["id"] is not None]
    # The last submits of the stream are decided by the next ticks: wait for them too.
    deadline = time.monotonic() + opts["settle"]
    found, decided = _database_counts(accepted)
    while decided < len(accepted) and time.monotonic() < deadline:
        time.sleep(0.5)
        found, decided = _database_counts(accepted)
    statuses = [r["status"] for r in results]
    submits_after = sorted(
        r["at"]
        for r in results
        if r["kind"] == "submit" and r["at"] >= back_at and 200 <= r["status"] < 300
    )
    first_failed = any(r["kind"] == "submit" and not 200 <= r["status"] < 300 for r in results)
    api_back_s = round(submits_after[0] - back_at, 1) if first_failed and submits_after else 0.0
    times = sorted(r["ms"] for r in results)
    row = {
        "fault": name,
        "outage_s": round(back_at - down_at, 1),
        "requests": len(results),
        "ok_2xx": sum(200 <= s < 300 for s in statuses),
        "s503": statuses.count(503),
        "s500": sum(s >= 500 and s != 503 for s in statuses),
        "other": sum(not (200 <= s < 300) and s < 500 for s in statuses),
        "accepted": len(accepted),
        "lost": len(accepted) - found,
        "decided": decided,
        "api_back_s": api_back_s,
        "decided_s": decided_s,
        "p95_ms": round(times[int(0.95 * (len(times) - 1))]) if times else 0,
        "max_ms": round(times[-1]) if times else 0,
        "worker_live": "yes" if worker_live else "no",
        # worker or beat processes that exited during the fault and were started again
        "restarts": sum(p.restarts for p in supervised or []) - restarts_before,
    }
    slow = sorted(results, key=lambda r: -r["ms"])[:5]
    row["slowest"] = [
        f"{r['kind']}@{r['at'] - down_at:+.1f}s:{r['ms']:.0f}ms:{r['status']}" for r in slow
    ]
    # A killed worker is the fault its liveness probe is there to find: not required live.
    row["ok"] = (
        row["s500"] == 0
        and row["lost"] == 0
        and decided == len(accepted)
        and (worker_live or name == "worker kill")
    )
    return row


def _shelled(command: str) -> Callable[[], None]:
    return lambda: _shell(command)


def _shell(command: str) -> None:
    done = subprocess.run(
        shlex.split(command), capture_output=True, text=True, timeout=120, check=False
    )
    if done.returncode != 0:
        raise CommandError(f"{command!r} failed ({done.returncode}): {done.stderr[-500:]}")


def _probe_worker_live() -> bool:
    done = subprocess.run(
        [sys.executable, "manage.py", "probe", "worker", "--live"],
        cwd=_root(), env=os.environ.copy(), capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    return done.returncode == 0


def _wait_decided(load: _Load, back_at: float, after: float, settle: float) -> float | None:
    """Seconds from `back_at` until every submit accepted by then has a decision; the load goes
    on for `after` seconds meanwhile; None if `settle` passed first."""
    decided_s: float | None = None
    deadline = back_at + settle
    while time.monotonic() < deadline:
        with load.lock:
            ids = [r["id"] for r in load.results if r["id"] is not None and r["at"] <= back_at]
        try:
            if decided_s is None and _database_counts(ids)[1] == len(ids):
                decided_s = round(time.monotonic() - back_at, 1)
        except Exception:  # noqa: BLE001 - the database may still be starting
            _close_connections()
        if decided_s is not None and time.monotonic() - back_at >= after:
            break
        time.sleep(0.5)
    return decided_s


def _database_counts(ids: list[int]) -> tuple[int, int]:
    """(how many of `ids` are in the database, how many have a decision), retried while it starts."""
    from django.db import OperationalError

    from portal.models import Decision, GpuRequest

    for _ in range(60):
        try:
            found = GpuRequest.objects.filter(pk__in=ids).count()
            decided = (
                Decision.objects.filter(request_id__in=ids).values("request_id").distinct().count()
            )
            return found, decided
        except OperationalError:
            _close_connections()
            time.sleep(1)
    raise CommandError("the database did not come back")


def _close_connections() -> None:
    from django.db import connections

    for conn in connections.all():
        conn.close_if_unusable_or_obsolete()
        conn.close()


def _wait_heartbeats(timeout: float = 120.0) -> None:
    """Until the worker has run a task and beat has sent one: the faults start on a working system."""
    from portal.lib import heartbeat

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(
            heartbeat.age(n) is not None
            for n in (heartbeat.WORKER_ALIVE, heartbeat.WORKER_TASK, heartbeat.BEAT_SENT)
        ):
            return
        time.sleep(0.5)
    raise CommandError("the worker or beat did not start (see processes.log)")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_http(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            conn = HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/healthz", headers={"Host": "localhost"})
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise CommandError("gunicorn did not answer /healthz")
