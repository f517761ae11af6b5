"""`manage.py probe`: the worker's and beat's liveness and readiness probes (the chart's).

    manage.py probe worker|beat --live|--ready [--max-age S]

Reads only the heartbeat files this pod's process writes (portal/lib/heartbeat.py):
never the broker or the database, so that a Redis or PostgreSQL outage restarts
nothing. Exit status 0 when the probe passes, 1 (with the reason) when not.

| probe | passes when |
|---|---|
| worker --live | the worker's main process touched its file within --max-age (default 60 s) |
| worker --ready | that, and a task (a tick, a reconcile, ...) succeeded in this worker within --max-age (default 120 s) |
| beat --live | beat's scheduler loop turned within --max-age (default 60 s) |
| beat --ready | that, and beat handed a periodic task to the broker within --max-age (default 120 s) |
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from portal.lib import heartbeat

ALIVE_MAX_AGE_S = 60.0
WORK_MAX_AGE_S = 120.0

_FILES = {
    "worker": (heartbeat.WORKER_ALIVE, heartbeat.WORKER_TASK, "a task succeeded"),
    "beat": (heartbeat.BEAT_ALIVE, heartbeat.BEAT_SENT, "a periodic task was sent"),
}


class Command(BaseCommand):
    help = "Liveness or readiness of this pod's worker or beat, from its heartbeat files."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("component", choices=sorted(_FILES))
        mode = parser.add_mutually_exclusive_group(required=True)
        mode.add_argument("--live", action="store_true", help="the process runs")
        mode.add_argument(
            "--ready", action="store_true", help="the process runs and its work succeeds"
        )
        parser.add_argument("--max-age", type=float, default=None, help="seconds (see the table)")

    def handle(self, *args: Any, **options: Any) -> None:
        alive_file, work_file, work_words = _FILES[options["component"]]
        name = options["component"]
        if options["live"]:
            limit = options["max_age"] or ALIVE_MAX_AGE_S
            self._check(alive_file, limit, f"{name} process ran")
        else:
            self._check(alive_file, ALIVE_MAX_AGE_S, f"{name} process ran")
            self._check(work_file, options["max_age"] or WORK_MAX_AGE_S, work_words)

    def _check(self, file: str, limit: float, words: str) -> None:
        seconds = heartbeat.age(file)
        if seconds is None:
            raise CommandError(f"not yet: {words} never ({file} missing)")
        if seconds > limit:
            raise CommandError(f"stale: {words} {seconds:.0f} s ago (limit {limit:.0f} s)")
        self.stdout.write(f"ok: {words} {seconds:.0f} s ago")
