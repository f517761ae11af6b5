"""The embedded default stays up: a soak of `./scripts/run` on a busy machine, and a killed worker.

CI runs the soak for QM_SOAK_SECONDS (120 s by default); the documented long run is
`QM_SOAK_SECONDS=1800 scripts/test tests/embedded/test_soak.py` (docs/operations.md).
"""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.embedded.up import get, running_portal

pytestmark = pytest.mark.slow

SOAK_SECONDS = float(os.environ.get("QM_SOAK_SECONDS", "120"))
#: CPU burners beside the portal (default one per core; 0 where the machine is busy already)
BURNERS = int(os.environ.get("QM_SOAK_BURNERS", str(os.cpu_count() or 2)))


def _burn(stop_at: float) -> None:
    while time.time() < stop_at:
        sum(i * i for i in range(10_000))


def test_a_soak_on_a_busy_machine_loses_no_worker_and_no_task(tmp_path: Path) -> None:
    with running_portal(
        tmp_path, TICK_SECONDS="1", SIMULATED_SECONDS_PER_HOUR="20", QM_STATUS_EVERY_S="30"
    ) as portal:
        portal.wait_until_serving()
        start_ticks = portal.query("SELECT coalesce(max(ticks), 0) FROM portal_schedulerstate")
        # a busy machine: a CPU burner per core beside the portal, and page views each second
        stop_at = time.time() + SOAK_SECONDS
        burners = [
            multiprocessing.get_context("spawn").Process(target=_burn, args=(stop_at,))
            for _ in range(BURNERS)
        ]
        for proc in burners:
            proc.start()
        failed_views: list[tuple[str, int]] = []

        def view() -> None:
            while time.time() < stop_at:
                for path in ("/healthz", "/accounts/login/"):
                    status, _ = get(f"{portal.url}{path}", timeout=30)
                    if status != 200:
                        failed_views.append((path, status))
                time.sleep(1)

        viewer = threading.Thread(target=view)
        viewer.start()
        viewer.join()
        for proc in burners:
            proc.join()
        # let what was sent in the last seconds be worked off
        time.sleep(10)
        ticks = (
            portal.query("SELECT coalesce(max(ticks), 0) FROM portal_schedulerstate") - start_ticks
        )
        submitted = portal.query("SELECT count(*) FROM portal_gpurequest")
        undecided = portal.query(
            "SELECT count(*) FROM portal_gpurequest r WHERE NOT EXISTS "
            "(SELECT 1 FROM portal_decision d WHERE d.request_id = r.id) "
            "AND r.created_at < datetime('now', '-10 seconds')"
        )
        out, log = portal.output(), portal.log()
        backlog = list((portal.var / "broker" / "in").glob("*.msg"))
        broken = list((portal.var / "broker" / "broken").glob("*"))
    print(
        f"soak {SOAK_SECONDS:.0f} s: {ticks} ticks, {submitted} requests, {undecided} undecided, "
        f"{len(backlog)} messages waiting, {len(broken)} broken, {len(failed_views)} failed views"
    )
    assert "exited with" not in out, out[-3000:]
    assert "Unrecoverable error" not in log
    assert not broken
    assert not failed_views, failed_views[:10]
    # the tick ran at least every third second on average, through the load
    assert ticks >= SOAK_SECONDS / 3, ticks
    assert undecided == 0
    # every task the worker took, it finished (a lost task is one received and never done)
    received = set(re.findall(r"Task [\w.]+\[([0-9a-f-]+)\] received", log))
    done = set(re.findall(r"Task [\w.]+\[([0-9a-f-]+)\] (?:succeeded|failed|retry)", log))
    # a periodic task that expired in the queue (the next one was sent) is discarded, not lost
    done |= set(re.findall(r"Discarding revoked task: [\w.]+\[([0-9a-f-]+)\]", log))
    assert received and received <= done | _in_flight(log), sorted(received - done)[:5]
    assert len(backlog) < 20


def _in_flight(log: str) -> set[str]:
    """The task taken last may still run when the portal stops."""
    received = re.findall(r"Task [\w.]+\[([0-9a-f-]+)\] received", log)
    return set(received[-1:])


def test_a_killed_worker_is_restarted_and_the_portal_keeps_answering(tmp_path: Path) -> None:
    with running_portal(tmp_path, TICK_SECONDS="1", QM_STATUS_EVERY_S="600") as portal:
        portal.wait_until_serving()
        [worker] = portal.children("celery", " worker ")
        os.kill(worker, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "worker exited with" not in portal.output():
            assert get(f"{portal.url}/healthz")[0] == 200
            time.sleep(0.5)
        assert "worker exited with -9; restarting it" in portal.output()
        # a new worker, and the scheduler ticking again through it
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not portal.children("celery", " worker "):
            time.sleep(0.5)
        [again] = portal.children("celery", " worker ")
        assert again != worker
        ticks = portal.query("SELECT coalesce(max(ticks), 0) FROM portal_schedulerstate")
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if (
                portal.query("SELECT coalesce(max(ticks), 0) FROM portal_schedulerstate")
                >= ticks + 3
            ):
                break
            assert get(f"{portal.url}/healthz")[0] == 200
            time.sleep(1)
        assert (
            portal.query("SELECT coalesce(max(ticks), 0) FROM portal_schedulerstate") >= ticks + 3
        )
        assert get(f"{portal.url}/accounts/login/")[0] == 200
    assert portal.proc.returncode == 0
