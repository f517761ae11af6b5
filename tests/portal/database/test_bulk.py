from __future__ import annotations

import datetime as dt
import json

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from portal.lib.bulk import RowMaker, bulk_set, bulk_set_sent, insert_rows, json_dumps
from portal.models import Decision, Team

pytestmark = pytest.mark.django_db
postgres_only = pytest.mark.skipif(
    "connection.vendor != 'postgresql'", reason="pipeline mode and RETURNING: PostgreSQL"
)


def _teams(n: int) -> list[Team]:
    return [Team.objects.create(name=f"t{i}", namespace=f"ns-{i}", weight=1) for i in range(n)]


@postgres_only
def test_the_update_runs_while_the_block_computes_and_done_waits_for_its_rows() -> None:
    from psycopg import pq

    a, b, c = _teams(3)
    with bulk_set_sent(
        Team,
        ("weight",),
        [(a.pk, 5), (b.pk, 7)],
        only_if={"max_pending": 0},
        returning="t.id, t.weight",
    ) as done:
        # sent, not waited for: the connection is still in pipeline mode
        assert connection.connection.pgconn.pipeline_status == pq.PipelineStatus.ON
        rows = done()
        assert connection.connection.pgconn.pipeline_status == pq.PipelineStatus.OFF
    assert sorted(rows) == [(a.pk, 5), (b.pk, 7)]
    assert done() == rows  # asked again: the same rows, no second wait
    weights = dict(Team.objects.values_list("pk", "weight"))
    assert weights == {a.pk: 5, b.pk: 7, c.pk: 1}
    # the scratch table is gone: the same call works again in this transaction
    assert bulk_set(Team, ("weight",), [(c.pk, 2)], returning="t.weight") == [(2,)]


def test_a_block_that_never_asks_still_waits_on_leaving() -> None:
    (a,) = _teams(1)
    with bulk_set_sent(Team, ("weight",), [(a.pk, 3)]):
        pass
    assert Team.objects.get(pk=a.pk).weight == 3


@postgres_only
def test_rows_that_no_longer_match_are_left_alone() -> None:
    a, b = _teams(2)
    Team.objects.filter(pk=b.pk).update(max_pending=4)
    rows = bulk_set(
        Team, ("weight",), [(a.pk, 9), (b.pk, 9)], only_if={"max_pending": 0}, returning="t.id"
    )
    assert rows == [(a.pk,)]
    assert Team.objects.get(pk=b.pk).weight == 1


@postgres_only
def test_a_failing_update_raises_and_writes_nothing() -> None:
    a, b = _teams(2)
    with pytest.raises(IntegrityError), transaction.atomic():
        # the second row would give both teams one name: the UPDATE fails on the server
        bulk_set(Team, ("name",), [(a.pk, "same"), (b.pk, "same")])
    # the connection left pipeline mode and is usable; nothing was written
    assert sorted(Team.objects.values_list("name", flat=True)) == ["t0", "t1"]


@pytest.mark.skipif("connection.vendor == 'postgresql'", reason="the path without a pipeline")
def test_elsewhere_the_update_has_run_before_the_block() -> None:
    (a,) = _teams(1)
    with bulk_set_sent(Team, ("weight",), [(a.pk, 4)]) as done:
        assert Team.objects.get(pk=a.pk).weight == 4
        assert done() == []
    assert Team.objects.get(pk=a.pk).weight == 4


def test_rows_made_ahead_go_in_with_plain_ones_and_share_the_maker_s_time() -> None:
    make = RowMaker(Team)
    ahead = [make({"name": f"a{i}", "namespace": f"ns-a{i}"}) for i in range(2)]
    insert_rows(Team, [*ahead, {"name": "plain", "namespace": "ns-plain", "weight": 3}])
    teams = {t.name: t for t in Team.objects.all()}
    assert sorted(teams) == ["a0", "a1", "plain"]
    if connection.vendor == "postgresql":  # elsewhere bulk_create stamps its own time
        assert teams["a0"].created_at == teams["a1"].created_at  # one maker, one time
    assert (teams["a0"].weight, teams["plain"].weight) == (1, 3)  # defaults merged in


def test_positional_rows_are_the_rows_the_dicts_make() -> None:
    fields = ("request_id", "team_id", "kind", "code", "message", "facts")
    make = RowMaker(Decision, tick=7, profile_name="shipped")
    row = make.positional(*fields)
    values = [
        (1, 2, "wait", "no-capacity", "waiting: no room", {"position": 3, "why": ["a", 1.5]}),
        (4, 5, "reject", "too-large", "rejected", {}),
    ]
    assert [row(*v) for v in values] == [make(dict(zip(fields, v, strict=True))) for v in values]
    # the same facts object given again: serialized once, the same rows
    shared = {"position": 1}
    again = make.positional(*fields, same_json=True)
    alike = [(i, 2, "wait", "c", "m", shared) for i in range(3)] + [(9, 2, "wait", "c", "m", {})]
    assert [again(*v) for v in alike] == [make(dict(zip(fields, v, strict=True))) for v in alike]
    # a name the model lacks, or named twice: refused when the maker is made
    with pytest.raises(ValueError):
        make.positional("request_id", "nope")
    with pytest.raises(ValueError):
        make.positional("request_id", "request_id")
    insert_rows(Decision, [row(*v) for v in values])
    stored = list(
        Decision.objects.order_by("request_id").values_list("tick", "profile_name", "facts")
    )
    assert stored == [(7, "shipped", values[0][5]), (7, "shipped", {})]


def test_json_is_written_as_json_dumps_writes_it() -> None:
    for value in ({"a": 1, "b": [1, 2.5, None, True], "c": 'é"\n'}, [], {}, "x", 3, None, {1: 2}):
        assert json_dumps(value) == json.dumps(value)


@postgres_only
def test_repeated_and_distinct_times_are_written_as_given() -> None:
    # COPY formats each distinct time once (bulk._SameTimeDumper): repeats, another zone
    # and microseconds all come back as the instants they were, in inserts and updates.
    now = timezone.now().replace(microsecond=123456)
    plus2 = dt.timezone(dt.timedelta(hours=2))
    times = [now, now, now + dt.timedelta(microseconds=1), now.astimezone(plus2), now]
    insert_rows(
        Decision,
        [
            {"request_id": i, "kind": "wait", "code": "c", "message": "m", "created_at": t}
            for i, t in enumerate(times)
        ],
    )
    got = list(Decision.objects.order_by("request_id").values_list("created_at", flat=True))
    assert got == times
    teams = _teams(3)
    later = now + dt.timedelta(days=1)
    bulk_set(Team, ("created_at",), [(t.pk, later) for t in teams[:2]] + [(teams[2].pk, now)])
    assert sorted(Team.objects.values_list("created_at", flat=True)) == [now, later, later]
