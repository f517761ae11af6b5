"""Benchmark the web tier: page server times at scale, and API submits through gunicorn.

    python manage.py bench_web                 # a throwaway SQLite file in a temp dir
    python manage.py bench_web --database-url postgres://.../qm_bench --yes

The parent process never touches your database: it re-runs itself as a child
with SQLITE_PATH (or DATABASE_URL) pointing at the throwaway database, which the
child migrates and fills with 10,000 pending requests, 1,000 nodes (8,000
devices), running attempts, decisions and audit events. The child then

1. times every page in-process (Django test client: middleware, queries and template
   rendering, a streamed CSV read to its end; no network): median, p95 and max of
   --runs runs each, and counts each page's queries (a fixed number, no N+1);
2. starts gunicorn on 127.0.0.1 (gthread workers with keep-alive, by default 2
   workers x 4 threads) and drives POST /api/v1/requests/ from client threads, each
   reusing one HTTP/1.1 connection (``--new-connections``: one per request), with
   token authentication and a bounded number of requests, and reports the sustained
   rate, any errors and the load average (the machine may be shared).

It prints one JSON object. The pending caps are raised for the throughput run
(10,000 pending would otherwise hit them by design).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from http.client import HTTPConnection, HTTPException
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

TARGET_PAGE_MS = 300
TARGET_SUBMITS_PER_S = 100


class Command(BaseCommand):
    help = "Seed a throwaway database at scale and time the pages and API submits (prints JSON)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--pending", type=int, default=10_000)
        parser.add_argument("--nodes", type=int, default=1_000)
        parser.add_argument("--runs", type=int, default=20, help="timed runs per page (p95)")
        parser.add_argument(
            "--submits", type=int, default=3_000, help="API submits to send through gunicorn"
        )
        parser.add_argument("--threads", type=int, default=8, help="client threads")
        parser.add_argument("--workers", type=int, default=2, help="gunicorn workers")
        parser.add_argument(
            "--worker-class", default="gthread", help="gunicorn worker class (sync, gthread)"
        )
        parser.add_argument(
            "--worker-threads", type=int, default=4, help="threads per gthread worker"
        )
        parser.add_argument(
            "--new-connections", action="store_true", help="client: a new connection per request"
        )
        parser.add_argument(
            "--database-url", default="", help="a THROWAWAY database to fill (needs --yes)"
        )
        parser.add_argument(
            "--yes", action="store_true", help="confirm that --database-url may be filled"
        )
        parser.add_argument(
            "--keep", action="store_true", help="keep the temp dir (SQLite file) afterwards"
        )
        parser.add_argument(
            "--history",
            action="store_true",
            help="instead: seed utilization history and time the pool page (docs/metrics.md)",
        )
        parser.add_argument("--history-devices", type=int, default=1_000)
        parser.add_argument("--history-days", type=int, default=30)
        parser.add_argument(
            "--api",
            action="store_true",
            help="instead: API submits only, at each --concurrency, and a profile (docs/performance.md)",
        )
        parser.add_argument(
            "--concurrency", default="4,8,16", help="--api: client threads, comma-separated"
        )
        parser.add_argument(
            "--profile", type=int, default=200, help="--api: submits profiled in-process (0: none)"
        )
        parser.add_argument("--child", action="store_true", help=__import__("argparse").SUPPRESS)

    def handle(self, *args: Any, **opts: Any) -> None:
        if opts["child"]:
            if opts["api"]:
                result = _api_child(opts)
            elif opts["history"]:
                result = _history_child(opts)
            else:
                result = _child(opts)
            self.stdout.write(json.dumps(result, indent=2, default=str))
            return
        if opts["database_url"] and not opts["yes"]:
            raise CommandError(
                "--database-url fills that database with benchmark data: add --yes if it is a throwaway one"
            )
        tmp = Path(tempfile.mkdtemp(prefix="qm-bench-"))
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "SQLITE_PATH")}
        # The same SQLite options as the default settings, through DATABASE_URL so that
        # connections persist across requests (conn_max_age), as they do on PostgreSQL.
        sqlite_url = (
            f"sqlite:///{tmp / 'bench.sqlite3'}?timeout=30&transaction_mode=IMMEDIATE"
            "&init_command=PRAGMA+journal_mode%3DWAL%3B+PRAGMA+synchronous%3DNORMAL%3B"
        )
        env.update(
            QM_VAR_DIR=str(tmp),
            DATABASE_URL=sqlite_url,
            CELERY_TASK_ALWAYS_EAGER="false",
            MAX_PENDING_PER_USER="1000000000",
            MAX_PENDING_PER_TEAM="1000000000",
            # The benchmark measures the server, not the abuse limits.
            THROTTLE_USER="1000000000/min",
            THROTTLE_TOKEN="1000000000/min",
            THROTTLE_ANON="1000000000/min",
            DEMO_TRICKLE="false",
            DEBUG="false",
            LOG_LEVEL="WARNING",
        )
        if opts["database_url"]:
            env["DATABASE_URL"] = opts["database_url"]
        argv = [sys.executable, "manage.py", "bench_web", "--child"]
        for key in (
            "pending",
            "nodes",
            "runs",
            "submits",
            "threads",
            "workers",
            "worker_class",
            "worker_threads",
        ):
            argv += [f"--{key.replace('_', '-')}", str(opts[key])]
        if opts["new_connections"]:
            argv.append("--new-connections")
        if opts["api"]:
            argv += [
                "--api",
                "--concurrency",
                opts["concurrency"],
                "--profile",
                str(opts["profile"]),
            ]
        if opts["history"]:
            argv += [
                "--history",
                "--history-devices",
                str(opts["history_devices"]),
                "--history-days",
                str(opts["history_days"]),
            ]
        try:
            done = subprocess.run(
                argv, env=env, cwd=_root(), capture_output=True, text=True, check=False
            )
        finally:
            if not opts["keep"]:
                shutil.rmtree(tmp, ignore_errors=True)
        if done.returncode != 0:
            self.stderr.write(done.stderr[-4000:])
            raise CommandError(f"benchmark child failed with exit code {done.returncode}")
        self.stdout.write(done.stdout.strip()[done.stdout.strip().find("{") :])


def _root() -> str:
    return str(Path(__file__).resolve().parents[3])


# ---------------------------------------------------------------------------
# The child: runs against the throwaway database only


def _child(opts: dict[str, Any]) -> dict[str, Any]:
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    started = time.perf_counter()
    users = _seed(pending=opts["pending"], nodes=opts["nodes"])
    seed_s = time.perf_counter() - started
    pages = _time_pages(admin=users["admin"], runs=opts["runs"])
    api = _drive_gunicorn(
        users["submitters"],
        submits=opts["submits"],
        threads=opts["threads"],
        workers=opts["workers"],
        worker_class=opts["worker_class"],
        worker_threads=opts["worker_threads"],
        reuse=not opts["new_connections"],
    )
    return {
        "database": _db_label(),
        "seeded": {
            "pending": opts["pending"],
            "nodes": opts["nodes"],
            "seconds": round(seed_s, 1),
            **_counts(),
        },
        "pages_ms": pages,
        "api_submit": api,
        "targets": {"page_ms": TARGET_PAGE_MS, "submits_per_s": TARGET_SUBMITS_PER_S},
        "slowest_page_p95_ms": max(
            p["p95_ms"] for k, p in pages.items() if not k.startswith("export:")
        ),
        "ok": all(
            p["p95_ms"] <= TARGET_PAGE_MS for k, p in pages.items() if not k.startswith("export:")
        )
        and api["rate_per_s"] >= TARGET_SUBMITS_PER_S
        and api["errors"] == 0,
    }


def _api_child(opts: dict[str, Any]) -> dict[str, Any]:
    """API submits through gunicorn at each concurrency, then a profile of submits in-process."""
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    users = _seed(pending=opts["pending"], nodes=opts["nodes"])
    runs = []
    for threads in [int(c) for c in opts["concurrency"].split(",") if c.strip()]:
        runs.append(
            _drive_gunicorn(
                users["submitters"],
                submits=opts["submits"],
                threads=threads,
                workers=opts["workers"],
                worker_class=opts["worker_class"],
                worker_threads=opts["worker_threads"],
                reuse=not opts["new_connections"],
            )
        )
    best = max(runs, key=lambda r: r["rate_per_s"]) if runs else None
    return {
        "database": _db_label(),
        "seeded": {"pending": opts["pending"], "nodes": opts["nodes"], **_counts()},
        "cores": os.cpu_count(),
        "runs": runs,
        "best": {k: best[k] for k in ("client_threads", "rate_per_s", "latency_ms_p95")}
        if best
        else None,
        "profile": _profile_submits(users["submitters"], opts["profile"])
        if opts["profile"]
        else None,
    }


def _profile_submits(submitters: list[tuple[str, str]], n: int) -> dict[str, Any]:
    """Where a submit's server time goes: `n` submits through the Django test client (the whole
    middleware and DRF stack, no network) under cProfile; the functions with the most time of
    their own, the portal's by time including callees, and the queries per submit."""
    import cProfile
    import pstats

    from django.db import connection
    from django.test import Client

    token, team = submitters[0]
    client = Client(HTTP_AUTHORIZATION=f"Token {token}")
    body = {
        "team": team,
        "workload_class": "training",
        "pool": "a100-train",
        "profile": "whole",
        "count": 1,
        "image": "registry.example.com/bench/train:1",
        "command": ["python", "train.py"],
    }
    for i in range(5):  # warm: imports, connections, the first wake
        client.post(
            "/api/v1/requests/", {**body, "name": f"warm-{i}"}, content_type="application/json"
        )
    # Counted by a wrapper: the test client's request_started empties the debug query log.
    sql: list[str] = []

    def record(execute: Any, statement: str, params: Any, many: bool, context: Any) -> Any:
        sql.append(statement)
        return execute(statement, params, many, context)

    with connection.execute_wrapper(record):
        r = client.post("/api/v1/requests/", body, content_type="application/json")
    assert r.status_code == 201, r.content[:300]
    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.enable()
    for i in range(n):
        client.post(
            "/api/v1/requests/", {**body, "name": f"prof-{i}"}, content_type="application/json"
        )
    profiler.disable()
    wall = time.perf_counter() - started
    stats = pstats.Stats(profiler)
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]  # pstats keeps it untyped
    rows = []
    for (file, line, func), (_cc, ncalls, tottime, cumtime, _callers) in raw.items():
        rows.append((file, line, func, ncalls, tottime, cumtime))

    def label(file: str, line: int, func: str) -> str:
        short = file.split("site-packages/")[-1].replace(_root() + "/", "")
        return f"{short}:{line}({func})"

    def ms(x: float) -> float:
        return round(x * 1000 / n, 3)

    own = sorted(rows, key=lambda r: -r[4])[:20]
    portal = sorted((r for r in rows if "/portal/" in r[0]), key=lambda r: -r[5])[:20]
    return {
        "submits": n,
        "wall_ms_per_submit_profiled": round(wall * 1000 / n, 2),
        "queries_per_submit": len(sql),
        "queries": [x[:120] for x in sql],
        "own_time_ms_per_submit": [
            {"fn": label(*r[:3]), "calls": r[3] / n, "ms": ms(r[4])} for r in own
        ],
        "portal_cumulative_ms_per_submit": [
            {"fn": label(*r[:3]), "calls": r[3] / n, "ms": ms(r[5])} for r in portal
        ],
    }


def _history_child(opts: dict[str, Any]) -> dict[str, Any]:
    """Utilization history at scale: `--history-devices` devices (8 per node, one pool)
    with `--history-days` of history as the minute sampler and the rollups leave it: the
    raw minutes still kept (UTILIZATION_RAW_HOURS, through `record_samples`), 5-minute
    and hourly rollups of per-minute readings for the days before, then the real `rollup`
    of the newest hour. Times the pool page (all three ranges), p50 and p95."""
    from datetime import UTC, datetime

    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db.models import Max

    from portal.models import Device, Node, Pool, UtilizationRollup, UtilizationSample
    from portal.services import utilization

    call_command("migrate", verbosity=0)
    started = time.perf_counter()
    rng = random.Random(7)
    pool = Pool.objects.create(name="bench", gpu_model="NVIDIA-H100", gpu_memory_mib=81920)
    n_nodes = max(1, opts["history_devices"] // 8)
    Node.objects.bulk_create(
        [
            Node(name=f"bench-{i:04d}", pool=pool, cpu_milli=128000, memory_mib=1 << 20)
            for i in range(n_nodes)
        ]
    )
    nodes = list(Node.objects.filter(pool=pool).order_by("name"))
    Device.objects.bulk_create(
        [
            Device(node=n, index=d, model="NVIDIA-H100", memory_mib=81920)
            for n in nodes
            for d in range(8)
        ],
        batch_size=2000,
    )
    devices = list(Device.objects.values_list("pk", flat=True))
    now = datetime.now(tz=UTC).replace(second=0, microsecond=0)
    hour = now.replace(minute=0)
    raw_from = hour - timedelta(hours=1)
    # The raw minutes still kept: the newest hour and the one before, through the sampler.
    minute = raw_from
    while minute < now:
        Device.objects.update(utilization_pct=rng.randint(40, 95), memory_used_mib=50000)
        utilization.record_samples(minute)
        minute += timedelta(minutes=1)
    # Older buckets, as the rollup writes them from per-minute readings: per node, the pool.
    rows: list[UtilizationRollup] = []
    for res, days in (
        (300, min(opts["history_days"], settings.UTILIZATION_5M_DAYS)),
        (3600, opts["history_days"]),
    ):
        start = utilization._floor(raw_from - timedelta(days=days), res)
        while start < raw_from:
            level = 60 + 25 * ((start.hour % 24) / 24)
            for n in nodes:
                avg = min(100.0, level + rng.uniform(-10, 10))
                rows.append(
                    UtilizationRollup(
                        scope="node",
                        key=n.name,
                        resolution_s=res,
                        start=start,
                        utilization_avg=avg,
                        utilization_max=min(100.0, avg + 10),
                        memory_used_mib_avg=50000,
                        samples=8 * res // 60,
                    )
                )
            rows.append(
                UtilizationRollup(
                    scope="pool",
                    key=pool.name,
                    resolution_s=res,
                    start=start,
                    utilization_avg=level,
                    utilization_max=min(100.0, level + 15),
                    memory_used_mib_avg=50000,
                    samples=len(devices) * res // 60,
                )
            )
            start += timedelta(seconds=res)
            if len(rows) >= 20000:
                UtilizationRollup.objects.bulk_create(rows, batch_size=5000)
                rows = []
    UtilizationRollup.objects.bulk_create(rows, batch_size=5000)
    seed_s = time.perf_counter() - started
    t = time.perf_counter()
    written = utilization.rollup(now)
    rollup_s = time.perf_counter() - t
    User = get_user_model()
    admin = User.objects.create_user("bench-history", password="bench-history-pw", is_staff=True)
    from django.test import Client

    client = Client()
    client.force_login(admin)
    pages = {}
    runs = max(20, opts["runs"])
    for span in utilization.RANGES:
        url = f"/pools/{pool.pk}/history/?range={span}"
        assert client.get(url).status_code == 200, url
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            r = client.get(url)
            times.append((time.perf_counter() - t) * 1000)
            assert r.status_code == 200
        times.sort()
        pages[f"pool history {span}"] = {
            "p50_ms": round(statistics.median(times), 1),
            "p95_ms": round(times[min(len(times) - 1, int(len(times) * 0.95))], 1),
            "points": r.content.count(b",") // 2,
            "bytes": len(r.content),
        }
    last = UtilizationRollup.objects.aggregate(t=Max("start"))["t"]
    return {
        "database": _db_label(),
        "seeded": {
            "devices": len(devices),
            "nodes": len(nodes),
            "days": opts["history_days"],
            "raw_samples": UtilizationSample.objects.count(),
            "rollups": UtilizationRollup.objects.count(),
            "seconds": round(seed_s, 1),
        },
        "rollup_newest_hour": {"rows": written, "seconds": round(rollup_s, 2), "last": last},
        "pages_ms": pages,
        "targets": {"pool_page_p95_ms": TARGET_PAGE_MS},
        "ok": all(p["p95_ms"] <= TARGET_PAGE_MS for p in pages.values()),
    }


def _db_label() -> str:
    from django.db import connection

    return f"{connection.vendor} {connection.settings_dict['NAME']}"


def _counts() -> dict[str, int]:
    from portal.models import Allocation, AuditEvent, Decision, Device, GpuRequest

    return {
        "requests": GpuRequest.objects.count(),
        "devices": Device.objects.count(),
        "allocations": Allocation.objects.filter(active=True).count(),
        "decisions": Decision.objects.count(),
        "audit_events": AuditEvent.objects.count(),
    }


def _seed(*, pending: int, nodes: int) -> dict[str, Any]:
    """Demo classes, pools and teams, then nodes, running work, a deep queue and a long log."""
    from django.contrib.auth import get_user_model
    from django.db import transaction
    from django.utils import timezone

    from portal.demo.seed import seed
    from portal.models import (
        Allocation,
        Attempt,
        AuditEvent,
        Decision,
        Device,
        GpuRequest,
        Membership,
        Node,
        PersonalToken,
        Pool,
        Team,
        WorkloadClass,
    )
    from portal.services.tokens import token_create

    rng = random.Random(7)
    seed()
    now = timezone.now()
    User = get_user_model()
    admin = User.objects.create_user("bench-admin", password="bench-admin-pw", is_staff=True)
    with transaction.atomic():
        teams = [
            Team.objects.get_or_create(name=f"bench-{i}", defaults={"namespace": f"qm-bench-{i}"})[
                0
            ]
            for i in range(10)
        ]
        members = []
        for i, team in enumerate(teams):
            for j in range(5):
                u = User.objects.create_user(f"bench-{i}-{j}", password="x" * 12)
                Membership.objects.create(user=u, team=team, role="lead" if j == 0 else "member")
                members.append((u, team))
        pools = {p.name: p for p in Pool.objects.all()}
        layout = (
            ("a100-train", "exclusive", 8),
            ("h100-mig", "mig", 8),
            ("l4-shared", "time-slicing", 4),
        )
        node_rows = []
        for n in range(nodes):
            pool_name, _, _ = layout[0] if n % 10 < 6 else layout[1] if n % 10 < 8 else layout[2]
            node_rows.append(
                Node(
                    name=f"bench-node-{n:04d}",
                    pool=pools[pool_name],
                    cpu_milli=128000,
                    memory_mib=1 << 20,
                )
            )
        Node.objects.bulk_create(node_rows, batch_size=500)
        mig = [
            {"profile": "3g.40gb", "start": 0, "size": 4},
            {"profile": "2g.20gb", "start": 4, "size": 2},
            {"profile": "1g.10gb", "start": 6, "size": 1},
            {"profile": "1g.10gb", "start": 7, "size": 1},
        ]
        device_rows = []
        for node in Node.objects.filter(name__startswith="bench-node-").select_related("pool"):
            part = node.pool.partitioning
            for idx in range(4 if part == "time-slicing" else 8):
                device_rows.append(
                    Device(
                        node=node,
                        index=idx,
                        model=node.pool.gpu_model,
                        memory_mib=node.pool.gpu_memory_mib,
                        partitioning=part,
                        replicas=4 if part == "time-slicing" else 1,
                        mig_instances=mig if part == "mig" else [],
                        healthy=rng.random() > 0.01,
                    )
                )
        Device.objects.bulk_create(device_rows, batch_size=1000)
        training = WorkloadClass.objects.get(name="training")
        a100 = pools["a100-train"]
        # Running work on a fifth of the exclusive devices, so the map has colour.
        exclusive = list(
            Device.objects.filter(node__name__startswith="bench-node-", partitioning="exclusive")
            .select_related("node")
            .order_by("id")
        )
        running = exclusive[::5]
        reqs = [
            GpuRequest(
                team=members[i % len(members)][1],
                submitted_by=members[i % len(members)][0],
                workload_class=training,
                pool=a100,
                image="registry.example.com/bench/train:1",
                state="running",
                status_code="running",
                status_message="running",
            )
            for i in range(len(running))
        ]
        GpuRequest.objects.bulk_create(reqs, batch_size=1000)
        attempts = [
            Attempt(
                request=r,
                number=1,
                state="running",
                pool=a100,
                nodes=[d.node.name],
                workload_name=f"qm-{r.pk}-1",
                namespace=r.team.namespace,
                gpus_milli=1000,
                admitted_at=now - timedelta(minutes=rng.randrange(1, 600)),
                started_at=now - timedelta(minutes=1),
            )
            for r, d in zip(reqs, running, strict=True)
        ]
        Attempt.objects.bulk_create(attempts, batch_size=1000)
        Allocation.objects.bulk_create(
            [
                Allocation(attempt=a, device=d, slot="gpu")
                for a, d in zip(attempts, running, strict=True)
            ],
            batch_size=1000,
        )
        classes = list(WorkloadClass.objects.all())
        pool_list = [None, *pools.values()]
        pend = [
            GpuRequest(
                team=members[i % len(members)][1],
                submitted_by=members[i % len(members)][0],
                workload_class=classes[i % len(classes)],
                pool=pool_list[i % len(pool_list)] if i % 3 else a100,
                count=1 + i % 4,
                image="registry.example.com/bench/train:1",
                status_code="no-capacity",
                status_message="waiting: no node in pool a100-train has 2 whole GPUs free right now",
                queue_position=i + 1,
            )
            for i in range(pending)
        ]
        GpuRequest.objects.bulk_create(pend, batch_size=1000)
        # Spread creation times so the queue has ages.
        for i in range(0, pending, 1000):
            ids = [r.pk for r in pend[i : i + 1000]]
            GpuRequest.objects.filter(pk__in=ids).update(
                created_at=now - timedelta(minutes=i // 10)
            )
        decisions = []
        for r in pend:
            decisions.append(
                Decision(
                    tick=1,
                    request=r,
                    team=r.team,
                    kind="wait",
                    code="no-capacity",
                    message=r.status_message,
                )
            )
        for r, a in zip(reqs, attempts, strict=True):
            decisions.append(
                Decision(
                    tick=1,
                    request=r,
                    attempt=a,
                    team=r.team,
                    pool=a100,
                    node=a.nodes[0],
                    kind="admit",
                    code="fits",
                    message="admitted within quota",
                )
            )
        for k in range(30_000):
            r = pend[k % len(pend)]
            decisions.append(
                Decision(
                    tick=2 + k // 1000,
                    request=r,
                    team=r.team,
                    kind="wait",
                    code="borrowing-limit",
                    message="waiting: team over its quota",
                )
            )
        Decision.objects.bulk_create(decisions, batch_size=2000)
        AuditEvent.objects.bulk_create(
            [
                AuditEvent(
                    actor=admin,
                    actor_name="bench-admin",
                    action="request.submit",
                    object_type="gpurequest",
                    object_id=str(r.pk),
                    team=r.team,
                    after={"count": r.count},
                )
                for r in pend
            ]
            + _admin_events(admin, rng),
            batch_size=2000,
        )
    submitters = []
    for u, team in members:
        _, secret = token_create(user=u, name="bench_web", scope=PersonalToken.Scope.SUBMIT)
        submitters.append((secret, team.name))
    return {"admin": admin, "submitters": submitters}


def _admin_events(admin: Any, rng: random.Random) -> list[Any]:
    """Quota changes and node maintenance with reasons: the audit log's other kinds of rows."""
    from portal.models import AuditEvent, Node, Quota

    quotas = list(Quota.objects.select_related("team"))
    nodes = list(Node.objects.values_list("pk", flat=True)[:500])
    events = []
    for k in range(2000):
        q = quotas[k % len(quotas)] if quotas else None
        if q is not None and k % 2:
            events.append(
                AuditEvent(
                    actor=admin,
                    actor_name="bench-admin",
                    action="quota.set",
                    object_type="quota",
                    object_id=str(q.pk),
                    team=q.team,
                    before={"nominal_milli": 8000, "borrowing_limit_milli": None},
                    after={
                        "nominal_milli": rng.randrange(0, 16) * 1000,
                        "borrowing_limit_milli": 4500,
                    },
                    reason=f"bench change {k}",
                )
            )
        elif nodes:
            events.append(
                AuditEvent(
                    actor=admin,
                    actor_name="bench-admin",
                    action="node.cordon",
                    object_type="node",
                    object_id=str(nodes[k % len(nodes)]),
                    before={"cordoned": False, "draining": False},
                    after={"cordoned": True, "draining": False},
                    reason="bench maintenance",
                )
            )
    return events


def _time_pages(*, admin: Any, runs: int) -> dict[str, dict[str, Any]]:
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from portal.models import GpuRequest, Pool, Team

    client = Client()
    client.force_login(admin)
    running = GpuRequest.objects.filter(state="running").order_by("id").first()
    waiting = GpuRequest.objects.filter(state="pending").order_by("id").first()
    assert running is not None and waiting is not None  # (the bench's data has both)
    team = Team.objects.get(name="bench-0")
    pool = Pool.objects.get(name="a100-train")
    pages = {
        "my jobs": "/",
        "my jobs (all teams)": "/?scope=team",
        "my jobs (search, htmx partial)": "/?scope=team&q=a&state=pending&page=20",
        "request form": "/requests/new/",
        "request form (resubmit)": f"/requests/new/?from={waiting.pk}",
        "request page (running)": f"/requests/{running.pk}/",
        "request page (queued)": f"/requests/{waiting.pk}/",
        "request log (htmx partial)": f"/requests/{running.pk}/logs/",
        "notifications": "/me/notifications/",
        "queue": "/queue/",
        "queue (htmx partial)": "/queue/?page=100",
        "decision log": "/decisions/",
        "decision log (filtered)": "/decisions/?kind=wait&page=50",
        "teams": "/teams/",
        "team page": f"/teams/{team.pk}/",
        "capacity map": "/ops/capacity/",
        "capacity map (page 10)": "/ops/capacity/?page=10",
        "capacity map (one pool)": f"/ops/capacity/?pool={pool.pk}",
        "audit log": "/ops/audit/",
        "audit log (page 100, htmx partial)": "/ops/audit/?page=100",
        "audit log (search a pool)": "/ops/audit/?q=a100-train",
        "audit log (search text and dates)": "/ops/audit/?q=bench-3&date_from=2000-01-01&date_to=2999-12-31",
        "audit log CSV (search)": "/ops/audit.csv?q=bench-3",
        # A download of the whole log, not a page: it grows with the log (reported, not a target).
        "export: audit log CSV (all rows)": "/ops/audit.csv",
        "settings": "/ops/settings/",
    }
    out = {}
    for label, url in pages.items():
        headers = {"HTTP_HX_REQUEST": "true"} if "htmx" in label else {}
        assert _get(client, url, headers).status_code == 200, url  # warm caches and connections
        times = []
        for _ in range(runs):
            with CaptureQueriesContext(connection) as q:
                t = time.perf_counter()
                r = _get(client, url, headers)
                times.append((time.perf_counter() - t) * 1000)
            assert r.status_code == 200
        out[label] = {
            "median_ms": round(statistics.median(times), 1),
            "p95_ms": round(_p95(times), 1),
            "max_ms": round(max(times), 1),
            "queries": len(q.captured_queries),
            "bytes": r.bytes,
        }
    return out


def _get(client: Any, url: str, headers: dict[str, str]) -> Any:
    """GET a page and read all of it (a streamed CSV included), as a browser would."""
    r = client.get(url, **headers)
    body = b"".join(r.streaming_content) if r.streaming else r.content
    r.bytes = len(body)
    return r


def _p95(times: list[float]) -> float:
    """The 95th percentile (the nearest rank: with fewer than 20 runs, the slowest)."""
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, max(0, -(-95 * len(ordered) // 100) - 1))]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _drive_gunicorn(
    submitters: list[tuple[str, str]],
    *,
    submits: int,
    threads: int,
    workers: int,
    worker_class: str = "gthread",
    worker_threads: int = 4,
    reuse: bool = True,
) -> dict[str, Any]:
    port = _free_port()
    gunicorn = [
        sys.executable,
        "-m",
        "gunicorn",
        "portal.wsgi:application",
        "--bind",
        f"127.0.0.1:{port}",
        "--workers",
        str(workers),
        "--worker-class",
        worker_class,
        "--keep-alive",
        "5",
        "--log-level",
        "warning",
        "--timeout",
        "60",
    ]
    if worker_class == "gthread":
        gunicorn += ["--threads", str(worker_threads)]
    proc = subprocess.Popen(
        gunicorn,
        cwd=_root(),
        env=os.environ.copy(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        _wait_for(port)
        body = {
            "workload_class": "training",
            "pool": "a100-train",
            "profile": "whole",
            "count": 1,
            "image": "registry.example.com/bench/train:1",
            "command": ["python", "train.py"],
            "env": {"EPOCHS": "1"},
        }
        lock = threading.Lock()
        counter = {"next": 0}
        latencies: list[float] = []
        errors: list[str] = []

        connects = {"n": 0}

        def worker() -> None:
            conn: HTTPConnection | None = None
            while True:
                with lock:
                    i = counter["next"]
                    if i >= submits:
                        break
                    counter["next"] += 1
                token, team = submitters[i % len(submitters)]
                payload = json.dumps({**body, "team": team, "name": f"bench-{i}"})
                t = time.perf_counter()
                try:
                    if conn is None:
                        conn = HTTPConnection("127.0.0.1", port, timeout=30)
                        with lock:
                            connects["n"] += 1
                    conn.request(
                        "POST",
                        "/api/v1/requests/",
                        payload,
                        {"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
                    )
                    resp = conn.getresponse()
                    data = resp.read()
                    if not reuse or resp.will_close:
                        conn.close()
                        conn = None
                    if resp.status != 201:
                        errors.append(f"{resp.status} {data[:200]!r}")
                except (OSError, HTTPException) as exc:  # counted, never retried (a POST)
                    errors.append(repr(exc))
                    if conn is not None:
                        conn.close()
                    conn = None
                with lock:
                    latencies.append((time.perf_counter() - t) * 1000)
            if conn is not None:
                conn.close()

        # A short warm-up so each worker has imported everything before the clock starts.
        for _ in range(workers * 2):
            token, team = submitters[0]
            conn = HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request("GET", "/api/v1/pools/", headers={"Authorization": f"Bearer {token}"})
            conn.getresponse().read()
            conn.close()
        load_before = os.getloadavg()
        server_cpu, client_cpu = _tree_cpu_s(proc.pid), time.process_time()
        started = time.perf_counter()
        pool = [threading.Thread(target=worker) for _ in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        elapsed = time.perf_counter() - started
        load_after = os.getloadavg()
        server_cpu, client_cpu = (
            _tree_cpu_s(proc.pid) - server_cpu,
            time.process_time() - client_cpu,
        )
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
    latencies.sort()
    ok = submits - len(errors)
    return {
        "submits": submits,
        "ok": ok,
        "errors": len(errors),
        "first_errors": errors[:3],
        "seconds": round(elapsed, 2),
        "rate_per_s": round(ok / elapsed, 1) if elapsed else 0.0,
        "latency_ms_p50": round(latencies[len(latencies) // 2], 1) if latencies else None,
        "latency_ms_p95": round(latencies[int(len(latencies) * 0.95)], 1) if latencies else None,
        "gunicorn": f"{workers} {worker_class} workers"
        + (f" x {worker_threads} threads" if worker_class == "gthread" else ""),
        "client_threads": threads,
        "client_connections": connects["n"],
        # CPU per submit is steadier than the rate on a shared machine (database server not included).
        "gunicorn_cpu_ms_per_submit": round(server_cpu * 1000 / submits, 2)
        if server_cpu >= 0
        else None,
        "client_cpu_ms_per_submit": round(client_cpu * 1000 / submits, 2),
        "loadavg_1_5_15_before": [round(x, 2) for x in load_before],
        "loadavg_1_5_15_after": [round(x, 2) for x in load_after],
    }


def _tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its children (Linux /proc; -1.0 elsewhere)."""
    try:
        total = 0.0
        for p in [pid, *_children(pid)]:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return total
    except (OSError, ValueError, IndexError):
        return -1.0


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _wait_for(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            conn = HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.2)
    raise CommandError("gunicorn did not start")
