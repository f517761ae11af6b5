"""A process that watches exits cleanly: its watching threads are stopped before the
interpreter finalizes.

A watching thread is a daemon thread that spends its life inside the Kubernetes client's
calls. One still running when the interpreter finalizes is killed with `pthread_exit` the
moment it next takes the GIL; the forced unwind cannot cross the client's compiled
argument validation (pydantic-core), and the whole process aborts with SIGABRT (exit 134)
after its work is done: a core dump for every worker that stops, and CI's suite run at the
lowest versions failed so. The real client talks to a local server here, one that holds
each watch open without an event, as an idle cluster does."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = textwrap.dedent(
    """
    import atexit, json, socket, sys, threading, time

    def report():  # registered first, so it runs after everything registered later
        alive = sorted(t.name for t in threading.enumerate() if t.name.startswith("qm-"))
        print("ALIVE", json.dumps(alive), flush=True)

    atexit.register(report)

    from kubernetes import client
    from portal.k8s.watch import WorkloadWatcher

    LISTS = {
        "/api/v1/nodes": "NodeList",
        "/api/v1/pods": "PodList",
    }
    watching = threading.Semaphore(0)

    def serve(conn):
        data = b""
        while b"\\r\\n\\r\\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return
            data += chunk
        path = data.split(b" ")[1].decode()
        if "watch=true" in path:
            conn.sendall(
                b"HTTP/1.1 200 OK\\r\\nContent-Type: application/json\\r\\n"
                b"Transfer-Encoding: chunked\\r\\n\\r\\n"
            )
            watching.release()
            while conn.recv(65536):  # held open, no event, until the client goes
                pass
            return
        kind = LISTS[path.split("?")[0]]
        body = json.dumps(
            {"kind": kind, "apiVersion": "v1", "metadata": {"resourceVersion": "7"}, "items": []}
        ).encode()
        conn.sendall(
            b"HTTP/1.1 200 OK\\r\\nContent-Type: application/json\\r\\n"
            + b"Content-Length: %d\\r\\n\\r\\n" % len(body)
            + body
        )
        serve(conn)  # keep-alive: the next request on the same connection

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)

    def accept():
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True, name="server").start()
    config = client.Configuration()
    config.host = "http://127.0.0.1:%d" % listener.getsockname()[1]
    core = client.CoreV1Api(client.ApiClient(config))
    watcher = WorkloadWatcher(core, None, (), inventory=True, timeout_s=3600)
    watcher.run(threading.Event())
    for _ in watcher.pairs():
        if not watching.acquire(timeout=30):
            sys.exit("the watches did not start")
    print("WATCHING", flush=True)
    """
)


def test_a_watching_process_stops_its_watches_when_it_exits() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )
    assert "WATCHING" in done.stdout, done.stderr
    assert "ALIVE []" in done.stdout, (done.stdout, done.stderr)
    assert done.returncode == 0, done.stderr
