from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.db import connection

from portal import pg
from portal.models import GpuRequest
from tests.base import make_world, submit

pytestmark = pytest.mark.django_db


def _timestamptz_loader() -> type:
    from psycopg.pq import Format

    with connection.cursor() as cur:
        loader: type = cur.cursor.adapters.get_loader(1184, Format.TEXT)
    return loader


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="PostgreSQL's loaders only")
def test_it_reads_timestamps_with_the_c_loader_and_the_same_values() -> None:
    assert pg.utc_loader() is not None  # psycopg[binary] is a dependency
    assert _timestamptz_loader().__name__ == "UtcTimestamptzLoader"
    w = make_world()
    req = submit(w.bob, w.vision)
    stored = [
        datetime(2026, 3, 29, 1, 30, 0, 500001, tzinfo=UTC),
        datetime(1969, 7, 20, 20, 17, 40, tzinfo=UTC),
        datetime(2026, 12, 1, 23, 59, 59, 999999, tzinfo=UTC),
        # another zone: stored as its instant, read back in UTC
        datetime(2026, 6, 1, 14, 0, tzinfo=timezone(timedelta(hours=2))),
    ]
    for value in stored:
        GpuRequest.objects.filter(pk=req.pk).update(estimated_start=value)
        read = GpuRequest.objects.values_list("estimated_start", flat=True).get(pk=req.pk)
        assert read == value
        assert read.tzinfo is UTC


def test_it_leaves_django_s_loader_when_the_session_is_not_in_utc() -> None:
    registered: list[object] = []

    class Adapters:
        def register_loader(self, *args: object) -> None:
            registered.append(args)

    class Raw:
        adapters = Adapters()

    class Paris:
        vendor = "postgresql"
        timezone_name = "Europe/Paris"
        connection = Raw()

    class Utc(Paris):
        timezone_name = "UTC"
        timezone = UTC

    pg.use_c_timestamps(None, Paris())
    assert registered == []
    pg.use_c_timestamps(None, Utc())
    assert len(registered) == 1
