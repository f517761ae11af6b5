"""The embedded default's broker: a message is never read before it is whole.

kombu's filesystem transport opens a message file under its final name, locks it, then writes;
the reader renames and reads it without the lock, so a busy machine read empty messages and the
worker died with `Unrecoverable error: JSONDecodeError`.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection
from kombu.utils.json import register_type

pytestmark = pytest.mark.slow

MESSAGES = 3000
WRITERS = 3


def _options(folder: Path) -> dict[str, Any]:
    for sub in ("in", "processed", "control", "tmp"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    return {
        "data_folder_in": str(folder / "in"),
        "data_folder_out": str(folder / "in"),
        "data_folder_processed": str(folder / "processed"),
        "store_processed": False,
        "control_folder": str(folder / "control"),
        "polling_interval": 0.01,
    }


def _connection(transport: str, folder: Path) -> Connection:
    return Connection("filesystem://", transport=transport, transport_options=_options(folder))


def _write(transport: str, folder: str, writer: int, count: int) -> None:
    # a payload large enough that a write is not one page: the race has room to show
    body = {"writer": writer, "pad": "x" * 20_000}
    with _connection(transport, Path(folder)) as conn:
        queue = conn.SimpleQueue("race")
        for n in range(count):
            queue.put({**body, "n": n})
        queue.close()


def _drain(transport: str, folder: Path) -> tuple[set[tuple[int, int]], int]:
    """Read until every message arrived (or 120 s): (what arrived, how many reads failed)."""
    seen: set[tuple[int, int]] = set()
    failures = 0
    writers = [
        multiprocessing.get_context("spawn").Process(
            target=_write, args=(transport, str(folder), w, MESSAGES // WRITERS)
        )
        for w in range(WRITERS)
    ]
    for proc in writers:
        proc.start()
    deadline = time.monotonic() + 120
    with _connection(transport, folder) as conn:
        queue = conn.SimpleQueue("race")
        while len(seen) < MESSAGES and time.monotonic() < deadline:
            try:
                message = queue.get(timeout=1)
            except queue.Empty:
                if not any(p.is_alive() for p in writers):
                    break
                continue
            except ValueError:  # the JSONDecodeError that killed the worker
                failures += 1
                continue
            seen.add((message.payload["writer"], message.payload["n"]))
            message.ack()
        queue.close()
    for proc in writers:
        proc.join(timeout=30)
    return seen, failures


def test_every_message_arrives_whole_under_concurrent_writers(tmp_path: Path) -> None:
    seen, failures = _drain("portal.lib.broker:Transport", tmp_path)
    assert failures == 0
    assert len(seen) == MESSAGES


class _Gate:
    """A message header whose serialisation waits: the writer is caught in the middle of a put."""

    entered = threading.Event()
    release = threading.Event()


def _encode_gate(gate: _Gate) -> str:
    gate.entered.set()
    gate.release.wait(10)
    return "gate"


register_type(_Gate, "qm-test-gate", _encode_gate, lambda value: value)


@pytest.mark.parametrize("transport", ["portal.lib.broker:Transport"])
def test_a_reader_never_meets_a_message_being_written(tmp_path: Path, transport: str) -> None:
    """The race made deterministic. kombu's own transport (`filesystem` here) fails it with the
    worker's JSONDecodeError: its writer has created the message file when the payload is
    serialised. (Each test has its own queue name: kombu keeps bindings per process.)"""
    _Gate.entered.clear()
    _Gate.release.clear()
    with (
        _connection(transport, tmp_path) as reader_conn,
        _connection(transport, tmp_path) as writer_conn,
    ):
        reader = reader_conn.SimpleQueue("gate")
        writer = writer_conn.SimpleQueue("gate")
        put = threading.Thread(
            target=writer.put, args=({"n": 1},), kwargs={"headers": {"g": _Gate()}}
        )
        put.start()
        assert _Gate.entered.wait(10)
        try:
            with pytest.raises(reader.Empty):
                reader.get(timeout=0.5)
        finally:
            _Gate.release.set()
            put.join(10)
        message = reader.get(timeout=5)
        assert message.payload == {"n": 1}
        message.ack()
        reader.close()
        writer.close()


def test_a_truncated_message_is_set_aside_not_fatal(tmp_path: Path) -> None:
    """A message left half-written by a crash is moved aside and the queue goes on."""
    folder = tmp_path
    with _connection("portal.lib.broker:Transport", folder) as conn:
        queue = conn.SimpleQueue("broken")
        queue.put({"n": 1})
        broken = folder / "in" / f"{int(time.monotonic() * 1000) - 10_000}_x.broken.msg"
        broken.write_bytes(b'{"body": "trunc')
        message = queue.get(timeout=5)
        assert message.payload == {"n": 1}
        message.ack()
        queue.close()
    assert not broken.exists()
    assert list((folder / "broken").iterdir())
    assert os.listdir(folder / "in") == []
