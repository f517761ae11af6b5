"""The tick's snapshot: the database read into frozen `scheduling.types` data.

Plus a `Context` that lets the apply step find rows again from snapshot ids.
Reads only: the preview builds it outside the tick lock, so nothing here may write
(member rules are the core's, `scheduling.members`; the apply step writes).

Rows are read as tuples of the columns the core needs (`values_list`), never as model
instances: at 10,000 pending requests and 8,000 devices building model objects took
most of the tick. One query per table; shapes and tolerations are shared between
requests that have the same ones.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Q, QuerySet, TextField
from django.db.models.functions import Cast

from portal.lib import shapes
from portal.models import (
    Allocation,
    Attempt,
    Device,
    GpuRequest,
    Membership,
    Node,
    Pool,
    Quota,
    ShapeHistory,
    Team,
    UsageRecord,
    WorkloadClass,
    heartbeat_stale_before,
)
from portal.services import autoscale
from portal.tick import waits
from scheduling import types as st
from scheduling import usage_decay, workload

#: an allocation row's values in this order: read here, written by the apply step
ALLOCATION_FIELDS = (
    "attempt_id",
    "device_id",
    "slot",
    "milli",
    "gpu_memory_mib",
    "mig_profile",
    "mig_start",
    "mig_size",
)


def _ms(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


@dataclass(slots=True)
class QueuedRow:
    """A pending request as the apply step needs it: ids and the status last written."""

    pk: int
    team_id: int
    workload_class_id: int
    submitted_by_id: int
    status_code: str
    status_message: str
    queue_position: int | None
    escalated: bool
    estimated_start: datetime | None
    gpus_milli: int
    #: why its queue position last moved (`portal.tick.apply.position_notes`)
    position_note: str = ""
    created_at: datetime | None = None
    #: where its wait went so far (portal/tick/waits.py)
    wait: waits.WaitState | None = None


@dataclass(frozen=True, slots=True)
class DeviceRow:
    """A device as the apply step needs it to book slots (see `portal.tick.apply._slots`)."""

    pk: int
    partitioning: str
    replicas: int


@dataclass
class Context:
    """What the apply step needs to find rows again from snapshot ids."""

    now: datetime
    requests: dict[str, QueuedRow]
    devices: dict[tuple[str, int], DeviceRow]
    active_slots: dict[int, set[str]]
    pools: dict[str, Pool]
    teams: dict[int, tuple[str, str]]  # pk -> (name, namespace)
    #: the scheduling profile the tick runs: its name and version go on every decision
    profile_name: str = ""
    profile_version: int | None = None
    #: the policy version in force (`PolicyVersion`): every decision records it
    policy_version: int | None = None
    #: pending request ids that nodes are being added for (portal/services/autoscale.py)
    provisioning: set[str] = field(default_factory=set)


@dataclass
class _Rows:
    """One query's rows as the tick last read them (PostgreSQL), by id, in order: as of
    `snapshot`, the snapshot of the statement that read them ("": read them all)."""

    rows: dict[int, tuple[Any, ...]] = field(default_factory=dict)
    order: list[int] = field(default_factory=list)
    snapshot: str = ""


@dataclass
class _Kept:
    """The last snapshot's pending requests and running attempts with the rows (and the
    names) they were built from. A row read again unchanged keeps its frozen object: at
    100,000 pending most rows are the same from tick to tick, and building the objects
    was half of reading them. Keyed by content, so never stale; the tick's, one per
    worker process (a preview in a web process keeps none: each web worker would hold a
    copy of the queue), replaced whole by each read (a read in another thread only finds
    fewer objects to keep).

    On PostgreSQL the tick's also keeps the rows themselves (the pending requests', the
    running attempts' and the active allocations') and reads only those written since
    (`_read_rows`)."""

    #: read only what changed since the last read (the tick's; a preview reads all)
    incremental: bool = False
    #: the pending requests' rows (`_pending_rows`)
    pending_rows: _Rows = field(default_factory=_Rows)
    #: the last tick whose status writes the kept statuses hold (`_pending_rows`)
    tick: int = 0
    #: the status objects the last tick's apply step was handed, by id (it writes the
    #: waiting requests' new status into them, untracked: `_pending_rows`)
    pending_statuses: dict[int, QueuedRow] = field(default_factory=dict)
    #: the running attempts' rows (`_running`)
    running_rows: _Rows = field(default_factory=_Rows)
    #: the active allocations' rows (`_nodes`)
    allocation_rows: _Rows = field(default_factory=_Rows)
    #: what the objects depend on besides their rows: names by id, pools' tolerations
    pending_context: tuple[Any, ...] = ()
    pending: dict[int, tuple[tuple[Any, ...], st.PendingRequest]] = field(default_factory=dict)
    running_context: tuple[Any, ...] = ()
    running: dict[
        int, tuple[tuple[Any, ...], dict[tuple[str, int, int], st.DeviceGrant], st.Running]
    ] = field(default_factory=dict)

    def reads_changes(self) -> bool:
        """Whether this read may read only the rows written since the last one."""
        return self.incremental and connection.vendor == "postgresql"


_KEPT = _Kept(incremental=True)


def _device_healthy(quarantined: bool, healthy: bool, agent_healthy: bool) -> bool:
    """Not a fault of the device itself (DEVICE_FAULTS in `Device.condition`, the one rule).

    Its node's faults (stale, not ready, cordoned) go on the snapshot's node instead.
    """
    return not quarantined and healthy and agent_healthy


def build_snapshot(
    now: datetime, policy: st.Policy | None = None, keep: bool = False, tick_no: int = 0
) -> tuple[st.Snapshot, Context]:
    """The snapshot the core schedules; `policy` is the one it will run (its usage
    half-life decays the team usage here). `keep`: reuse and keep the process's objects
    of the last read (`_Kept`): the tick's; a preview in a web process keeps none.
    `tick_no`: the tick's number, read under its lock; a read in any other tick than
    the next one after this process's last (another worker process ticked in between)
    reads the pending rows whole. 0: a read outside a tick (a test, a benchmark), which
    takes the kept rows as they are."""
    kept = _KEPT if keep else _Kept()
    policy = policy or st.Policy()
    pools = {p.name: p for p in Pool.objects.all()}
    pool_names = {p.pk: p.name for p in pools.values()}
    teams = {
        pk: (name, namespace, weight)
        for pk, name, namespace, weight in Team.objects.values_list(
            "pk", "name", "namespace", "weight"
        )
    }
    class_rows = list(WorkloadClass.objects.all())
    class_names = {c.pk: c.name for c in class_rows}
    incremental = kept.reads_changes()
    nodes, devices, active_slots, held_grants = _nodes(
        now, pool_names, kept if incremental else None
    )
    running = _running(held_grants, teams, class_names, pool_names, kept)
    pending, queued = _pending(now, pools, teams, class_names, kept, tick_no)
    snapshot = st.Snapshot(
        now_ms=_ms(now),
        pools=tuple(
            st.Pool(
                p.name,
                st.Partitioning(p.partitioning),
                st.Lifecycle(p.lifecycle),
                p.inference_floor_milli,
            )
            for p in pools.values()
        ),
        nodes=nodes,
        running=running,
        pending=pending,
        teams=tuple(st.Team(name, weight) for name, _, weight in teams.values()),
        quotas=tuple(
            st.Quota(teams[team_id][0], pool_names[pool_id], nominal, borrowing, lending)
            # a retired team's quota leaves the cohort: its guarantee is free to lend, and its
            # running work counts as borrowed until it ends
            for team_id, pool_id, nominal, borrowing, lending in Quota.objects.filter(
                team__retired_at=None
            )
            .order_by("team__name", "pool__name")
            .values_list(
                "team_id",
                "pool_id",
                "nominal_milli",
                "borrowing_limit_milli",
                "lending_limit_milli",
            )
        ),
        classes=tuple(
            st.WorkloadClass(
                c.name,
                c.band,
                st.PreemptionPolicy(c.preemption),
                c.min_runtime_s,
                c.max_queue_s,
                c.inference,
            )
            for c in class_rows
        ),
        usage=tuple(_usage(now, teams, policy.usage_half_life_s)),
        members=_members({q.team_id for q in queued.values()}),
        workloads=_workloads(policy.shape_half_life_s),
        growth=autoscale.growth(pools.values(), nodes),
    )
    ctx = Context(
        now=now,
        requests=queued,
        devices=devices,
        active_slots=active_slots,
        pools=pools,
        teams={pk: (name, namespace) for pk, (name, namespace, _) in teams.items()},
        provisioning=autoscale.provisioning_for(pools.values()),
    )
    return snapshot, ctx


def _nodes(
    now: datetime, pool_names: dict[int, str], kept: _Kept | None = None
) -> tuple[
    tuple[st.Node, ...],
    dict[tuple[str, int], DeviceRow],
    dict[int, set[str]],
    dict[int, dict[tuple[str, int, int], st.DeviceGrant]],
]:
    """Nodes with their devices, and the active allocations (slots per device, grants per
    attempt). `kept`: the tick's, whose allocation rows are read since (`_read_rows`)."""
    stale_before = heartbeat_stale_before(now)
    node_rows = list(
        Node.objects.order_by("name").values_list(
            "pk",
            "name",
            "pool_id",
            "cpu_milli",
            "memory_mib",
            "labels",
            "taints",
            "ready",
            "cordoned",
            "interconnect",
            "last_heartbeat",
        )
    )
    node_names = {row[0]: row[1] for row in node_rows}
    held_grants: dict[int, dict[tuple[str, int, int], st.DeviceGrant]] = defaultdict(dict)
    active_slots: dict[int, set[str]] = defaultdict(set)
    # The two JSON columns come as text: thousands of devices share a few MIG layouts
    # (decoded once each), and only a device with processes needs its list decoded.
    device_rows = list(
        Device.objects.order_by("node_id", "index")
        .annotate(
            mig_text=Cast("mig_instances", TextField()),
            processes_text=Cast("processes", TextField()),
        )
        .values_list(
            "pk",
            "node_id",
            "index",
            "model",
            "memory_mib",
            "partitioning",
            "replicas",
            "mig_text",
            "healthy",
            "agent_healthy",
            "quarantined",
            "processes_text",
        )
    )
    where = {pk: (node_names.get(node_id, ""), index) for pk, node_id, index, *_ in device_rows}
    read, _ = _read_rows(
        kept.allocation_rows if kept is not None else None,
        Allocation.objects.order_by().values_list("pk", *ALLOCATION_FIELDS, "active"),
        Q(active=True),
        (_unseen("portal_allocation"),),
        lambda row: row[-1],
        lambda row: row[0],
    )
    if kept is not None:
        keeping = kept

        def commit() -> None:
            keeping.allocation_rows = read

        _keep_on_commit(commit, kept.allocation_rows)
    rows = read.rows
    for _, attempt_id, device_id, slot, milli, memory, mig_profile, mig_start, mig_size, _ in (
        rows[pk] for pk in read.order
    ):
        active_slots[device_id].add(slot)
        node, idx = where.get(device_id, ("", -1))
        grants = held_grants[attempt_id]
        if (node, idx, mig_start) in grants:
            continue
        mig = st.MigInstance(mig_profile, mig_start, mig_size) if mig_profile else None
        grants[(node, idx, mig_start)] = st.DeviceGrant(
            node, idx, milli if mig is None else 0, memory, mig
        )
    # Devices that run a process the portal did not place there: not free, whatever the
    # books say. Held devices are the portal's own.
    devices_by_node: dict[int, list[st.Device]] = defaultdict(list)
    devices: dict[tuple[str, int], DeviceRow] = {}
    mig_layouts: dict[str, tuple[st.MigInstance, ...]] = {}
    # Devices are frozen values, and thousands alike (index, model, layout, health): one
    # object each, as the MIG layouts.
    alike: dict[tuple[Any, ...], st.Device] = {}
    for (
        pk,
        node_id,
        index,
        model,
        memory_mib,
        partitioning,
        replicas,
        mig_instances,
        healthy,
        agent_healthy,
        quarantined,
        processes,
    ) in device_rows:
        migs = mig_layouts.get(mig_instances)
        if migs is None:
            migs = mig_layouts[mig_instances] = tuple(
                st.MigInstance(m["profile"], int(m["start"]), int(m["size"]))
                for m in json.loads(mig_instances)
            )
        usable = _device_healthy(quarantined, healthy, agent_healthy) and (
            pk in active_slots or processes == "[]" or not json.loads(processes)
        )
        same = (index, model, memory_mib, partitioning, replicas, mig_instances, usable)
        device = alike.get(same)
        if device is None:
            device = alike[same] = st.Device(
                index=index,
                model=model,
                memory_mib=memory_mib,
                partitioning=st.Partitioning(partitioning),
                replicas=replicas,
                mig_instances=migs,
                healthy=usable,
            )
        devices_by_node[node_id].append(device)
        devices[(node_names.get(node_id, ""), index)] = DeviceRow(pk, partitioning, replicas)
    taints_seen: dict[str, tuple[st.Taint, ...]] = {}
    nodes = []
    for (
        pk,
        name,
        pool_id,
        cpu_milli,
        memory_mib,
        labels,
        taints,
        ready,
        cordoned,
        interconnect,
        last_heartbeat,
    ) in node_rows:
        stale = last_heartbeat is not None and last_heartbeat < stale_before
        key = repr(taints)
        node_taints = taints_seen.get(key)
        if node_taints is None:
            node_taints = taints_seen[key] = shapes.taints(taints)
        nodes.append(
            st.Node(
                name=name,
                pool=pool_names[pool_id],
                cpu_milli=cpu_milli,
                memory_mib=memory_mib,
                devices=tuple(devices_by_node[pk]),
                labels=tuple(sorted((k, str(v)) for k, v in labels.items())),
                taints=node_taints,
                ready=ready and not stale,
                cordoned=cordoned,
                interconnect=interconnect,
            )
        )
    return tuple(nodes), devices, active_slots, held_grants


class _Shapes:
    """One `Shape` per distinct set of shape fields: requests share them (they are frozen)."""

    def __init__(self) -> None:
        self._seen: dict[tuple[Any, ...], st.Shape] = {}
        self._scoped: dict[tuple[Any, ...], st.Shape] = {}

    def get(self, fields: tuple[Any, ...], tolerations: tuple[st.Taint, ...] = ()) -> st.Shape:
        key = (fields, tolerations)
        shape = self._seen.get(key)
        if shape is None:
            kind, mig_profile, milli, memory, count, pods, cpu, mem, request_kind = fields
            shape = self._seen[key] = shapes.shape_build(
                profile_kind=kind,
                mig_profile=mig_profile,
                milli=milli,
                gpu_memory_mib=memory,
                count=count,
                pods=pods,
                cpu_milli=cpu,
                memory_mib=mem,
                tolerations=tolerations,
                kind=request_kind,
            )
        return shape

    def in_pool(
        self, fields: tuple[Any, ...], pool_id: int | None, tolerations: tuple[st.Taint, ...]
    ) -> st.Shape:
        """`get`, with the tolerations that `pool_id` (None: all pools) gives: looked up by
        the pool's id, not by hashing its taints again for every request."""
        key = (fields, pool_id)
        shape = self._scoped.get(key)
        if shape is None:
            shape = self._scoped[key] = self.get(fields, tolerations)
        return shape


def _pending(
    now: datetime,
    pools: dict[str, Pool],
    teams: dict[int, tuple[str, str, int]],
    class_names: dict[int, str],
    kept: _Kept,
    tick_no: int = 0,
) -> tuple[tuple[st.PendingRequest, ...], dict[str, QueuedRow]]:
    pool_names = {p.pk: p.name for p in pools.values()}
    # What a request tolerates depends only on its pool (or on all pools): once per pool.
    tolerations: dict[int | None, tuple[st.Taint, ...]] = {
        p.pk: shapes.tolerations([p]) for p in pools.values()
    }
    tolerations[None] = shapes.tolerations(pools.values())
    shape_of = _Shapes()
    pending: list[st.PendingRequest] = []
    queued: dict[str, QueuedRow] = {}
    read = _pending_rows(now, kept, tick_no)
    # Once per pending request (100,000 of them): lookups hoisted, helpers inlined.
    team_names = {pk: name for pk, (name, _, _) in teams.items()}
    pool_of: dict[int | None, str] = {pk: name for pk, name in pool_names.items()}
    pool_of[None] = ""
    context = (team_names, class_names, pool_of, tolerations)
    reuse = kept.pending if kept.pending_context == context else {}
    keep: dict[int, tuple[tuple[Any, ...], st.PendingRequest]] = {}
    # The status the last tick wrote for the rows not read again: its apply step wrote
    # them untracked and left them in these objects.
    statuses = read.statuses
    fresh: dict[int, QueuedRow] = {}
    request = st.PendingRequest
    queued_row = QueuedRow
    wait_state = waits.WaitState
    shape_get = shape_of.in_pool
    append = pending.append
    shape_end = _PENDING_KEY
    for row in read.rows:
        pk = row[0]
        status = statuses.get(pk)
        status_code = row[shape_end] if status is None else status.status_code
        # the room its victims free is kept for it (scheduling.queue.request_key)
        preempting = status_code in ("preempting", "awaiting-stop")
        found = reuse.get(pk)
        if (
            found is not None
            and (found[0] is row or found[0][:shape_end] == row[:shape_end])
            and found[1].preempting == preempting
        ):
            req = found[1]
        else:
            (
                _,
                team_id,
                class_id,
                pool_id,
                user_id,
                created_at,
                priority,
                requeue_count,
                estimated_runtime_s,
                max_runtime_s,
            ) = row[:_PENDING_SHAPE]
            # EASY backfill: the submitter's estimate, never past the hard limit
            # (`_expected_runtime_s`, inlined)
            if estimated_runtime_s and max_runtime_s:
                runtime_s: int | None = min(estimated_runtime_s, max_runtime_s)
            else:
                runtime_s = estimated_runtime_s or max_runtime_s or None
            req = request(
                id=str(pk),
                team=team_names[team_id],
                workload_class=class_names[class_id],
                shape=shape_get(row[_PENDING_SHAPE:shape_end], pool_id, tolerations[pool_id]),
                created_at_ms=int(created_at.timestamp() * 1000),
                pool=pool_of[pool_id],
                priority=priority,
                attempts=requeue_count,
                preempting=preempting,
                expected_runtime_ms=None if runtime_s is None else runtime_s * 1000,
                user=str(user_id),
            )
        keep[pk] = (row, req)
        append(req)
        if status is None:
            (
                _,
                status_message,
                queue_position,
                escalated,
                estimated_start,
                position_note,
                wait_reason,
                wait_since,
                *waited,
            ) = row[shape_end:-2]
            status = queued_row(
                pk,
                row[1],
                row[2],
                row[4],
                status_code,
                status_message,
                queue_position,
                escalated,
                estimated_start,
                req.shape.gpus_milli,
                position_note,
                row[5],
                wait_state(wait_reason, wait_since, tuple(waited)),
            )
        fresh[pk] = status
        queued[req.id] = status
    kept.pending, kept.pending_context = keep, context
    read.keep(fresh)
    return tuple(pending), queued


#: a waiting request's status, as the apply step compares and writes it (`QueuedRow`)
WAIT_FIELDS = (
    "status_code",
    "status_message",
    "queue_position",
    "escalated",
    "estimated_start",
    "position_note",
    *waits.COLUMNS,
)

#: a pending request's columns: what its `PendingRequest` is built from (up to
#: `_PENDING_KEY`; the status code says whether it preempts), then the status the apply
#: step compares with, then its state and when it may be queued again
_PENDING_COLUMNS = (
    "pk",
    "team_id",
    "workload_class_id",
    "pool_id",
    "submitted_by_id",
    "created_at",
    "priority",
    "requeue_count",
    "estimated_runtime_s",
    "max_runtime_s",
    *shapes.SHAPE_FIELDS,
    *WAIT_FIELDS,
    "state",
    "requeue_at",
)
#: where the pending row's shape fields start, and where its `PendingRequest`'s columns end
_PENDING_SHAPE = 10
_PENDING_KEY = _PENDING_SHAPE + len(shapes.SHAPE_FIELDS)

#: the rows written by transactions the last read could not see (committed since, or
#: still open then: `changed_xact`, set by a trigger, migration 0032) and, in the same
#: statement, its snapshot and how many rows are wanted in it. At least one row comes back.
_CHANGED_SQL = """
SELECT now_.snapshot, now_.wanted, changed.*
FROM (
    SELECT pg_current_snapshot()::text AS snapshot, ({count}) AS wanted
) now_
LEFT JOIN ({changed}) changed ON true
"""


def _unseen(table: str, ids: str = "t.id", join: str = "") -> str:
    """SQL: the ids (`ids`, of the query's table) of the rows of `table` (as ``t``,
    `join`ed to whatever gives `ids`) written by a transaction that the snapshot (a
    parameter, given twice) could not see. By `changed_xact`'s index: every such
    transaction is at or past the snapshot's xmin."""
    return (
        f"SELECT {ids} FROM {table} t {join} WHERE t.changed_xact >= pg_snapshot_xmin(%s::pg_snapshot)"
        " AND NOT pg_visible_in_snapshot(t.changed_xact, %s::pg_snapshot)"
    )


def _read_rows(
    kept: _Rows | None,
    query: QuerySet[Any, tuple[Any, ...]],
    wanted: Q,
    changed: tuple[str, ...],
    is_wanted: Callable[[tuple[Any, ...]], bool],
    order_key: Callable[[tuple[Any, ...]], Any],
) -> tuple[_Rows, set[int] | None]:
    """The rows of `query` (a `values_list` led by the id, in no order) that `wanted`
    selects, by id and in `order_key`'s order; and the ids read anew (None: all).

    With `kept` (the tick's, PostgreSQL) only the rows written since `kept.snapshot` are
    read (`changed`: queries of their ids, `_unseen`, for the query's own table and each
    it reads columns from), in one statement with its snapshot (the next read's bound: a
    row committed while this one ran is read again next time, never missed) and the
    count of wanted rows. A row read again that
    is no longer wanted (`is_wanted`, on its values) is dropped; a deleted row does not
    come back, so when the count differs from the rows kept everything is read again.
    Returns new objects: `kept` is left as it was.
    """
    rows: dict[int, tuple[Any, ...]] | None = None
    order: list[int] | None = None
    reread: set[int] | None = None
    snapshot = ""
    if kept is not None and kept.snapshot:
        table = query.model._meta.db_table
        unseen = f"{table}.id IN ({' UNION '.join(changed)})"
        changed_sql, params = query.extra(
            where=[unseen], params=[kept.snapshot] * (2 * len(changed))
        ).query.sql_with_params()
        wanted_sql, count_params = (
            query.model._default_manager.filter(wanted).order_by().values("pk").query
        ).sql_with_params()
        count_sql = f"SELECT count(*) FROM ({wanted_sql}) wanted"
        with connection.cursor() as cursor:
            cursor.execute(
                _CHANGED_SQL.format(count=count_sql, changed=changed_sql),
                [*count_params, *params],
            )
            found = cursor.fetchall()
        snapshot, count = found[0][0], found[0][1]
        rows, order, reread = dict(kept.rows), kept.order, set()
        if _xmax(snapshot) < _xmax(kept.snapshot):
            # transaction ids went back: another server (a restored backup) answers now
            count = -1
        for row in found:
            row = row[2:]
            pk = row[0]
            if pk is None:  # nothing changed
                continue
            reread.add(pk)
            old = rows.pop(pk, None)
            if is_wanted(row):
                rows[pk] = row
                if old is None or order_key(old) != order_key(row):
                    order = None
            elif old is not None:
                order = None
        if len(rows) != count:
            rows = None
    if rows is None:
        if kept is not None:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_current_snapshot()::text")
                snapshot = cursor.fetchone()[0]
        # read after the snapshot is taken: what commits in between is read again next time
        rows = {row[0]: row for row in query.filter(wanted)}
        order, reread = None, None
    if order is None:
        ordered = rows
        order = sorted(rows, key=lambda pk: order_key(ordered[pk]))
    return _Rows(rows, order, snapshot), reread


def _xmax(snapshot: str) -> int:
    """A `pg_snapshot`'s xmax: the first transaction id it had not yet seen."""
    return int(snapshot.split(":")[1])


def _keep_on_commit(keep: Callable[[], None], *clear: _Rows) -> None:
    """Keep a read once the tick's transaction commits: a tick rolled back keeps nothing
    (its apply step wrote into objects the database never got), so `clear` is read
    whole next time."""
    for rows in clear:
        rows.snapshot = ""
    transaction.on_commit(keep)


@dataclass
class _PendingRead:
    """The pending rows of one read, in the queue's order, and what to keep of it."""

    rows: list[tuple[Any, ...]]
    #: the status objects of the rows not read again, by id (see `_Kept`)
    statuses: dict[int, QueuedRow]
    #: keep the read, given the status objects handed to the apply step
    keep: Callable[[dict[int, QueuedRow]], None]


def _pending_rows(now: datetime, kept: _Kept, tick_no: int = 0) -> _PendingRead:
    """The pending requests' rows in the queue's order, those waiting to be requeued
    later left out (`_read_rows`: on PostgreSQL the tick reads only those written since).

    The tick's apply step writes the waiting requests' status untracked (the trigger of
    migration 0032 leaves their `changed_xact`) into the status objects it was handed
    (`QueuedRow`): those are kept for the rows not read again, once the tick commits.
    Only this process's ticks are in them: when another process ran the last tick
    (`tick_no` is not the next after `kept.tick`), its untracked writes are not, and the
    rows are read whole.
    """
    state = GpuRequest.State.PENDING
    incremental = kept.reads_changes()
    if tick_no and kept.tick != tick_no - 1:
        kept.pending_rows.snapshot = ""
    read, reread = _read_rows(
        kept.pending_rows if incremental else None,
        # in no order: they are sorted here, where the kept ones are
        GpuRequest.objects.order_by().values_list(*_PENDING_COLUMNS),
        Q(state=state),
        (_unseen("portal_gpurequest"),),
        lambda row: row[-2] == state,
        lambda row: (row[5], row[0]),
    )
    statuses: dict[int, QueuedRow] = {}
    if reread is not None:
        statuses = {pk: s for pk, s in kept.pending_statuses.items() if pk not in reread}
    rows = read.rows

    def keep(handed: dict[int, QueuedRow]) -> None:
        if not incremental:
            return

        def commit() -> None:
            kept.pending_rows = read
            kept.pending_statuses = {**statuses, **handed}
            if tick_no:
                kept.tick = tick_no

        _keep_on_commit(commit, kept.pending_rows)

    queued = (rows[pk] for pk in read.order)
    return _PendingRead(
        [row for row in queued if row[-1] is None or row[-1] <= now], statuses, keep
    )


def _workloads(half_life_s: int) -> tuple[st.PoolWorkload, ...]:
    """Each pool's shape history: FGD's target workload (a pool without one: its prior),
    decayed with the active profile's half-life."""
    return tuple(
        workload.ShapeHistory.from_dict(histogram, half_life_s=half_life_s).to_workload(pool)
        for pool, histogram in ShapeHistory.objects.order_by("pool__name").values_list(
            "pool__name", "histogram"
        )
    )


def _members(team_ids: set[int]) -> tuple[st.Member, ...]:
    """Members of the teams with pending requests, with their caps: the core applies them."""
    return tuple(
        st.Member(team, str(user_id), cap)
        for team, user_id, cap in Membership.objects.filter(team_id__in=team_ids)
        .order_by("team__name", "user_id")
        .values_list("team__name", "user_id", "gpu_cap_milli")
    )


def _running(
    held_grants: dict[int, dict[tuple[str, int, int], st.DeviceGrant]],
    teams: dict[int, tuple[str, str, int]],
    class_names: dict[int, str],
    pool_names: dict[int, str],
    kept: _Kept,
) -> tuple[st.Running, ...]:
    shape_of = _Shapes()
    running: list[st.Running] = []
    incremental = kept.reads_changes()
    active = Attempt.ACTIVE_STATES
    # in no order: sorted by `_read_rows`, as the kept ones are
    query = Attempt.objects.order_by().values_list(
        "pk",
        "state",
        "pool_id",
        "started_at",
        "admitted_at",
        "last_checkpoint_at",
        "admitted_by_preemption",
        "request_id",
        "request__team_id",
        "request__workload_class_id",
        "request__priority",
        "request__submitted_by_id",
        "request__estimated_runtime_s",
        "request__max_runtime_s",
        *(f"request__{f}" for f in shapes.SHAPE_FIELDS),
        "number",
    )
    # An attempt's row changes with its request's (the columns it reads from there).
    read, _ = _read_rows(
        kept.running_rows if incremental else None,
        query,
        Q(state__in=active),
        (
            _unseen("portal_attempt"),
            _unseen("portal_gpurequest", "a.id", "JOIN portal_attempt a ON a.request_id = t.id"),
        ),
        lambda row: row[1] in active,
        lambda row: (row[7], row[-1]),
    )
    if incremental:

        def commit() -> None:
            kept.running_rows = read

        _keep_on_commit(commit, kept.running_rows)
    rows = (read.rows[pk] for pk in read.order)
    # Once per running attempt: lookups hoisted, helpers inlined.
    team_names = {pk: name for pk, (name, _, _) in teams.items()}
    context = (team_names, class_names, pool_names)
    reuse = kept.running if kept.running_context == context else {}
    keep: dict[
        int, tuple[tuple[Any, ...], dict[tuple[str, int, int], st.DeviceGrant], st.Running]
    ] = {}
    no_grants: dict[tuple[str, int, int], st.DeviceGrant] = {}
    stopping_state = Attempt.State.STOPPING
    append = running.append
    for row in rows:
        pk = row[0]
        grants = held_grants.get(pk, no_grants)
        found = reuse.get(pk)
        if found is not None and (found[0] is row or found[0] == row) and found[1] == grants:
            keep[pk] = found
            append(found[2])
            continue
        (
            _,
            state,
            pool_id,
            started_at,
            admitted_at,
            last_checkpoint_at,
            admitted_by_preemption,
            request_id,
            team_id,
            class_id,
            priority,
            user_id,
            estimated_runtime_s,
            max_runtime_s,
            *fields,
            _,
        ) = row
        cpu_milli, memory_mib = fields[6], fields[7]
        if len(grants) == 1:
            # Most attempts hold one device (or slice): one pod, nothing to sort.
            (((node, _, _), grant),) = grants.items()
            placement = st.Placement((st.PodPlacement(node, (grant,), cpu_milli, memory_mib),))
        else:
            per_node: dict[str, list[st.DeviceGrant]] = defaultdict(list)
            for (node, _, _), g in sorted(grants.items()):
                per_node[node].append(g)
            placement = st.Placement(
                tuple(
                    st.PodPlacement(n, tuple(gs), cpu_milli, memory_mib)
                    for n, gs in sorted(per_node.items())
                )
            )
        # Expected end for reservations (EASY backfilling), as for pending requests
        # (`_expected_runtime_s`, inlined).
        if estimated_runtime_s and max_runtime_s:
            runtime_s: int | None = min(estimated_runtime_s, max_runtime_s)
        else:
            runtime_s = estimated_runtime_s or max_runtime_s or None
        begun = int((started_at or admitted_at).timestamp() * 1000)
        run = st.Running(
            request_id=str(request_id),
            attempt_id=str(pk),
            team=team_names[team_id],
            workload_class=class_names[class_id],
            pool=pool_names[pool_id],
            shape=shape_of.get(tuple(fields)),
            placement=placement,
            started_at_ms=begun,
            last_checkpoint_ms=int(last_checkpoint_at.timestamp() * 1000)
            if last_checkpoint_at
            else None,
            priority=priority,
            stopping=state == stopping_state,
            admitted_by_preemption=admitted_by_preemption,
            expected_end_ms=begun + runtime_s * 1000 if runtime_s is not None else None,
            user=str(user_id),
        )
        keep[pk] = (row, grants, run)
        append(run)
    kept.running, kept.running_context = keep, context
    return tuple(running)


def _expected_runtime_s(estimated_runtime_s: int | None, max_runtime_s: int | None) -> int | None:
    """The user's runtime estimate, never past the hard limit when one is set; None (the
    rules without estimates) when neither is set."""
    limits = [s for s in (estimated_runtime_s, max_runtime_s) if s]
    return min(limits) if limits else None


def _ms_or_none(seconds: int | None) -> int | None:
    return None if seconds is None else seconds * 1000


def _usage(
    now: datetime, teams: dict[int, tuple[str, str, int]], half_life: int
) -> list[st.TeamUsage]:
    """GPU milli-seconds per team, each record decayed by the profile's half-life."""
    now_ms = _ms(now)
    horizon = now - timedelta(seconds=half_life * 8)
    totals: dict[str, int] = defaultdict(int)
    records = UsageRecord.objects.filter(charged=True).filter(
        Q(ended_at__isnull=True) | Q(ended_at__gte=horizon)
    )
    for team_id, gpus_milli, started_at, ended_at in records.values_list(
        "team_id", "gpus_milli", "started_at", "ended_at"
    ):
        end_ms = _ms(ended_at) if ended_at else now_ms
        totals[teams[team_id][0]] += usage_decay.interval_usage(
            gpus_milli, _ms(started_at), end_ms, now_ms, half_life
        )
    return [st.TeamUsage(team, v) for team, v in sorted(totals.items())]
