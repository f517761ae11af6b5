"""`manage.py chaos`, shorter: Redis stopped under a stream of submits and page views, with a real
gunicorn, worker and beat; PostgreSQL too where CHAOS_PG_STOP and CHAOS_PG_START name the
commands for a server of the test's own (never the shared one).

Parameters (all optional): CHAOS_REDIS_PORT with CHAOS_REDIS_STOP / CHAOS_REDIS_START (else the
test starts a redis-server of its own on a free port); CHAOS_DATABASE_URL (else a database
`<test database>_chaos` on the test's PostgreSQL server); CHAOS_PG_STOP / CHAOS_PG_START.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

pytestmark = [pytest.mark.celery, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[3]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def redis_server() -> Iterator[tuple[int, str, str]]:
    if os.environ.get("CHAOS_REDIS_PORT"):
        yield (
            int(os.environ["CHAOS_REDIS_PORT"]),
            os.environ["CHAOS_REDIS_STOP"],
            os.environ["CHAOS_REDIS_START"],
        )
        return
    if not shutil.which("redis-server") or not shutil.which("redis-cli"):
        pytest.skip("needs redis-server and redis-cli on PATH, or CHAOS_REDIS_PORT")
    port = _free_port()
    start = f"redis-server --port {port} --daemonize yes --save '' --appendonly no"
    stop = f"redis-cli -p {port} shutdown nosave"
    subprocess.run(start, shell=True, check=True)
    try:
        yield port, stop, start
    finally:
        subprocess.run(stop, shell=True, check=False, capture_output=True)


def _database_url() -> str:
    if os.environ.get("CHAOS_DATABASE_URL"):
        return os.environ["CHAOS_DATABASE_URL"]
    db = connection.settings_dict
    user = f"{db['USER']}@" if db["USER"] else ""
    # The test database's server; a database of the test's own, which the command recreates.
    return f"postgres://{user}{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}_chaos"


def test_redis_and_postgresql_outages_lose_nothing_and_answer_no_500(
    redis_server: tuple[int, str, str],
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the fault test runs on PostgreSQL (DATABASE_URL)")
    port, stop, start = redis_server
    argv = [
        sys.executable, "manage.py", "chaos", "--json", "--yes",
        "--database-url", _database_url(), "--redis-url", f"redis://127.0.0.1:{port}/0",
        "--redis-stop", stop, "--redis-start", start, "--redis-outage", "8",
        "--pg-outage", "5", "--warmup", "2", "--after", "4", "--settle", "60", "--rate", "6",
    ]  # fmt: skip
    pg = os.environ.get("CHAOS_PG_STOP"), os.environ.get("CHAOS_PG_START")
    if pg[0] and pg[1]:
        argv += ["--pg-stop", pg[0], "--pg-start", pg[1]]
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    done = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.stdout.strip(), done.stderr[-3000:]
    rows = {r["fault"]: r for r in json.loads(done.stdout)}
    assert set(rows) == ({"redis", "postgresql"} if pg[0] and pg[1] else {"redis"})
    for row in rows.values():
        assert row["accepted"] > 0, row
        assert row["s500"] == 0 and row["lost"] == 0, row
        assert row["decided"] == row["accepted"], row
        assert row["decided_s"] is not None and row["decided_s"] < 60, row
        assert row["worker_live"] == "yes", row
    # Redis is optional: nothing but 2xx while it is away, pages and API alike.
    redis = rows["redis"]
    assert redis["ok_2xx"] == redis["requests"], redis
    if "postgresql" in rows:
        pg_row = rows["postgresql"]
        assert pg_row["other"] == 0 and pg_row["s503"] > 0, pg_row  # the documented 503 window
    assert done.returncode == 0, done.stderr[-3000:]
