"""Run the whole portal on one machine: migrate, seed the demo, then web + worker + beat."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand

from portal.demo import DEMO_PASSWORD, DEMO_USERS


class Command(BaseCommand):
    help = (
        "Migrate, seed the demo and run web (gunicorn), a Celery worker and beat until interrupted."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--bind", default="127.0.0.1:8000")
        parser.add_argument(
            "--no-demo", action="store_true", help="do not seed demo data or trickle requests"
        )

    def handle(self, *args: Any, bind: str, no_demo: bool, **options: Any) -> None:
        call_command("migrate", interactive=False, verbosity=0)
        call_command("collectstatic", interactive=False, verbosity=0)
        env = dict(os.environ)
        if not no_demo:
            call_command("demo", requests=6)
            env["DEMO_TRICKLE"] = "true"
        python = sys.executable
        procs = {
            "web": [
                python,
                "-m",
                "gunicorn",
                "portal.wsgi",
                "--bind",
                bind,
                "--workers",
                "2",
                "--access-logfile",
                "-",
            ],
            "worker": [
                python,
                "-m",
                "celery",
                "-A",
                "portal",
                "worker",
                "--concurrency",
                "1",
                "--loglevel",
                "INFO",
            ],
            "beat": [
                python,
                "-m",
                "celery",
                "-A",
                "portal",
                "beat",
                "--loglevel",
                "INFO",
                "--schedule",
                str(settings.VAR_DIR / "celerybeat-schedule"),
            ],
        }
        children = {
            name: subprocess.Popen(cmd, env=env, cwd=settings.BASE_DIR)
            for name, cmd in procs.items()
        }
        self.stdout.write(f"Quartermaster is serving on http://{bind}/")
        if not no_demo:
            logins = ", ".join(u[0] for u in DEMO_USERS)
            self.stdout.write(f"demo logins: {logins} — password {DEMO_PASSWORD}")
        self.stdout.flush()

        stopping = False

        def stop(signum: int, frame: Any) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        code = 0
        while not stopping:
            for name, proc in children.items():
                if proc.poll() is not None:
                    self.stderr.write(f"{name} exited with {proc.returncode}; stopping")
                    stopping, code = True, 1
            time.sleep(0.5)
        for proc in children.values():
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 15
        for proc in children.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
        self.stdout.write("stopped")
        if code:
            sys.exit(code)
