"""Smoke test of the embedded default: the README's run command serves, runs the demo, stops cleanly."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=15) as resp:
            return resp.status, resp.read().decode()
    except OSError:
        return 0, ""


def test_it_serves_the_demo_and_stops_cleanly(tmp_path: Path) -> None:
    port = _free_port()
    env = {
        k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "SQLITE_PATH")
    }
    env.update(QM_VAR_DIR=str(tmp_path / "var"), TICK_SECONDS="1", SIMULATED_SECONDS_PER_HOUR="30")
    log = open(tmp_path / "up.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "up", "--bind", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120
        status = 0
        while time.monotonic() < deadline and status != 200:
            status, _ = _get(f"http://127.0.0.1:{port}/healthz")
            time.sleep(0.5)
        assert status == 200, (tmp_path / "up.log").read_text()[-3000:]
        # The first page render compiles templates; on a loaded machine it can take seconds.
        status, body = 0, ""
        while time.monotonic() < deadline and status != 200:
            status, body = _get(f"http://127.0.0.1:{port}/")
        assert status == 200 and "Log in" in body

        db = tmp_path / "var" / "quartermaster.sqlite3"

        def running() -> int:
            with sqlite3.connect(db, timeout=10) as conn:
                return int(
                    conn.execute(
                        "SELECT count(*) FROM portal_gpurequest WHERE state = 'running'"
                    ).fetchone()[0]
                )

        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and running() == 0:
            time.sleep(1)
        assert running() > 0, (tmp_path / "up.log").read_text()[-3000:]
        out = (tmp_path / "up.log").read_text()
        assert f"http://127.0.0.1:{port}/" in out and "password quartermaster" in out
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
    assert code == 0
    assert "stopped" in (tmp_path / "up.log").read_text()
