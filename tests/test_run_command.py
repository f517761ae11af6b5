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
        # This instance's own gunicorn control socket, not the one shared in ~/.gunicorn
        # (a gunicorn older than control sockets has none to share).
        if _gunicorn_has_control_socket():
            assert list((tmp_path / "var").glob(f"gunicorn-{port}-*.ctl"))
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


def test_a_taken_port_is_said_at_once_with_what_to_do(tmp_path: Path) -> None:
    """It printed "serving on ..." and then died when port 8000 was taken."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
        env.update(QM_VAR_DIR=str(tmp_path / "var"))
        result = subprocess.run(
            [sys.executable, "manage.py", "up", "--no-demo", "--bind", f"127.0.0.1:{port}"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 1
    assert "serving on" not in result.stdout
    assert f"port {port} is in use" in result.stderr
    assert f"--bind 127.0.0.1:{port + 1}" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("CommandError: cannot serve on")


def test_a_malformed_bind_is_one_line() -> None:
    from django.core.management.base import CommandError

    from portal.management.commands.up import bind_listener

    for bad in ("8000", "localhost:", "127.0.0.1:http", "127.0.0.1:70000"):
        with pytest.raises(CommandError, match="HOST:PORT"):
            bind_listener(bad)


def test_each_instance_has_its_own_gunicorn_control_socket() -> None:
    from portal.management.commands.up import bind_listener, control_socket_args

    a, b = bind_listener("127.0.0.1:0"), bind_listener("127.0.0.1:0")
    try:
        args_a, args_b = control_socket_args(a), control_socket_args(b)
    finally:
        a.close()
        b.close()
    if not _gunicorn_has_control_socket():
        assert args_a == args_b == []
        return
    assert args_a[0] == "--control-socket" and args_a != args_b


def _gunicorn_has_control_socket() -> bool:
    from gunicorn.config import KNOWN_SETTINGS

    return any(s.name == "control_socket" for s in KNOWN_SETTINGS)
