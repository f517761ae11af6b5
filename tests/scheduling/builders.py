"""Small builders for scheduling tests: `req(team="a", gpus=2)`, `node("n1", gpus=8)` …

Quantities are in the units people think in (whole GPUs, seconds) and converted to
the core's integers here, so that a test reads like the scenario it describes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from scheduling.types import (
    Decision,
    DecisionKind,
    Device,
    DeviceGrant,
    Lifecycle,
    Node,
    Partitioning,
    PendingRequest,
    Placement,
    PodPlacement,
    Policy,
    Pool,
    PreemptionPolicy,
    ProfileKind,
    Quota,
    Running,
    Shape,
    Snapshot,
    Taint,
    Team,
    TeamUsage,
    WorkloadClass,
)

S = 1000  # one second in ms
NOW = 1_000_000 * S

CLASSES = (
    WorkloadClass(
        "inference", band=300, preemption=PreemptionPolicy.NEVER, max_queue_s=600, inference=True
    ),
    WorkloadClass(
        "interactive", band=200, preemption=PreemptionPolicy.WHEN_BORROWING, max_queue_s=3600
    ),
    WorkloadClass("training", band=100, preemption=PreemptionPolicy.ALWAYS, max_queue_s=86400),
)


def rules(**knobs: object) -> Policy:
    """`Policy()` without the production's patience (`preempt_after_s`), preemption rate and
    victim-loss caps, so that each rule shows on its own; `knobs` override."""
    base: dict[str, object] = {
        "preempt_after_s": 0,
        "max_preemptions_per_tick": 8,
        "max_victim_loss_gpu_s": 0,
        "victim_loss_per_gpu_s": 0,
    }
    return Policy(**{**base, **knobs})  # type: ignore[arg-type]


def node(
    name: str = "n1",
    pool: str = "a100",
    gpus: int = 8,
    model: str = "A100",
    cpu: int = 64,
    memory_gib: int = 512,
    partitioning: Partitioning = Partitioning.EXCLUSIVE,
    **kw: object,
) -> Node:
    devices = tuple(
        Device(i, model, 80 * 1024, partitioning, replicas=4 if partitioning != "exclusive" else 1)
        for i in range(gpus)
    )
    return Node(name, pool, cpu * 1000, memory_gib * 1024, devices, **kw)  # type: ignore[arg-type]


def pool(
    name: str = "a100",
    floor: float = 0,
    lifecycle: Lifecycle = Lifecycle.PRODUCTION,
    partitioning: Partitioning = Partitioning.EXCLUSIVE,
) -> Pool:
    return Pool(name, partitioning, lifecycle, int(floor * 1000))


def shape(
    gpus: int = 1,
    milli: int = 1000,
    pods: int = 1,
    cpu: int = 0,
    memory_gib: int = 0,
    tolerations: tuple[Taint, ...] = (),
) -> Shape:
    kind = ProfileKind.SHARED if milli < 1000 else ProfileKind.WHOLE
    return Shape(
        kind=kind,
        count=gpus,
        milli=milli,
        pods=pods,
        cpu_milli=cpu * 1000,
        memory_mib=memory_gib * 1024,
        tolerations=tolerations,
    )


def req(
    id: str = "",
    team: str = "a",
    gpus: int = 1,
    cls: str = "training",
    pool: str = "",
    created_s: int = 0,
    milli: int = 1000,
    pods: int = 1,
    priority: int = 0,
    not_before_s: int = 0,
    cpu: int = 0,
    memory_gib: int = 0,
    preempting: bool = False,
    tolerations: tuple[Taint, ...] = (),
) -> PendingRequest:
    """A pending request created `created_s` seconds before NOW."""
    return PendingRequest(
        id=id or f"{team}-{cls}-{gpus}x{pods}-{created_s}",
        team=team,
        workload_class=cls,
        shape=shape(gpus, milli, pods, cpu, memory_gib, tolerations),
        created_at_ms=NOW - created_s * S,
        pool=pool,
        priority=priority,
        not_before_ms=NOW + not_before_s * S if not_before_s else 0,
        preempting=preempting,
    )


def run(
    id: str,
    team: str = "a",
    node: str = "n1",
    devices: Sequence[int] = (0,),
    cls: str = "training",
    pool: str = "a100",
    age_s: int = 3600,
    checkpoint_age_s: int | None = None,
    milli: int = 1000,
    stopping: bool = False,
    by_preemption: bool = False,
) -> Running:
    """A running attempt on `devices` of `node`, started `age_s` seconds before NOW."""
    grants = tuple(DeviceGrant(node, d, milli) for d in devices)
    return Running(
        request_id=id,
        attempt_id=f"{id}#1",
        team=team,
        workload_class=cls,
        pool=pool,
        shape=shape(len(devices), milli),
        placement=Placement((PodPlacement(node, grants),)),
        started_at_ms=NOW - age_s * S,
        last_checkpoint_ms=None if checkpoint_age_s is None else NOW - checkpoint_age_s * S,
        stopping=stopping,
        admitted_by_preemption=by_preemption,
    )


def quota(
    team: str,
    nominal: float,
    pool: str = "a100",
    borrow: float | None = None,
    lend: float | None = None,
) -> Quota:
    return Quota(
        team,
        pool,
        int(nominal * 1000),
        None if borrow is None else int(borrow * 1000),
        None if lend is None else int(lend * 1000),
    )


def snapshot(
    nodes: Iterable[Node] = (),
    pending: Iterable[PendingRequest] = (),
    running: Iterable[Running] = (),
    quotas: Iterable[Quota] = (),
    pools: Iterable[Pool] | None = None,
    teams: Iterable[str] = ("a", "b", "c"),
    usage: dict[str, int] | None = None,
    classes: Iterable[WorkloadClass] = CLASSES,
) -> Snapshot:
    nodes = tuple(nodes) or (node(),)
    if pools is None:
        pools = tuple(pool(n) for n in sorted({nd.pool for nd in nodes}))
    return Snapshot(
        now_ms=NOW,
        pools=tuple(pools),
        nodes=nodes,
        running=tuple(running),
        pending=tuple(pending),
        teams=tuple(Team(t) for t in teams),
        quotas=tuple(quotas),
        classes=tuple(classes),
        usage=tuple(TeamUsage(t, u) for t, u in (usage or {}).items()),
    )


def by_kind(decisions: Iterable[Decision], kind: DecisionKind) -> list[str]:
    """Request ids (PREEMPT: attempt ids) of the decisions of one kind, in order."""
    return [
        d.attempt_id if kind is DecisionKind.PREEMPT else d.request_id
        for d in decisions
        if d.kind is kind
    ]


def outcome(decisions: Iterable[Decision]) -> dict[str, str]:
    """request id -> "admit:fits", "wait:no-capacity" … for every non-PREEMPT decision."""
    return {
        d.request_id: f"{d.kind}:{d.code}" for d in decisions if d.kind is not DecisionKind.PREEMPT
    }
