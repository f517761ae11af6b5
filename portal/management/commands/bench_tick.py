"""Benchmark one whole portal tick: snapshot read, `schedule()`, apply, on a real database.

    python manage.py bench_tick --json                      # a throwaway SQLite file
    python manage.py bench_tick --json --database-url postgres://user@host:5432/any

With a PostgreSQL URL the command creates a fresh database on that server
(``qm_bench_tick_<pid>``), runs there, and drops it afterwards; the database named
in the URL (or, if it does not exist, ``postgres``) is only used to connect. The parent process never touches a database
itself: it re-runs itself as a child pointed at the throwaway one, which migrates
it and fills it with bulk inserts:

- the shipped workload classes and device profiles, and the pools of the shipped
  simulated cluster (exclusive A100, MIG H100, time-sliced L4);
- ``--teams`` teams (each with five members and an equal nominal quota of each pool,
  borrowing unlimited), ``--nodes`` nodes (default: one per 8 GPUs) sharing ``--gpus``
  devices;
- ``--allocated`` of the devices held by running attempts (allocations and usage);
- ``--pending`` pending requests: whole GPUs (1-8), shared slices, MIG instances and
  two-pod gangs, a quarter naming a pool.

The child then runs ONE tick through `portal.tick.run.run_tick` (what beat runs), with the
portal's settings and the simulated backend, and prints one JSON object:

- ``seconds``: the whole `run_tick` wall time, from the lock to the commit;
  ``cpu_seconds``, its CPU time in this process (the figure to read on a shared
  machine; PostgreSQL's own work is not in it), ``cpu_by_step`` per step;
  ``snapshot_s``, ``schedule_s``, ``apply_s``: its steps (the rest is the lock, the
  record and the commit);
- ``launch_s``, ``launch_queries``: the launch task's work for the tick's admissions,
  which the tick hands to a worker on commit (`portal.tick.apply.launch_soon`); run here after
  the tick, outside ``seconds``;
- ``queries``: the tick's SQL statements, COPY included (``queries_by_step``, the
  launch's too; ``sql_s`` is their time waiting on the database, ``slowest_sql`` the
  longest);
- ``peak_rss_mb``: the process's peak resident memory (the seeding included);
- ``next_tick``: the same for the tick after it, with nothing new (the steady state of a
  deep queue on a full cluster); ``later_tick``, for one 20 minutes later (its ``now``),
  still with nothing new: the quiet tick a deep queue runs most of the time, its
  requests old enough to plan preemptions;
- ``other_process_tick``: one more in a process with nothing kept (a worker's first
  tick: the chart's worker runs several processes, and any may get a tick), then
  ``back_in_process_tick``: one more in the first process, a tick behind (most ticks
  with several worker processes).

The machine's load moves the wall times; ``queries`` does not move.
"""

from __future__ import annotations

import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

GPUS_PER_NODE_MAX = 16


class Command(BaseCommand):
    help = "Time one whole portal tick (snapshot, schedule, apply) on a throwaway database."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print one JSON object")
        parser.add_argument(
            "--database-url",
            default="",
            help="a PostgreSQL server to create (and drop) a throwaway database on; "
            "default: a throwaway SQLite file",
        )
        parser.add_argument("--pending", type=int, default=10_000)
        parser.add_argument("--teams", type=int, default=30)
        parser.add_argument(
            "--nodes",
            type=int,
            default=0,
            help="default: one node per 8 GPUs (--gpus / 8, rounded up)",
        )
        parser.add_argument("--gpus", type=int, default=8_000)
        parser.add_argument("--allocated", type=float, default=0.6)
        parser.add_argument("--seed", type=int, default=1)
        parser.add_argument(
            "--profile",
            action="store_true",
            help="print the first tick's cProfile (top 45 by cumulative, then by own time) to stderr",
        )
        parser.add_argument(
            "--save-snapshot",
            default="",
            metavar="FILE",
            help="pickle the tick's snapshot to FILE, the next tick's to FILE.next, the one "
            "20 minutes later to FILE.later (to profile schedule() on its own)",
        )
        # The child fills whatever database it is pointed at: never a user's own.
        parser.add_argument("--child", action="store_true", help=__import__("argparse").SUPPRESS)

    def handle(self, *args: Any, **opts: Any) -> None:
        _check(opts)
        if opts["child"]:
            result = run(opts)
            self.stdout.write(json.dumps(result) if opts["json"] else _plain(result))
            return
        tmp = Path(tempfile.mkdtemp(prefix="qm-bench-tick-"))
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "SQLITE_PATH")}
        env.update(
            QM_VAR_DIR=str(tmp),
            CELERY_TASK_ALWAYS_EAGER="false",
            DEMO_TRICKLE="false",
            DEBUG="false",
            LOG_LEVEL="WARNING",
        )
        dropper: Callable[[], None] = lambda: None  # noqa: E731
        if opts["database_url"]:
            env["DATABASE_URL"], dropper = _throwaway_postgres(opts["database_url"])
        else:
            env["DATABASE_URL"] = f"sqlite:///{tmp / 'bench.sqlite3'}?timeout=30"
        argv = [sys.executable, "manage.py", "bench_tick", "--child"]
        for key in ("pending", "teams", "nodes", "gpus", "allocated", "seed"):
            argv += [f"--{key}", str(opts[key])]
        argv += ["--json"] * opts["json"] + ["--profile"] * opts["profile"]
        if opts["save_snapshot"]:
            argv += ["--save-snapshot", str(Path(opts["save_snapshot"]).resolve())]
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
        if opts["profile"]:
            self.stderr.write(done.stderr)
        self.stdout.write(done.stdout.strip())


def _check(opts: dict[str, Any]) -> None:
    if not opts["nodes"] and opts["gpus"] > 0:
        opts["nodes"] = -(-opts["gpus"] // 8)
    for key in ("pending", "teams", "nodes", "gpus"):
        if opts[key] < 1:
            raise CommandError(f"--{key} must be at least 1")
    if not opts["nodes"] <= opts["gpus"] <= opts["nodes"] * GPUS_PER_NODE_MAX:
        raise CommandError(f"--gpus must be between --nodes and {GPUS_PER_NODE_MAX} x --nodes")
    if not 0.0 <= opts["allocated"] < 1.0:
        raise CommandError("--allocated must be a fraction from 0 up to (not including) 1")
    url = opts["database_url"]
    if url and urlsplit(url).scheme not in ("postgres", "postgresql", "pgsql"):
        raise CommandError("--database-url must be a postgres:// URL (SQLite is the default)")


def _root() -> str:
    return str(Path(__file__).resolve().parents[3])


def _throwaway_postgres(url: str) -> tuple[str, Callable[[], None]]:
    """Create a fresh database on the server `url` names; return its URL and a dropper."""
    import psycopg

    name = f"qm_bench_tick_{os.getpid()}"
    parts = urlsplit(url)
    # The URL's own database need not exist: the server's maintenance database will do.
    admin_urls = [url, urlunsplit(parts._replace(path="/postgres"))]

    def connect() -> Any:
        for candidate in admin_urls[:-1]:
            try:
                return psycopg.connect(candidate, autocommit=True)
            except psycopg.OperationalError:
                continue
        return psycopg.connect(admin_urls[-1], autocommit=True)

    try:
        with connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.Error as exc:
        raise CommandError(f"--database-url: cannot create a database there: {exc}") from exc

    def drop() -> None:
        with connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return urlunsplit(parts._replace(path=f"/{name}")), drop


def _plain(result: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in result.items())


# ---------------------------------------------------------------------------
# The child: runs against the throwaway database only


def run(opts: dict[str, Any]) -> dict[str, Any]:
    """Migrate, fill, then time one tick. Also what the test calls on its own database."""
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    fill(
        pending=opts["pending"],
        teams=opts["teams"],
        nodes=opts["nodes"],
        gpus=opts["gpus"],
        allocated=opts["allocated"],
        seed=opts["seed"],
    )
    result = time_tick(
        profile=opts.get("profile", False), save_snapshot=opts.get("save_snapshot", "")
    )
    # The next tick, with nothing new: the steady state of a deep queue on a full cluster.
    saved = opts.get("save_snapshot", "")
    following = time_tick(save_snapshot=f"{saved}.next" if saved else "")
    result["next_tick"] = {k: following[k] for k in _TICK_KEYS}
    # And one 20 minutes later, still nothing new: the quiet tick a deep queue runs most of
    # the time, its requests now old enough to plan preemptions.
    later = time_tick(
        save_snapshot=f"{saved}.later" if saved else "",
        now=timezone.now() + timedelta(minutes=20),
    )
    result["later_tick"] = {k: later[k] for k in _TICK_KEYS}
    # The chart runs several worker processes, and any may get a tick: one with nothing
    # kept (a worker's first tick), then this one again, a tick behind.
    from portal.tick import snapshot

    this_process = snapshot._KEPT
    snapshot._KEPT = snapshot._Kept(incremental=True)
    try:
        other = time_tick(now=timezone.now() + timedelta(minutes=20))
    finally:
        snapshot._KEPT = this_process
    result["other_process_tick"] = {k: other[k] for k in _TICK_KEYS}
    back = time_tick(now=timezone.now() + timedelta(minutes=20))
    result["back_in_process_tick"] = {k: back[k] for k in _TICK_KEYS}
    return result


_TICK_KEYS = (
    "seconds",
    "cpu_seconds",
    "cpu_by_step",
    "snapshot_s",
    "schedule_s",
    "apply_s",
    "queries",
    "decisions",
    "admitted",
)


@contextmanager
def _phases(save_snapshot: str = "") -> Iterator[dict[str, Any]]:
    """Time and count the queries of the tick's steps, wrapping what `portal.tick.run` calls."""
    from django.db import connection

    import portal.tick.apply
    import portal.tick.run

    stats: dict[str, Any] = {
        "phase": "lock",
        "seconds": defaultdict(float),
        "cpu": defaultdict(float),
        "queries": 0,
    }
    by_phase: dict[str, int] = defaultdict(int)
    stats["by_phase"] = by_phase

    slowest: list[tuple[float, str, str]] = []
    stats["slowest"] = slowest

    def counter(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        stats["queries"] += 1
        by_phase[stats["phase"]] += 1
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            slowest.append((time.perf_counter() - started, stats["phase"], sql[:70]))

    def timed(phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*a: Any, **kw: Any) -> Any:
            stats["phase"] = phase
            started, cpu_started = time.perf_counter(), time.process_time()
            try:
                return fn(*a, **kw)
            finally:
                stats["seconds"][phase] += time.perf_counter() - started
                stats["cpu"][phase] += time.process_time() - cpu_started
                stats["phase"] = "record"

        return wrapper

    launches: list[list[int]] = []
    stats["launches"] = launches
    # The steps are replaced where `run_tick` looks them up: its module's namespace. A benchmark's monkeypatch, so the modules are untyped here.
    run_module: Any = portal.tick.run
    apply_module: Any = portal.tick.apply
    originals = (
        run_module.build_snapshot,
        run_module.schedule,
        run_module.decisions_apply,
        apply_module.launch_soon,
    )
    run_module.build_snapshot = timed("snapshot", originals[0])
    schedule = timed("schedule", originals[1])

    def saving(snapshot: Any, *a: Any) -> Any:
        if save_snapshot:
            import pickle

            Path(save_snapshot).write_bytes(pickle.dumps(snapshot))
        return schedule(snapshot, *a)

    run_module.schedule = saving
    run_module.decisions_apply = timed("apply", originals[2])
    # The launch task's work, kept to run after the tick as a worker would (no message is
    # left in a broker for a database this command drops).
    apply_module.launch_soon = launches.append
    try:
        with connection.execute_wrapper(counter):
            yield stats
    finally:
        (
            run_module.build_snapshot,
            run_module.schedule,
            run_module.decisions_apply,
            apply_module.launch_soon,
        ) = originals


def time_tick(
    *, profile: bool = False, save_snapshot: str = "", now: datetime | None = None
) -> dict[str, Any]:
    """Run one tick through `run_tick` and report where its time and queries went."""
    from django.db import connection

    import portal.tick.apply
    from portal.models import Device, GpuRequest
    from portal.tick.run import run_tick

    pending = GpuRequest.objects.filter(state=GpuRequest.State.PENDING).count()
    gpus = Device.objects.count()
    connection.ensure_connection()
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
    with _phases(save_snapshot) as stats:
        if profiler:
            profiler.enable()
        started, cpu_started = time.perf_counter(), time.process_time()
        result = run_tick(now)
        seconds = time.perf_counter() - started
        cpu_seconds = time.process_time() - cpu_started
        if profiler:
            profiler.disable()
        tick_queries, stats["phase"] = stats["queries"], "launch"
        launch_started = time.perf_counter()
        for ids in stats["launches"]:
            portal.tick.apply.launch_attempts(ids)
        launch_s = time.perf_counter() - launch_started
    if profiler:
        import pstats

        stats_out = pstats.Stats(profiler, stream=sys.stderr)
        stats_out.sort_stats("cumulative").print_stats(45)
        stats_out.sort_stats("tottime").print_stats(45)
    if not result.ran:
        raise CommandError("the tick was skipped: another tick holds the lock")
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    scale = 1 if sys.platform != "darwin" else 1024  # macOS reports bytes
    sec = stats["seconds"]
    return {
        "database": connection.vendor,
        "pending": pending,
        "gpus": gpus,
        "seconds": round(seconds, 3),
        "cpu_seconds": round(cpu_seconds, 3),
        "cpu_by_step": {k: round(v, 3) for k, v in stats["cpu"].items()},
        "snapshot_s": round(sec["snapshot"], 3),
        "schedule_s": round(sec["schedule"], 3),
        "apply_s": round(sec["apply"], 3),
        "launch_s": round(launch_s, 3),
        "queries": tick_queries,
        "launch_queries": stats["queries"] - tick_queries,
        "queries_by_step": dict(stats["by_phase"]),
        "sql_s": round(sum(t for t, _, _ in stats["slowest"]), 3),
        "slowest_sql": [
            f"{t:.3f}s {phase}: {sql}" for t, phase, sql in sorted(stats["slowest"])[::-1][:8]
        ],
        "decisions": result.decisions,
        "admitted": result.admitted,
        "preempted": result.preempted,
        "peak_rss_mb": round(rss_kb / scale / 1024, 1),
    }


# ---------------------------------------------------------------------------
# Filling the database


def _spread(total: int, parts: int) -> list[int]:
    """`total` split over `parts` as evenly as whole numbers allow."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def fill(*, pending: int, teams: int, nodes: int, gpus: int, allocated: float, seed: int) -> None:
    """Fill the (empty, migrated) database with bulk inserts; see the module docstring."""
    from django.contrib.auth import get_user_model
    from django.db import transaction

    from portal.backends.simulated import load_cluster
    from portal.demo import seed as demo
    from portal.models import (
        DeviceProfile,
        Membership,
        Pool,
        Quota,
        Team,
        WorkloadClass,
    )

    rng = random.Random(seed)
    now = timezone.now()
    User = get_user_model()
    with transaction.atomic():
        for name, kind, mig, milli, mem in demo.PROFILES:
            DeviceProfile.objects.get_or_create(
                name=name,
                defaults={"kind": kind, "mig_profile": mig, "milli": milli, "gpu_memory_mib": mem},
            )
        classes = {}
        for name, band, preemption, min_rt, max_q, inference, _ in demo.CLASSES:
            classes[name], _ = WorkloadClass.objects.get_or_create(
                name=name,
                defaults={
                    "band": band,
                    "preemption": preemption,
                    "min_runtime_s": min_rt,
                    "max_queue_s": max_q,
                    "inference": inference,
                },
            )
        pools = []
        # The shipped demo cluster's pools (whatever SIMULATED_CLUSTER says): one of each kind.
        shipped = Path(demo.__file__).with_name("cluster.yaml")
        for spec in sorted(
            # one pool of each kind: the autoscaled demo pool is a second exclusive one
            [p for p in load_cluster(shipped)["pools"] if "autoscale" not in p],
            key=lambda p: ("exclusive", "mig", "time-slicing").index(p["partitioning"]),
        ):
            pool, _ = Pool.objects.get_or_create(
                name=f"bench-{spec['name']}",
                defaults={
                    "gpu_model": spec["gpu_model"],
                    "gpu_memory_mib": spec["gpu_memory_mib"],
                    "interconnect": spec.get("interconnect", "pcie"),
                    "partitioning": spec.get("partitioning", "exclusive"),
                    "time_slicing_replicas": spec.get("replicas", 1),
                    "mig_layout": spec.get("mig_layout", []),
                    "taints": spec.get("taints", []),
                    "inference_floor_milli": spec.get("inference_floor_milli", 0),
                },
            )
            pools.append(pool)
        team_rows = Team.objects.bulk_create(
            [Team(name=f"bench-{i:02d}", namespace=f"qm-bench-{i:02d}") for i in range(teams)]
        )
        users = User.objects.bulk_create(
            [
                User(username=f"bench-{i:02d}-{j}", password="!")
                for i in range(teams)
                for j in range(5)
            ]
        )
        Membership.objects.bulk_create(
            [
                Membership(user=u, team=team_rows[k // 5], role="lead" if k % 5 == 0 else "member")
                for k, u in enumerate(users)
            ]
        )
        # Nodes: 60 % exclusive, 20 % MIG, 20 % time-sliced (the demo cluster's pools).
        node_pools = [
            pools[0] if i % 10 < 6 else pools[1] if i % 10 < 8 else pools[2] for i in range(nodes)
        ]
        per_node = _spread(gpus, nodes)
        node_rows, device_rows = _nodes(node_pools, per_node)
        capacity: dict[int, int] = defaultdict(int)
        for n, k in zip(node_pools, per_node, strict=True):
            capacity[n.pk] += k * 1000
        Quota.objects.bulk_create(
            [
                Quota(team=t, pool=p, nominal_milli=capacity[p.pk] // teams)
                for t in team_rows
                for p in pools
            ]
        )
        members = list(zip(users, [team_rows[k // 5] for k in range(len(users))], strict=True))
        _running(device_rows, allocated, members, classes, now, rng)
        _pending(pending, members, classes, pools, now, rng)


def _nodes(node_pools: list[Any], per_node: list[int]) -> tuple[list[Any], list[Any]]:
    from portal.models import Device, Node

    node_rows = Node.objects.bulk_create(
        [
            Node(
                name=f"bench-node-{i:05d}",
                pool=p,
                cpu_milli=128_000,
                memory_mib=1 << 20,
                labels={"quartermaster.io/pool": p.name},
                taints=p.taints,
                interconnect=p.interconnect,
            )
            for i, p in enumerate(node_pools)
        ],
        batch_size=1000,
    )
    mig = [
        {"profile": "3g.40gb", "start": 0, "size": 4},
        {"profile": "2g.20gb", "start": 4, "size": 2},
        {"profile": "1g.10gb", "start": 6, "size": 1},
        {"profile": "1g.10gb", "start": 7, "size": 1},
    ]
    rows = []
    for node, k in zip(node_rows, per_node, strict=True):
        part = node.pool.partitioning
        for idx in range(k):
            rows.append(
                Device(
                    node=node,
                    index=idx,
                    uuid=f"GPU-{node.pk:05d}-{idx:02d}",
                    model=node.pool.gpu_model,
                    memory_mib=node.pool.gpu_memory_mib,
                    partitioning=part,
                    replicas=node.pool.time_slicing_replicas,
                    mig_instances=mig if part == "mig" else [],
                )
            )
    return node_rows, Device.objects.bulk_create(rows, batch_size=2000)


def _running(
    devices: list[Any],
    allocated: float,
    members: list[tuple[Any, Any]],
    classes: dict[str, Any],
    now: Any,
    rng: random.Random,
) -> None:
    """Hold `allocated` of each node's devices (rounded, the error carried) with running work."""
    from portal.models import Allocation, Attempt, GpuRequest, UsageRecord

    by_node: dict[int, list[Any]] = defaultdict(list)
    for d in devices:
        by_node[d.node_id].append(d)
    # (request fields, pool, [(device, slot, grant fields)])
    jobs: list[tuple[dict[str, Any], Any, list[tuple[Any, str, dict[str, Any]]]]] = []
    carry = 0.0
    for node_devices in by_node.values():
        node = node_devices[0].node
        carry += len(node_devices) * allocated
        take = int(carry)
        carry -= take
        held = node_devices[:take]
        part = node.pool.partitioning
        if part == "mig":
            for d in held:
                for m in d.mig_instances:
                    slots = [f"m{i}" for i in range(m["start"], m["start"] + m["size"])]
                    grant = {
                        "mig_profile": m["profile"],
                        "mig_start": m["start"],
                        "mig_size": m["size"],
                        "milli": 0,
                    }
                    jobs.append(
                        (
                            {"profile_kind": "mig", "mig_profile": m["profile"], "count": 1},
                            node.pool,
                            [(d, s, grant) for s in slots],
                        )
                    )
            continue
        i = 0
        while i < len(held):
            size = min(rng.choice((1, 2, 4)), len(held) - i)
            group = held[i : i + size]
            i += size
            slots = (
                ["gpu"]
                if part == "exclusive"
                else [f"s{k}" for k in range(node.pool.time_slicing_replicas)]
            )
            jobs.append(
                (
                    {"profile_kind": "whole", "count": size},
                    node.pool,
                    [(d, s, {}) for d in group for s in slots],
                )
            )
    class_names = list(classes)
    reqs = []
    for k, (fields, _pool, _slots) in enumerate(jobs):
        user, team = members[rng.randrange(len(members))]
        reqs.append(
            GpuRequest(
                team=team,
                submitted_by=user,
                workload_class=classes[class_names[k % len(class_names)]],
                image="registry.example.com/bench/train:1",
                state="running",
                status_code="running",
                status_message="running",
                cpu_milli=4000,
                memory_mib=16_384,
                **fields,
            )
        )
    GpuRequest.objects.bulk_create(reqs, batch_size=2000)
    attempts = []
    for r, (_fields, pool, held_slots) in zip(reqs, jobs, strict=True):
        started = now - timedelta(seconds=rng.randrange(60, 86_400))
        attempts.append(
            Attempt(
                request=r,
                number=1,
                state="running",
                pool=pool,
                nodes=[held_slots[0][0].node.name],
                workload_name=f"qm-{r.pk}-1",
                namespace=r.team.namespace,
                gpus_milli=r.gpus_milli,
                admitted_at=started,
                started_at=started,
            )
        )
    Attempt.objects.bulk_create(attempts, batch_size=2000)
    Allocation.objects.bulk_create(
        [
            Allocation(attempt=a, device=d, slot=s, **grant)
            for a, (_f, _p, slots) in zip(attempts, jobs, strict=True)
            for d, s, grant in slots
        ],
        batch_size=5000,
    )
    UsageRecord.objects.bulk_create(
        [
            UsageRecord(
                attempt=a,
                team=r.team,
                workload_class=r.workload_class,
                pool=a.pool,
                gpus_milli=a.gpus_milli,
                started_at=cast(datetime, a.started_at),  # (each attempt above has started)
            )
            for a, r in zip(attempts, reqs, strict=True)
        ],
        batch_size=2000,
    )


def _pending(
    pending: int,
    members: list[tuple[Any, Any]],
    classes: dict[str, Any],
    pools: list[Any],
    now: Any,
    rng: random.Random,
) -> None:
    """A deep queue: whole GPUs, shared slices, MIG instances and gangs, waiting up to 2 h."""
    from portal.models import GpuRequest

    exclusive, mig, shared = pools
    rows = []
    for _ in range(pending):
        user, team = members[rng.randrange(len(members))]
        roll = rng.random()
        if roll < 0.5:
            fields: dict[str, Any] = {"count": rng.choice((1, 1, 2, 4, 8)), "cpu_milli": 8000}
            cls, pool = "training", rng.choice((exclusive, None, None, None))
        elif roll < 0.7:
            fields = {
                "profile_kind": "shared",
                "milli": rng.choice((250, 500)),
                "gpu_memory_mib": 5120,
            }
            cls, pool = "interactive", rng.choice((shared, None))
        elif roll < 0.85:
            fields = {
                "profile_kind": "mig",
                "mig_profile": rng.choice(("1g.10gb", "2g.20gb", "3g.40gb")),
            }
            cls, pool = "inference", rng.choice((mig, None))
        else:
            fields = {"count": rng.choice((2, 4)), "pods": 2, "cpu_milli": 8000}
            cls, pool = "training", rng.choice((exclusive, None))
        rows.append(
            GpuRequest(
                team=team,
                submitted_by=user,
                workload_class=classes[cls],
                pool=pool,
                image="registry.example.com/bench/train:1",
                priority=rng.randint(-2, 2),
                estimated_runtime_s=rng.choice((600, 3600, 4 * 3600)),
                **fields,
            )
        )
    GpuRequest.objects.bulk_create(rows, batch_size=2000)
    # Ages spread over two hours (created_at is set on insert), in a few statements.
    for start in range(0, pending, 1000):
        ids = [r.pk for r in rows[start : start + 1000]]
        GpuRequest.objects.filter(pk__in=ids).update(
            created_at=now - timedelta(seconds=7200 * (pending - start) // pending)
        )
