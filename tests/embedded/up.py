"""Run `manage.py up` (what `./scripts/run` runs) in a subprocess for a test, on its own var/."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, timeout: float = 15) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except OSError:
        return 0, ""


@dataclass
class Portal:
    proc: subprocess.Popen[bytes]
    url: str
    var: Path
    out: Path

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def log(self) -> str:
        path = self.var / "log" / "portal.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def query(self, sql: str) -> int:
        with sqlite3.connect(self.var / "quartermaster.sqlite3", timeout=30) as conn:
            return int(conn.execute(sql).fetchone()[0])

    def wait_until_serving(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if get(f"{self.url}/healthz")[0] == 200:
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.5)
        raise AssertionError(f"not serving:\n{self.output()[-3000:]}")

    def children(self, *words: str) -> list[int]:
        """Pids of `up`'s direct children whose command line holds every word."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == self.proc.pid and all(w in cmdline for w in words):
                found.append(int(entry.name))
        return found


@contextmanager
def running_portal(tmp_path: Path, **env_vars: str) -> Iterator[Portal]:
    port = free_port()
    env = {
        k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "SQLITE_PATH")
    }
    env.update(QM_VAR_DIR=str(tmp_path / "var"), **env_vars)
    out = tmp_path / "up.out"
    with open(out, "wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "up", "--bind", f"127.0.0.1:{port}"],
            cwd=ROOT,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    portal = Portal(proc, f"http://127.0.0.1:{port}", tmp_path / "var", out)
    try:
        yield portal
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
