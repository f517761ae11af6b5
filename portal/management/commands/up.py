"""Run the whole portal on one machine: migrate, seed the demo, then web + worker + beat."""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from portal.demo.seed import DEMO_PASSWORD, DEMO_USERS


class Command(BaseCommand):
    help = (
        "Migrate, seed the demo and run web (gunicorn), a Celery worker and beat until interrupted."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--bind",
            default="127.0.0.1:8000",
            help="HOST:PORT to serve on (default 127.0.0.1:8000); 0.0.0.0:PORT for every interface",
        )
        parser.add_argument(
            "--no-demo", action="store_true", help="do not seed demo data or trickle requests"
        )

    def handle(self, *args: Any, bind: str, no_demo: bool, **options: Any) -> None:
        # Bind first: a taken port is said at once, before anything starts or is printed.
        listener = bind_listener(bind)
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
                # the socket bound above, inherited as file descriptor N
                "--bind",
                f"fd://{listener.fileno()}",
                "--workers",
                "2",
                *control_socket_args(listener),
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
            name: subprocess.Popen(
                cmd,
                env=env,
                cwd=settings.BASE_DIR,
                pass_fds=(listener.fileno(),) if name == "web" else (),
            )
            for name, cmd in procs.items()
        }
        listener.close()  # gunicorn holds it now
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


def bind_listener(bind: str) -> socket.socket:
    """A listening socket on HOST:PORT, or a CommandError that says what to do."""
    host, sep, port_text = bind.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) < 65536:
        raise CommandError(f"--bind {bind}: give HOST:PORT, e.g. --bind 127.0.0.1:8000")
    port = int(port_text)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise CommandError(f"--bind {bind}: cannot resolve {host}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise CommandError(
                f"cannot serve on http://{bind}/: port {port} is in use (another Quartermaster "
                f"or another server). Stop it, or choose another port: "
                f"./scripts/run --bind {host}:{port + 1}"
            ) from None
        raise CommandError(f"cannot serve on http://{bind}/: {exc.strerror}") from None
    sock.set_inheritable(True)
    return sock


def control_socket_args(listener: socket.socket) -> list[str]:
    """Gunicorn's control socket for this instance alone (its default, ~/.gunicorn/gunicorn.ctl,
    is shared by every instance on the machine, so two of them clobbered each other's)."""
    from gunicorn.config import KNOWN_SETTINGS

    if not any(s.name == "control_socket" for s in KNOWN_SETTINGS):
        return []  # a gunicorn without a control socket
    port = listener.getsockname()[1]
    name = f"gunicorn-{port}-{os.getpid()}.ctl"
    path = str(settings.VAR_DIR / name)
    if len(path) > 100:  # a Unix socket path has at most 107 bytes
        path = os.path.join(tempfile.gettempdir(), name)
    return ["--control-socket", path]
