"""Run the whole portal on one machine: migrate, seed the demo, then web + worker + beat."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, close_old_connections
from django.utils import timezone

from portal.demo.seed import DEMO_PASSWORD, DEMO_USERS
from portal.selectors.queue import activity


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
            env["DEMO_LOGINS"] = json.dumps(
                [
                    [name, "platform admin" if staff else f"{role} in {team}"]
                    for name, role, team, staff in DEMO_USERS
                ]
            )
            env["DEMO_PASSWORD"] = DEMO_PASSWORD
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
                # one worker on one machine: nobody to gossip or mingle with
                "--without-gossip",
                "--without-mingle",
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
        log_dir = settings.VAR_DIR / "log"
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / "portal.log"
        log = Log(log_path, self.stdout)
        shown_path = _shown(log_path)
        children = {
            name: Child(name, cmd, env, listener if name == "web" else None, log)
            for name, cmd in procs.items()
        }
        for child in children.values():
            child.start()
        self.stdout.write(f"Quartermaster is serving on http://{bind}/")
        if not no_demo:
            logins = ", ".join(u[0] for u in DEMO_USERS)
            self.stdout.write(f"demo logins: {logins} — password {DEMO_PASSWORD}")
        self.stdout.write(
            f"the full log is {shown_path}; here: warnings, errors and a line a minute. "
            "Ctrl-C stops it all."
        )
        self.stdout.flush()

        stopping = False

        def stop(signum: int, frame: Any) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        code = 0
        status = Status()
        next_status = time.monotonic() + STATUS_EVERY_S
        while not stopping:
            for child in children.values():
                if stopping or child.proc is None or child.proc.poll() is None:
                    continue
                returncode = child.proc.returncode
                if not child.may_restart():
                    log.say(
                        f"{child.name} exited with {returncode} {RESTARTS} times within "
                        f"{RESTART_WINDOW_S // 60} minutes; stopping (see {shown_path})"
                    )
                    stopping, code = True, 1
                    break
                log.say(f"{child.name} exited with {returncode}; restarting it (see {shown_path})")
                child.start()
            if time.monotonic() >= next_status and not stopping:
                log.say(status.line(shown_path))
                next_status = time.monotonic() + STATUS_EVERY_S
            time.sleep(0.5)
        for child in children.values():
            child.terminate()
        deadline = time.monotonic() + 15
        for child in children.values():
            child.wait(deadline)
        listener.close()
        log.close()
        self.stdout.write("stopped")
        if code:
            sys.exit(code)


#: how often the terminal gets a line of what the portal is doing
STATUS_EVERY_S = float(os.environ.get("QM_STATUS_EVERY_S", "60"))
#: a child that exits this many times within the window is not restarted again
RESTARTS = 5
RESTART_WINDOW_S = 300


class Log:
    """The full output of web, worker and beat in one file; the terminal gets only what a person
    running the portal needs: warnings, errors (a traceback as its last line) and notices."""

    def __init__(self, path: Path, terminal: Any) -> None:
        self.file = open(path, "a", buffering=1, encoding="utf-8", errors="replace")
        self.terminal = terminal
        self.lock = threading.Lock()

    def say(self, line: str) -> None:
        """A notice of `up` itself: on the terminal and in the file."""
        stamped = f"{time.strftime('%H:%M:%S')} {line}"
        with self.lock:
            self.file.write(f"up | {stamped}\n")
            self.terminal.write(stamped)
            self.terminal.flush()

    def follow(self, name: str, stream: IO[bytes]) -> None:
        """Copy a child's output to the file, and what matters of it to the terminal."""
        in_traceback = False
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            with self.lock:
                self.file.write(f"{name} | {line}\n")
                if line.startswith("Traceback (most recent call last)"):
                    in_traceback = True
                    continue
                if in_traceback:
                    if line.startswith((" ", "\t")) or not line.strip():
                        continue
                    in_traceback = False
                    self.terminal.write(f"{name} | {line} (traceback in the log)")
                    self.terminal.flush()
                    continue
                if worth_saying(line):
                    self.terminal.write(f"{name} | {line}")
                    self.terminal.flush()
        stream.close()

    def close(self) -> None:
        with self.lock:
            self.file.close()


_LEVEL = re.compile(r"\b(WARNING|ERROR|CRITICAL)\b|\[(WARNING|ERROR|CRITICAL)\]")


def worth_saying(line: str) -> bool:
    """A warning or error of Celery, gunicorn or Django; not an access log line or INFO."""
    return bool(_LEVEL.search(line[:120]))


class Child:
    """One of web, worker and beat: started, restarted when it dies, stopped at the end."""

    def __init__(
        self,
        name: str,
        cmd: list[str],
        env: dict[str, str],
        listener: socket.socket | None,
        log: Log,
    ) -> None:
        self.name, self.cmd, self.env, self.listener, self.log = name, cmd, env, listener, log
        self.proc: subprocess.Popen[bytes] | None = None
        self.exits: list[float] = []

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.cmd,
            env=self.env,
            cwd=settings.BASE_DIR,
            pass_fds=(self.listener.fileno(),) if self.listener else (),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        assert self.proc.stdout is not None
        threading.Thread(
            target=self.log.follow, args=(self.name, self.proc.stdout), daemon=True
        ).start()

    def may_restart(self) -> bool:
        now = time.monotonic()
        self.exits = [t for t in self.exits if now - t < RESTART_WINDOW_S] + [now]
        return len(self.exits) < RESTARTS

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()

    def wait(self, deadline: float) -> None:
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.kill()


class Status:
    """The line a minute: ticks, admissions and finishes since the last line, and the queue now."""

    def __init__(self) -> None:
        self.since = timezone.now()
        self.ticks = activity(self.since).ticks

    def line(self, log_path: str) -> str:
        try:
            now = activity(self.since)
        except DatabaseError as exc:
            return f"the database did not answer ({exc.__class__.__name__}); see {log_path}"
        finally:
            close_old_connections()
        since = timezone.localtime(self.since).strftime("%H:%M")
        ticks, self.ticks, self.since = now.ticks - self.ticks, now.ticks, timezone.now()
        return (
            f"since {since}: {ticks} ticks, {now.admitted} admitted, {now.finished} finished; "
            f"now {now.waiting} waiting, {now.running} running"
        )


def _shown(path: Path) -> str:
    """The log's path as a person would type it: relative to the checkout where it is inside."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


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
