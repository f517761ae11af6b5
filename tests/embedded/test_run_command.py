"""Smoke test of the embedded default: the README's run command serves, runs the demo, stops cleanly."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.embedded.up import ROOT, get, running_portal

pytestmark = pytest.mark.slow


def test_it_serves_the_demo_and_stops_cleanly(tmp_path: Path) -> None:
    with running_portal(
        tmp_path, TICK_SECONDS="1", SIMULATED_SECONDS_PER_HOUR="30", QM_STATUS_EVERY_S="5"
    ) as portal:
        portal.wait_until_serving()
        port = portal.url.rsplit(":", 1)[1]
        # This instance's own gunicorn control socket, not the one shared in ~/.gunicorn
        # (a gunicorn older than control sockets has none to share).
        if _gunicorn_has_control_socket():
            assert list(portal.var.glob(f"gunicorn-{port}-*.ctl"))
        # The first page render compiles templates; on a loaded machine it can take seconds.
        deadline = time.monotonic() + 120
        status, body = 0, ""
        while time.monotonic() < deadline and status != 200:
            status, body = get(f"{portal.url}/")
        assert status == 200 and "Log in" in body
        # the demo's login page says who to log in as
        assert "Demo logins" in body and "<code>researcher</code>" in body
        assert get(f"{portal.url}/no-such-page/")[0] == 404

        def running() -> int:
            return portal.query("SELECT count(*) FROM portal_gpurequest WHERE state = 'running'")

        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and (running() == 0 or "admitted" not in portal.output()):
            time.sleep(1)
        assert running() > 0, portal.output()[-3000:]
        out = portal.output()
        assert f"{portal.url}/" in out and "password quartermaster" in out
    code = portal.proc.wait(timeout=60)
    assert code == 0
    out = portal.output()
    assert "stopped" in out
    # A quiet terminal: the line a minute (every 5 s here), the log file named, and none of
    # the full log: no banner, no access log line, no traceback of the 404.
    assert re.search(r"since \d\d:\d\d: \d+ ticks, \d+ admitted", out), out
    assert "log is" in out and "portal.log" in out
    assert "celery@" not in out and "GET /" not in out and "Traceback" not in out
    assert "No hostname was supplied" not in out
    log = portal.log()
    assert "celery@" in log and "GET /no-such-page/" in log and "Not Found: /no-such-page/" in log
    assert "Traceback" not in log  # a 404 is a line in the log too


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
