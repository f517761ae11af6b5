"""PostgreSQL connection setup: timestamps read by psycopg's C loader.

Django registers a pure-Python loader for ``timestamptz`` (it parses the text, then sets
the connection's time zone). A tick's snapshot reads about 28,000 timestamps at
10,000 pending requests, and that loader took a quarter of the read. When the session
runs in UTC, as Django sets it with ``USE_TZ``, psycopg's C loader already returns
datetimes in ``datetime.timezone.utc``, the same values Django's would; this module puts
it in place on each new connection. Elsewhere (another session time zone, psycopg
without its C extension, SQLite) nothing changes.
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from django.db.backends.signals import connection_created

if TYPE_CHECKING:
    from psycopg.abc import Loader as AnyLoader


def _c_loader() -> type[AnyLoader] | None:
    try:
        import psycopg
        from psycopg import postgres
        from psycopg.pq import Format
    except ImportError:
        return None
    if psycopg.pq.__impl__ == "python":
        return None
    return postgres.adapters.get_loader(postgres.types["timestamptz"].oid, Format.TEXT)


def utc_loader() -> type[AnyLoader] | None:
    """A loader class for ``timestamptz`` that parses in C; None without psycopg's C part."""
    found = _c_loader()
    if found is None:
        return None
    c_loader: type[AnyLoader] = found
    from psycopg.adapt import Loader

    class UtcTimestamptzLoader(Loader):
        # Django's cursor compares this with the connection's zone and, when they
        # differ, puts its own loader back.
        timezone = datetime.UTC

        def __init__(self, oid: int, context: Any = None) -> None:
            super().__init__(oid, context)
            # The C class cannot be subclassed: delegate to an instance of it.
            self._load = c_loader(oid, context).load

        def load(self, data: Any) -> Any:
            return self._load(data)

    return UtcTimestamptzLoader


_LOADER = utc_loader()


def use_c_timestamps(sender: Any, connection: Any, **kwargs: Any) -> None:
    if _LOADER is None or connection.vendor != "postgresql":
        return
    if connection.timezone_name != "UTC" or connection.timezone != datetime.UTC:
        return
    connection.connection.adapters.register_loader("timestamptz", _LOADER)


def connect_signals() -> None:
    connection_created.connect(use_c_timestamps, dispatch_uid="portal.pg.use_c_timestamps")
