"""The embedded default's Celery broker: kombu's filesystem transport, made safe to share.

kombu's own writer opens a message under its final name and then writes it, and its reader takes
any file with that name, so a reader could take a message before it was whole and the worker died
on the empty read (`Unrecoverable error: JSONDecodeError`). Here a message is written whole under
a temporary name outside the queue folder and renamed into it, which is atomic on one filesystem:
a reader sees a whole message or none. A message that still cannot be read (left by a crash, or by
an older writer) is moved to `broken/` beside the queue and the worker goes on.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from queue import Empty
from typing import Any, cast

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils import json as kombu_json

log = logging.getLogger(__name__)

# kombu's JSON (it knows the types Celery sends), typed
_dumps = cast(Callable[[Any], str], kombu_json.dumps)
_loads = cast(Callable[[str], Any], kombu_json.loads)

#: a table of exchange bindings read while another process rewrites it: try again this often
_TABLE_READS = 20


class Channel(filesystem.Channel):
    """Whole messages only, and a broken one is set aside rather than fatal."""

    @property
    def staging_folder(self) -> Path:
        """Where a message is written before it is renamed into the queue: a sibling of the
        queue folder, so the rename stays on one filesystem."""
        folder = Path(self.data_folder_out).parent / "tmp"
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    @property
    def taken_folder(self) -> Path:
        """Where a reader renames a message it takes (one filesystem, so the rename is atomic)."""
        folder = Path(self.data_folder_in).parent / "taken"
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    @property
    def broken_folder(self) -> Path:
        folder = Path(self.data_folder_in).parent / "broken"
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def _put(self, queue: Any, message: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        data = _dumps(message).encode()  # before anything touches the folders
        name = f"{round(time.monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        staged = self.staging_folder / name
        try:
            with open(staged, "wb") as f:
                f.write(data)
            os.replace(staged, Path(self.data_folder_out) / name)
        except OSError as exc:
            staged.unlink(missing_ok=True)
            raise ChannelError(f"Cannot add file {name!r} to directory") from exc

    def _get(self, queue: Any, timeout: Any = None) -> Any:
        wanted = f"{queue}.msg"
        folder = Path(self.data_folder_in)
        for filename in sorted(os.listdir(folder)):
            if filename.partition(".")[2] != wanted:
                continue
            taken = self.taken_folder / filename
            try:
                # a rename, not a copy: another worker that lists the same file loses the race
                os.replace(folder / filename, taken)
            except OSError:
                continue  # taken by another reader in the meantime
            try:
                payload = taken.read_bytes()
            except OSError as exc:
                raise ChannelError(f"Cannot read file {taken!s} from queue.") from exc
            try:
                message = _loads(payload.decode())
            except ValueError:
                shutil.move(str(taken), self.broken_folder / filename)
                log.warning(
                    "broker: message %s could not be read (%d bytes); moved to %s",
                    filename,
                    len(payload),
                    self.broken_folder,
                )
                continue
            if self.store_processed:
                shutil.move(str(taken), Path(self.processed_folder) / filename)
            else:
                taken.unlink(missing_ok=True)
            return message
        raise Empty()

    def get_table(self, exchange: str) -> Any:
        # kombu rewrites a table in place (truncate, then write), so a read can meet it empty
        read = cast(Callable[[str], Any], super().get_table)
        for _ in range(_TABLE_READS - 1):
            try:
                return read(exchange)
            except json.JSONDecodeError:
                time.sleep(0.01)
        return read(exchange)


class Transport(filesystem.Transport):
    Channel = Channel
