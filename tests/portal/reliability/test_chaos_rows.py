"""The parts of `manage.py chaos` its fault runs rely on, fast: the worker kill (a SIGKILL the
supervisor answers with a restart) and the table with the control plane rows."""

from __future__ import annotations

import sys
import time

from portal.management.commands.chaos import _Supervised, format_table


def test_a_hard_killed_process_is_started_again_and_counted() -> None:
    sup = _Supervised([sys.executable, "-c", "import time; time.sleep(60)"], {})
    try:
        first = sup.proc
        sup.kill_hard()
        deadline = time.monotonic() + 10
        while sup.restarts == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sup.restarts == 1
        assert first.poll() is not None
        assert sup.proc is not first and sup.poll() is None
    finally:
        sup.kill()
        sup.wait(timeout=10)


def test_the_table_prints_the_control_plane_rows_apart() -> None:
    web = {"fault": "worker kill", "outage_s": 7.0, "requests": 10, "restarts": 1}
    cp = {"fault": "etcd restart", "outage_s": 10.4, "jobs": 8, "double": 0, "stuck": 0}
    lines = format_table([web, cp]).splitlines()
    assert lines[0].startswith("| fault | outage s | requests | 2xx |")
    assert lines[2].startswith("| worker kill | 7.0 | 10 |") and lines[2].endswith("| 1 |")
    assert lines[3] == ""
    assert "| Jobs | double launches |" in lines[4]
    assert lines[6].startswith("| etcd restart | 10.4 |")
