"""Benchmark the what-if: seed N days of history on a throwaway database, time the replay.

    python manage.py bench_whatif --json                    # 30 days x 1,000 requests/day
    python manage.py bench_whatif --json --days 3 --per-day 200 --database-url postgres://...

As `bench_tick`, the parent re-runs itself as a child on a throwaway database (a SQLite
file, or a fresh PostgreSQL database it drops afterwards). The child migrates, builds the
bench cluster (`bench_tick.fill`: the demo's three pools, ``--teams`` teams with equal
nominal quotas, ``--nodes`` nodes sharing ``--gpus`` GPUs, nothing running or pending)
and seeds ``--days`` × ``--per-day`` finished requests at uniform random times: whole
GPUs (1-8), two-pod gangs, shared slices and MIG instances as `bench_tick` draws them,
each with one attempt that ran 10 min to 8 h. Then it runs `portal.tick.whatif.run` (the
command `whatif` runs) with one proposed change, a quota raise for one team, and prints:

- ``seconds``: the what-if's wall time (history read, both replays, the comparison);
  ``cpu_s``: the CPU time it took, the forked replay's included (what a busy machine's
  wall time hides);
- ``history_s``: of which reading the history; ``requests``: jobs replayed (each twice);
- ``current`` and ``proposed``: the overall figures of the two replays.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.core.management.base import BaseCommand, CommandError, CommandParser

from portal.management.commands.bench_tick import _root, _throwaway_postgres


class Command(BaseCommand):
    help = "Time a what-if over seeded history (default 30 days x 1,000 requests/day)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print one JSON object")
        parser.add_argument("--database-url", default="")
        parser.add_argument("--days", type=int, default=30)
        parser.add_argument("--per-day", type=int, default=1000)
        parser.add_argument("--teams", type=int, default=10)
        parser.add_argument("--nodes", type=int, default=60)
        parser.add_argument("--gpus", type=int, default=480)
        parser.add_argument("--tick-s", type=float, default=60.0)
        parser.add_argument("--seed", type=int, default=1)
        parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)

    def handle(self, *args: Any, **opts: Any) -> None:
        for key in ("days", "per_day", "teams", "nodes", "gpus"):
            if opts[key] < 1:
                raise CommandError(f"--{key.replace('_', '-')} must be at least 1")
        url = opts["database_url"]
        if url and urlsplit(url).scheme not in ("postgres", "postgresql", "pgsql"):
            raise CommandError("--database-url must be a postgres:// URL (SQLite is the default)")
        if opts["child"]:
            result = run(opts)
            self.stdout.write(json.dumps(result))
            return
        tmp = Path(tempfile.mkdtemp(prefix="qm-bench-whatif-"))
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "SQLITE_PATH")}
        env.update(QM_VAR_DIR=str(tmp), DEMO_TRICKLE="false", DEBUG="false", LOG_LEVEL="WARNING")
        dropper: Callable[[], None] = lambda: None  # noqa: E731
        if url:
            env["DATABASE_URL"], dropper = _throwaway_postgres(url)
        else:
            env["DATABASE_URL"] = f"sqlite:///{tmp / 'bench.sqlite3'}?timeout=30"
        argv = [sys.executable, "manage.py", "bench_whatif", "--child"]
        for key in ("days", "per_day", "teams", "nodes", "gpus", "tick_s", "seed"):
            argv += [f"--{key.replace('_', '-')}", str(opts[key])]
        try:
            done = subprocess.run(
                argv, env=env, cwd=_root(), capture_output=True, text=True, check=False
            )
        finally:
            dropper()
            shutil.rmtree(tmp, ignore_errors=True)
        if done.returncode != 0:
            self.stderr.write(done.stderr[-4000:])
            raise CommandError(f"benchmark child failed with exit code {done.returncode}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        if opts["json"]:
            self.stdout.write(json.dumps(result))
        else:
            self.stdout.write(" ".join(f"{k}={v}" for k, v in result.items()))


def run(opts: dict[str, Any]) -> dict[str, Any]:
    """Migrate, seed, time one what-if (also what the test calls on its own database)."""
    from django.core.management import call_command

    from portal.management.commands.bench_tick import fill
    from portal.models import GpuRequest
    from portal.tick import whatif

    call_command("migrate", verbosity=0)
    fill(
        pending=0,
        teams=opts["teams"],
        nodes=opts["nodes"],
        gpus=opts["gpus"],
        allocated=0.0,
        seed=opts["seed"],
    )
    seed_history(days=opts["days"], per_day=opts["per_day"], seed=opts["seed"])
    started = time.perf_counter()
    cpu = _cpu()
    marks: dict[str, float] = {}
    original = whatif.history

    def timed_history(*a: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return original(*a, **kw)
        finally:
            marks["history_s"] = time.perf_counter() - t

    whatif.history = timed_history
    try:
        result = whatif.run(
            days=opts["days"],
            settings={"quota.bench-00.bench-a100-train": str(opts["gpus"] // opts["teams"])},
            tick_s=opts["tick_s"],
        )
    finally:
        whatif.history = original
    seconds = time.perf_counter() - started
    cpu_s = _cpu() - cpu
    return {
        "database": "postgresql" if "postgres" in os.environ.get("DATABASE_URL", "") else "sqlite",
        "days": opts["days"],
        "per_day": opts["per_day"],
        "requests": GpuRequest.objects.count(),
        "gpus": opts["gpus"],
        "seconds": round(seconds, 2),
        "cpu_s": round(cpu_s, 2),
        "history_s": round(marks.get("history_s", 0.0), 4),
        "current": result["current"],
        "proposed": result["proposed"],
    }


def _cpu() -> float:
    """CPU seconds of this process and its reaped children (the forked replay)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


#: how long seeded attempts ran, hours, and how often
RUNTIMES_H = ((1 / 6, 3), (0.5, 3), (1, 3), (2, 2), (4, 2), (8, 1))


def seed_history(*, days: int, per_day: int, seed: int) -> None:
    """Finished requests at uniform random times over the last `days`, one attempt each."""
    from django.db import transaction
    from django.utils import timezone

    from portal.lib.bulk import bulk_set, insert_rows
    from portal.models import Attempt, GpuRequest, Membership, Pool, WorkloadClass

    rng = random.Random(seed)
    now = timezone.now()
    window = days * 86400
    members = list(Membership.objects.values_list("user_id", "team_id", "team__namespace"))
    classes = dict(WorkloadClass.objects.values_list("name", "pk"))
    exclusive, mig, shared = (
        Pool.objects.get(name=f"bench-{n}") for n in ("a100-train", "h100-mig", "l4-shared")
    )
    hours = [h for h, w in RUNTIMES_H for _ in range(w)]
    with transaction.atomic():
        rows, attempts, created = [], [], []
        for _ in range(days * per_day):
            user_id, team_id, namespace = members[rng.randrange(len(members))]
            roll = rng.random()
            if roll < 0.5:
                fields: dict[str, Any] = {"count": rng.choice((1, 1, 2, 4, 8))}
                cls, pool = "training", rng.choice((exclusive, None, None, None))
            elif roll < 0.7:
                fields = {"profile_kind": "shared", "milli": rng.choice((250, 500))}
                fields["gpu_memory_mib"] = 5120
                cls, pool = "interactive", rng.choice((shared, None))
            elif roll < 0.85:
                fields = {"profile_kind": "mig"}
                fields["mig_profile"] = rng.choice(("1g.10gb", "2g.20gb", "3g.40gb"))
                cls, pool = "inference", rng.choice((mig, None))
            else:
                fields = {"count": rng.choice((2, 4)), "pods": 2}
                cls, pool = "training", rng.choice((exclusive, None))
            runtime = int(rng.choice(hours) * 3600)
            arrival = now - timedelta(seconds=rng.uniform(0, window))
            rows.append(
                {
                    "team_id": team_id,
                    "submitted_by_id": user_id,
                    "workload_class_id": classes[cls],
                    "pool_id": pool.pk if pool else None,
                    "image": "registry.example.com/bench/train:1",
                    "state": GpuRequest.State.SUCCEEDED,
                    "estimated_runtime_s": runtime * 2,
                    "cpu_milli": 4000,
                    **fields,
                }
            )
            created.append(arrival)
            attempts.append((namespace, (pool or exclusive).pk, arrival, runtime))
        ids = insert_rows(GpuRequest, rows, ids=True)
        if not ids:  # SQLite: bulk_create gave no keys back; they are the newest rows
            ids = list(GpuRequest.objects.order_by("-pk").values_list("pk", flat=True)[: len(rows)])
            ids.reverse()
        bulk_set(GpuRequest, ("created_at",), list(zip(ids, created, strict=True)))
        insert_rows(
            Attempt,
            [
                {
                    "request_id": rid,
                    "number": 1,
                    "state": Attempt.State.SUCCEEDED,
                    "pool_id": pool_id,
                    "nodes": [],
                    "workload_name": f"qm-{rid}-1",
                    "namespace": namespace,
                    "gpus_milli": 1000,
                    "admitted_at": arrival,
                    "started_at": arrival,
                    "ended_at": arrival + timedelta(seconds=runtime),
                }
                for rid, (namespace, pool_id, arrival, runtime) in zip(ids, attempts, strict=True)
            ],
        )
