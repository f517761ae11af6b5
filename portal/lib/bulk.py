"""Bulk writes for the tick: many rows in a fixed number of statements, no model objects.

At 10,000 waiting requests a tick writes tens of thousands of rows (decisions,
attempts, allocations, usage, simulated workloads). Building a model instance per row
and Django's bulk_create / bulk_update compilers took most of the tick, so on
PostgreSQL rows go in with COPY and updates with one UPDATE ... FROM (VALUES ...) per
batch. Elsewhere (SQLite in development and tests) the same calls use Django's bulk
methods, so both paths write the same rows.

Rows are plain dicts keyed by attribute name (``team_id``, not ``team``); fields a row
leaves out take the field's default, and ``auto_now``/``auto_now_add`` fields the time
of the call. Every statement, COPY included, passes through the connection's execute
wrappers, so query counters see it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from datetime import datetime
from json import encoder as json_encoder
from operator import itemgetter
from typing import Any, cast

from django.db import connection, models, transaction
from django.utils import timezone
from psycopg.abc import Buffer
from psycopg.adapt import Dumper, PyFormat

#: rows per statement (PostgreSQL takes at most 65,535 parameters per statement)
BATCH = 2000


def _fields(model: type[models.Model]) -> list[models.Field[Any, Any]]:
    return [f for f in model._meta.concrete_fields if not f.primary_key]


def _concrete_field(model: type[models.Model], name: str) -> models.Field[Any, Any]:
    # `bulk_set` writes columns: its names are of concrete fields, never relations' reverse
    # sides or generic foreign keys.
    return cast("models.Field[Any, Any]", model._meta.get_field(name))


def _defaults(fields: list[models.Field[Any, Any]]) -> dict[str, Any]:
    now = timezone.now()
    return {
        f.attname: now
        if getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False)
        # the model's own default: what a model instance would have been given
        else f.get_default()
        for f in fields
    }


def _json_encoder() -> Callable[[Any], str]:
    """`json.dumps` with its defaults, its C encoder made once.

    `json.dumps` makes a new encoder for every call, half its time on a small dict; a
    tick serializes one dict per decision row (100,000 at 100,000 pending).
    """
    make = getattr(json_encoder, "c_make_encoder", None)
    if make is None:  # no C accelerator (another Python than CPython)
        return json.dumps
    defaults = json.JSONEncoder()
    # No circular check (the marker dict): rows hold plain data.
    encode = make(
        None,
        defaults.default,
        json_encoder.encode_basestring_ascii,
        None,
        defaults.key_separator,
        defaults.item_separator,
        False,
        False,
        True,
    )
    join = "".join

    def dumps(value: Any) -> str:
        return join(encode(value, 0))

    return dumps


#: JSON text as `json.dumps` writes it, faster
json_dumps = _json_encoder()


class RowMaker:
    """A model's rows as `insert_rows` sends them: on PostgreSQL a tuple in column order,
    JSON serialized (what COPY takes); elsewhere the dict with the defaults merged in.

    On PostgreSQL every row one maker makes has the same time in its ``auto_now`` fields
    (elsewhere bulk_create stamps its own). Rows can be made ahead, e.g. while the server
    runs an UPDATE (`bulk_set_sent`).
    """

    def __init__(self, model: type[models.Model], **fixed: Any) -> None:
        """`fixed`: values every row takes unless it names its own (the tick's number...)."""
        fields = _fields(model)
        self.defaults = {**_defaults(fields), **fixed}
        self.postgres = connection.vendor == "postgresql"
        self.attnames = attnames = [f.attname for f in fields]
        self.single = len(attnames) == 1
        self.json_at = [i for i, f in enumerate(fields) if isinstance(f, models.JSONField)]
        # The merge and the getter run in C: a tick makes tens of thousands of rows.
        self.get = itemgetter(*attnames)

    def __call__(self, row: dict[str, Any]) -> Row:
        merged = {**self.defaults, **row}
        if not self.postgres:
            return merged
        out = self.get(merged)
        if self.single:
            out = (out,)
        if self.json_at:
            out = list(out)
            for i in self.json_at:
                out[i] = json_dumps(out[i])
            out = tuple(out)
        return out  # type: ignore[no-any-return]

    def positional(self, *names: str, same_json: bool = False) -> Callable[..., Row]:
        """A maker of rows from the values of `names`, in that order, the rest defaults:
        what calling the maker with ``dict(zip(names, values))`` makes, without the dicts
        (a tick makes a row per waiting request).

        `same_json`: a JSON column's value given again (the same object, unchanged since)
        is serialized once: the maker keeps each until it goes."""
        given = {name: i for i, name in enumerate(names)}
        if len(given) != len(names) or not given.keys() <= set(self.attnames):
            raise ValueError(f"not the model's columns, once each: {names}")
        if not self.postgres:

            def as_dict(*values: Any) -> Row:
                return {**self.defaults, **dict(zip(names, values, strict=True))}

            return as_dict
        if self.single:
            raise ValueError("a model of one column: call the maker")
        width = len(self.attnames)
        json_names = [self.attnames[i] for i in self.json_at]
        # The row is picked out of (defaults..., values..., named JSON serialized...).
        base = tuple(
            json_dumps(self.defaults[a]) if a in json_names else self.defaults[a]
            for a in self.attnames
        )
        dumped = [given[a] for a in json_names if a in given]
        slot = {
            a: width + len(names) + k for k, a in enumerate(a for a in json_names if a in given)
        }
        pick = itemgetter(
            *(
                slot[a] if a in slot else width + given[a] if a in given else i
                for i, a in enumerate(self.attnames)
            )
        )
        if not dumped:

            def plain(*values: Any) -> Row:
                return pick(base + values)  # type: ignore[no-any-return]

            return plain
        if len(dumped) == 1:
            (at,) = dumped
            if same_json:
                texts: dict[int, tuple[Any, str]] = {}

                def with_same_json(*values: Any) -> Row:
                    value = values[at]
                    text = texts.get(id(value))
                    if text is None:
                        text = texts[id(value)] = (value, json_dumps(value))
                    return pick(base + values + (text[1],))  # type: ignore[no-any-return]

                return with_same_json

            def with_json(*values: Any) -> Row:
                return pick(base + values + (json_dumps(values[at]),))  # type: ignore[no-any-return]

            return with_json

        def with_jsons(*values: Any) -> Row:
            return pick(base + values + tuple(json_dumps(values[i]) for i in dumped))  # type: ignore[no-any-return]

        return with_jsons


#: a row to insert: a dict keyed by attribute name, or what a `RowMaker` made of one
Row = dict[str, Any] | tuple[Any, ...]


def insert_rows(
    model: type[models.Model],
    rows: Sequence[Row],
    *,
    ids: bool = False,
    pks: Sequence[int] | None = None,
    ignore_conflicts: bool = False,
) -> list[int]:
    """Insert `rows`; returns their new primary keys in order when `ids` is set.

    `pks`: the rows' primary keys, already drawn from the table's sequence (PostgreSQL:
    `nextval` in the statement that claimed them), returned as with `ids`.
    `ignore_conflicts`: rows that would break a unique constraint are left out (as
    bulk_create's option), not `ids`.
    """
    assert not ((ids or pks is not None) and ignore_conflicts)
    if not rows:
        return []
    make = RowMaker(model)
    if connection.vendor != "postgresql":
        # (a maker made dicts here: only PostgreSQL makes tuples)
        dict_rows = cast(Sequence[dict[str, Any]], rows)
        dicts = cast(list[dict[str, Any]], [make(row) for row in dict_rows])
        if pks is not None:
            assert len(pks) == len(rows)
            pk_field = model._meta.pk
            assert pk_field is not None
            pk_name = pk_field.attname
            dicts = [{**row, pk_name: key} for key, row in zip(pks, dicts, strict=True)]
            ids = True
        objs = [model(**row) for row in dicts]
        model._default_manager.bulk_create(objs, batch_size=500, ignore_conflicts=ignore_conflicts)
        return [o.pk for o in objs] if ids else []
    pk = model._meta.pk
    assert pk is not None
    fields = _fields(model)
    names = [f.column for f in fields]
    # (on PostgreSQL a maker makes tuples)
    values = cast(
        list[Sequence[Any]], [row if isinstance(row, tuple) else make(row) for row in rows]
    )
    new_ids: list[int] = []
    with connection.cursor() as cur:
        if pks is not None:
            assert len(pks) == len(rows)
            new_ids = list(pks)
            names = [pk.column, *names]
            values = [[i, *v] for i, v in zip(new_ids, values, strict=True)]
        elif ids:
            # Keys drawn from the table's own sequence: COPY returns nothing.
            cur.execute(
                "SELECT nextval(pg_get_serial_sequence(%s, %s)) FROM generate_series(1, %s)",
                [model._meta.db_table, pk.column, len(rows)],
            )
            new_ids = [r[0] for r in cur.fetchall()]
            names = [pk.column, *names]
            values = [[i, *v] for i, v in zip(new_ids, values, strict=True)]
        if not ignore_conflicts:
            _copy(cur, model._meta.db_table, names, values)
            return new_ids
        # COPY has no ON CONFLICT: the rows go through a scratch table.
        quote = connection.ops.quote_name
        scratch = f"qm_bulk_insert_{model._meta.db_table}"
        typed = ", ".join(f"{quote(f.column)} {f.db_type(connection)}" for f in fields)
        columns = ", ".join(quote(n) for n in names)
        with transaction.atomic():
            cur.execute(f"CREATE TEMPORARY TABLE {quote(scratch)} ({typed}) ON COMMIT DROP")
            _copy(cur, scratch, names, values)
            cur.execute(
                f"INSERT INTO {quote(model._meta.db_table)} ({columns}) "
                f"SELECT {columns} FROM {quote(scratch)} ON CONFLICT DO NOTHING"
            )
            cur.execute(f"DROP TABLE {quote(scratch)}")
    return new_ids


class _SameTimeDumper(Dumper):
    """psycopg's timestamp dumper, remembering what it made for each value.

    A tick's rows repeat a few times (its `now`, the ``auto_now`` fields' time) hundreds
    of thousands of times, and formatting a timestamp costs psycopg about 1 µs against
    0.1 for a dictionary lookup. One per COPY (the cursor's), so the memory goes with it.
    """

    plain: type[Dumper]

    def __init__(self, cls: type, context: Any = None) -> None:
        super().__init__(cls, context)
        self._dumper = self.plain(cls, context)
        self.oid = self._dumper.oid
        self._made: dict[datetime, Buffer | None] = {}

    def dump(self, obj: Any) -> Buffer | None:
        made = self._made.get(obj)
        if made is None:
            made = self._made[obj] = self._dumper.dump(obj)
        return made


def _copy(cur: Any, table: str, columns: list[str], rows: Sequence[Sequence[Any]]) -> None:
    """COPY `rows` into `table`, through the execute wrappers (they count statements)."""
    quote = connection.ops.quote_name
    sql = f"COPY {quote(table)} ({', '.join(quote(c) for c in columns)}) FROM STDIN"
    adapters = cur.cursor.adapters  # the cursor's own: registering here changes no other
    same_time = type(
        "SameTimeDumper",
        (_SameTimeDumper,),
        {"plain": adapters.get_dumper(datetime, PyFormat.TEXT)},
    )
    adapters.register_dumper(datetime, same_time)

    def copy(sql: str, params: Any, many: bool, context: Any) -> None:
        # As Django's cursor does for execute(): psycopg's errors become Django's.
        with connection.wrap_database_errors, cur.cursor.copy(sql) as out:
            for row in rows:
                out.write_row(row)

    cur._execute_with_wrappers(sql, None, False, executor=copy)


def bulk_set(
    model: type[models.Model],
    fields: Sequence[str],
    rows: Sequence[tuple[Any, ...]],
    *,
    only_if: Mapping[str, Any] | None = None,
    returning: str = "",
    untracked: bool = False,
) -> list[tuple[Any, ...]]:
    """Set `fields` row by row: `rows` are (pk, value, ...) in the order of `fields`.

    On PostgreSQL a scratch table and one UPDATE ... FROM; elsewhere Django's bulk_update
    (whose CASE WHEN per row and field was most of the apply step at 10,000 waiting
    requests). PostgreSQL only: `only_if` (column -> value) leaves rows that no longer
    match alone (a claim: the UPDATE waits for, then re-reads, rows another transaction
    changed), and `returning` (SQL over the updated row ``t``) is returned for each row
    updated; `untracked`: the rows keep the transaction that last changed them
    (`changed_xact`, migration 0032): for a writer that keeps what it wrote itself.
    """
    with bulk_set_sent(
        model, fields, rows, only_if=only_if, returning=returning, untracked=untracked
    ) as done:
        return done()


#: while on, an UPDATE leaves `changed_xact` as it was (the trigger of migration 0032);
#: for this transaction only
_UNTRACKED = "SELECT set_config('portal.untracked_write', %s, true)"


@contextmanager
def bulk_set_sent(
    model: type[models.Model],
    fields: Sequence[str],
    rows: Sequence[tuple[Any, ...]],
    *,
    only_if: Mapping[str, Any] | None = None,
    returning: str = "",
    untracked: bool = False,
) -> Iterator[Callable[[], list[tuple[Any, ...]]]]:
    """`bulk_set`, with the UPDATE left running on the server while the block runs.

    Yields `done`, which waits for the UPDATE and returns what `bulk_set` would (called
    on leaving the block if the block did not). On PostgreSQL the UPDATE is sent in
    pipeline mode, so the server writes the rows while Python goes on: until `done()` the
    block must not use the database (COPY, for one, is refused in a pipeline). Elsewhere
    the UPDATE has run before the block starts.
    """
    if not rows:
        yield lambda: []
        return
    if connection.vendor != "postgresql":
        if only_if or returning:
            raise NotImplementedError("only_if and returning need PostgreSQL")
        objs = [model(pk=row[0], **dict(zip(fields, row[1:], strict=True))) for row in rows]
        model._default_manager.bulk_update(objs, list(fields), batch_size=500)
        yield lambda: []
        return
    meta = model._meta
    assert meta.pk is not None
    columns = [meta.pk, *(_concrete_field(model, f) for f in fields)]
    quote = connection.ops.quote_name
    names = [quote(c.column) for c in columns]
    # COPY into a scratch table, then one UPDATE joins it: a fixed number of statements
    # whatever the number of rows, and no parameter lists to build or parse.
    scratch = f"qm_bulk_set_{meta.db_table}"
    typed = ", ".join(f"{n} {c.db_type(connection)}" for n, c in zip(names, columns, strict=True))
    conditions = [f"t.{names[0]} = v.{names[0]}"]
    params: list[Any] = []
    for name, value in (only_if or {}).items():
        conditions.append(f"t.{quote(_concrete_field(model, name).column)} = %s")
        params.append(value)
    update = (
        f"UPDATE {quote(meta.db_table)} AS t SET "
        + ", ".join(f"{n} = v.{n}" for n in names[1:])
        + f" FROM {quote(scratch)} AS v WHERE "
        + " AND ".join(conditions)
        + (f" RETURNING {returning}" if returning else "")
    )
    # atomic: outside a transaction ON COMMIT DROP would drop the table at once.
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(f"CREATE TEMPORARY TABLE {quote(scratch)} ({typed}) ON COMMIT DROP")
        _copy(cur, scratch, [c.column for c in columns], [list(r) for r in rows])
        if untracked:
            cur.execute(_UNTRACKED, ["on"])
        with ExitStack() as pipeline:
            pipeline.enter_context(connection.connection.pipeline())
            cur.execute(update, params or None)
            out: list[list[tuple[Any, ...]]] = []

            def done() -> list[tuple[Any, ...]]:
                if not out:
                    # The server's errors surface here: as Django's, as execute() raises them.
                    with connection.wrap_database_errors:
                        out.append([tuple(r) for r in cur.fetchall()] if returning else [])
                        pipeline.close()  # leaves pipeline mode: the UPDATE has finished
                    if untracked:
                        cur.execute(_UNTRACKED, ["off"])
                return out[0]

            yield done
            done()
        cur.execute(f"DROP TABLE {quote(scratch)}")
