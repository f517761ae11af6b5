"""Plain data that goes into and comes out of the scheduling core.

Everything here is frozen and made of integers and strings: GPU in milli-GPU
(1000 = one device), memory in MiB, CPU in millicores, time in epoch
milliseconds. The portal builds a `Snapshot` from its database; the replay
benchmark builds one from a trace; `schedule()` returns `Decision`s.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum

WHOLE_GPU_MILLI = 1000


class Partitioning(StrEnum):
    """How a device is handed out."""

    #: one request owns the whole device
    EXCLUSIVE = "exclusive"
    #: several requests share the device, each with a compute share and a memory cap
    TIME_SLICING = "time-slicing"
    #: the device is cut into MIG instances with NVIDIA's placement geometry
    MIG = "mig"


class ProfileKind(StrEnum):
    """What a request consumes on one device."""

    WHOLE = "whole"
    MIG = "mig"
    SHARED = "shared"


class PreemptionPolicy(StrEnum):
    """When running work of a class may be preempted."""

    #: never
    NEVER = "never"
    #: only while the team runs on borrowed capacity
    WHEN_BORROWING = "when-borrowing"
    #: whenever a higher band or a quota owner needs the capacity
    ALWAYS = "always"


class Lifecycle(StrEnum):
    CANARY = "canary"
    PRODUCTION = "production"
    MAINTENANCE = "maintenance"


class DecisionKind(StrEnum):
    """Outcome of one tick for one request (or, for PREEMPT, one running attempt)."""

    #: start now with the given placement
    ADMIT = "admit"
    #: stay pending; the message says why
    WAIT = "wait"
    #: stop a running attempt so that another request can start
    PREEMPT = "preempt"
    #: can never be satisfied as asked (no pool offers the shape)
    REJECT = "reject"


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True, slots=True)
class MigInstance:
    """One MIG GPU instance: its profile and where it sits in the 8 memory slots."""

    profile: str
    start: int
    size: int


@dataclass(frozen=True, slots=True)
class Device:
    index: int
    model: str
    memory_mib: int
    partitioning: Partitioning = Partitioning.EXCLUSIVE
    #: time-slicing: how many requests may share the device at most
    replicas: int = 1
    #: MIG with a fixed layout: the instances that exist; empty means the packer
    #: may create any valid layout (dynamic MIG)
    mig_instances: tuple[MigInstance, ...] = ()
    healthy: bool = True


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    pool: str
    cpu_milli: int
    memory_mib: int
    devices: tuple[Device, ...]
    labels: tuple[tuple[str, str], ...] = ()
    taints: tuple[Taint, ...] = ()
    ready: bool = True
    cordoned: bool = False
    #: "nvswitch" > "nvlink" > "pcie": multi-GPU requests prefer the fastest
    interconnect: str = "pcie"


@dataclass(frozen=True, slots=True)
class Shape:
    """What one request asks for.

    `count` devices (or MIG instances, or shared slices) of one profile on each
    of `pods` nodes; `pods > 1` is a gang that starts all together or not at all.
    """

    kind: ProfileKind = ProfileKind.WHOLE
    count: int = 1
    #: compute share per device: 1000 for WHOLE, less for SHARED
    milli: int = WHOLE_GPU_MILLI
    #: GPU-memory cap per device for SHARED; 0 = no cap
    gpu_memory_mib: int = 0
    #: MIG profile name such as "3g.40gb" for MIG
    mig_profile: str = ""
    cpu_milli: int = 0
    memory_mib: int = 0
    #: allowed GPU models; empty = any
    gpu_models: frozenset[str] = frozenset()
    tolerations: tuple[Taint, ...] = ()
    pods: int = 1
    #: a packer policy for this shape alone ("" = the tick's): serving replicas ask for
    #: "spread" so that one node's loss takes as few replicas as possible
    placement: str = ""
    #: GPU milli this shape holds in total, as quotas count it (computed once: a tick
    #: asks it about a hundred thousand times)
    gpus_milli: int = field(init=False, repr=False, compare=False, hash=False)
    #: the hash of the compared fields, computed once: shapes key the packer's, the
    #: reservations' and the fit rule's memos, millions of lookups in a replay
    _hash: int = field(init=False, repr=False, compare=False, hash=False)
    #: a number equal shapes share (`_SHAPE_NUMBERS`), read where a tick keys by shape:
    #: one attribute instead of a dozen fields hashed, and equality at a glance
    number: int = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        key = self._key()
        object.__setattr__(self, "_hash", hash(key))
        numbers = _SHAPE_NUMBERS
        number = numbers.get(key)
        if number is None:
            if len(numbers) >= _SHAPE_NUMBERS_MAX:
                numbers.clear()
            number = numbers[key] = next(_shape_counter)
        object.__setattr__(self, "number", number)
        if self.kind is ProfileKind.MIG:
            slices = 4 if self.mig_profile in FOUR_SLICE_MIG_PROFILES else 7
            per = mig_compute_slices(self.mig_profile) * WHOLE_GPU_MILLI // slices
        elif self.kind is ProfileKind.SHARED:
            per = self.milli
        else:
            per = WHOLE_GPU_MILLI
        object.__setattr__(self, "gpus_milli", per * self.count * self.pods)

    def _key(self) -> tuple[object, ...]:
        return _shape_init(self)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not Shape:
            return NotImplemented
        # Equal numbers are equal shapes; unequal ones may be too when the numbers were
        # handed out on either side of a clear of `_SHAPE_NUMBERS`.
        return self.number == other.number or (
            self._hash == other._hash and self._key() == other._key()
        )

    def __reduce__(self) -> tuple[type[Shape], tuple[object, ...]]:
        # rebuilt, not restored: a string's hash differs from one process to the next
        return (Shape, self._key())


#: a shape's init fields, in order (its hash and its pickled form)
_shape_init = operator.attrgetter(*(f.name for f in fields(Shape) if f.init))
#: init fields -> `Shape.number`: numbers are never handed out twice, so a shape's number
#: stays its own after a clear (a process that met this many shapes starts over: the
#: table holds at most some tens of MB)
_SHAPE_NUMBERS: dict[tuple[object, ...], int] = {}
_SHAPE_NUMBERS_MAX = 100_000
_shape_counter = itertools.count()


#: MIG profiles found only on 4-slice GPUs (A30, RTX PRO 6000 Blackwell): quotas count such a
#: slice as compute/4 of a GPU, every other as compute/7 ("1g.24gb" is also an H100-94/96GB
#: profile, so 1/7). tests/scheduling/test_mig.py holds this to `scheduling.mig`'s table.
FOUR_SLICE_MIG_PROFILES = frozenset(
    {
        "1g.6gb",
        "1g.6gb+me",
        "2g.12gb",
        "2g.12gb+me",
        "4g.24gb",
        "1g.24gb+gfx",
        "1g.24gb-me",
        "1g.24gb+me.all",
        "2g.48gb",
        "2g.48gb+gfx",
        "2g.48gb-me",
        "2g.48gb+me.all",
        "4g.96gb",
        "4g.96gb+gfx",
    }
)


def mig_compute_slices(profile: str) -> int:
    """Return the GPC slices of a MIG profile name ("3g.40gb" -> 3)."""
    head = profile.split("g.", 1)[0]
    return int(head) if head.isdigit() else 7


@dataclass(frozen=True, slots=True)
class DeviceGrant:
    """One device (or part of it) given to one pod of a request."""

    node: str
    device: int
    milli: int = WHOLE_GPU_MILLI
    gpu_memory_mib: int = 0
    mig: MigInstance | None = None


@dataclass(frozen=True, slots=True)
class PodPlacement:
    node: str
    grants: tuple[DeviceGrant, ...]
    cpu_milli: int = 0
    memory_mib: int = 0


@dataclass(frozen=True, slots=True)
class Placement:
    pods: tuple[PodPlacement, ...]

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(p.node for p in self.pods)


@dataclass(frozen=True, slots=True)
class Pool:
    name: str
    partitioning: Partitioning = Partitioning.EXCLUSIVE
    lifecycle: Lifecycle = Lifecycle.PRODUCTION
    #: GPU milli held back for production inference; training may use it only preemptibly
    inference_floor_milli: int = 0


@dataclass(frozen=True, slots=True)
class WorkloadClass:
    name: str
    #: higher band goes first; a request's priority never leaves its band
    band: int
    preemption: PreemptionPolicy = PreemptionPolicy.ALWAYS
    min_runtime_s: int = 0
    max_queue_s: int = 0
    #: counts against a pool's inference floor
    inference: bool = False


@dataclass(frozen=True, slots=True)
class Team:
    name: str
    weight: int = 1


@dataclass(frozen=True, slots=True)
class Quota:
    """Per team per pool, in GPU milli. None for a limit means unlimited."""

    team: str
    pool: str
    nominal_milli: int
    borrowing_limit_milli: int | None = None
    lending_limit_milli: int | None = None


@dataclass(frozen=True, slots=True)
class TeamUsage:
    """GPU milli-seconds used by a team, decayed to the snapshot's time."""

    team: str
    decayed_milli_s: int
    #: when `decayed_milli_s` was last decayed (epoch ms); `schedule()` decays it on to
    #: its `now_ms` with `Policy.usage_half_life_s`. 0 = already decayed to now.
    as_of_ms: int = 0


@dataclass(frozen=True, slots=True)
class PendingRequest:
    id: str
    team: str
    workload_class: str
    shape: Shape
    created_at_ms: int
    #: a pool name, or "" for any pool
    pool: str = ""
    #: fine priority inside the class band
    priority: int = 0
    #: attempts already made (0 for a fresh request)
    attempts: int = 0
    #: requeued after a preemption or a lost node: not admitted before this time
    #: (epoch ms, see `scheduling.backoff.requeue_delay_s`); 0 = no hold
    not_before_ms: int = 0
    #: expected runtime once started (ms), or None when unknown; with it the request may
    #: backfill a node reserved for a large request if it is expected to end before that
    #: request is expected to start (EASY backfilling)
    expected_runtime_ms: int | None = None
    #: the submitter, for the member rules (`scheduling.members`); "" = not subject to them
    user: str = ""
    #: its last decision was `preempting`: the room its victims free is kept for it (it is
    #: decided before every other request of the tick; see `scheduling.cycle`)
    preempting: bool = False


@dataclass(frozen=True, slots=True)
class Running:
    """An admitted attempt that holds devices."""

    request_id: str
    attempt_id: str
    team: str
    workload_class: str
    pool: str
    shape: Shape
    placement: Placement
    started_at_ms: int
    last_checkpoint_ms: int | None = None
    priority: int = 0
    #: already being stopped: its devices are still held, it is no preemption candidate
    stopping: bool = False
    #: this attempt was admitted on capacity freed by preempting others; it is never a
    #: victim of a preemptor from the same or a lower band (no preemption cycles)
    admitted_by_preemption: bool = False
    #: when the attempt is expected to end (epoch ms), or None when unknown; reservations
    #: hold the nodes expected to drain soonest (`reservation.Reservations.reserve`). An
    #: estimate past `now` counts as ending now.
    expected_end_ms: int | None = None
    #: the submitter, counted against their member cap (`scheduling.members`)
    user: str = ""


@dataclass(frozen=True, slots=True)
class Member:
    """A user's membership of a team; `cap_milli` caps the GPU milli they may hold in it."""

    team: str
    user: str
    cap_milli: int | None = None


@dataclass(frozen=True, slots=True)
class PoolWorkload:
    """The request shapes a pool has seen, by weight (`scheduling.workload.ShapeHistory`):
    FGD's target workload for the pool. Only the ratios of the weights matter."""

    pool: str
    weights: tuple[tuple[Shape, float], ...] = ()


@dataclass(frozen=True)
class Snapshot:
    now_ms: int
    pools: tuple[Pool, ...] = ()
    nodes: tuple[Node, ...] = ()
    running: tuple[Running, ...] = ()
    pending: tuple[PendingRequest, ...] = ()
    teams: tuple[Team, ...] = ()
    quotas: tuple[Quota, ...] = ()
    classes: tuple[WorkloadClass, ...] = ()
    usage: tuple[TeamUsage, ...] = ()
    #: the members of the teams with pending requests; None turns the member rules off
    members: tuple[Member, ...] | None = None
    #: per pool, the shapes it has seen (the packer's target workload); a pool missing here
    #: uses the prior of what its nodes offer (`scheduling.workload.prior`), never the
    #: requests of one tick
    workloads: tuple[PoolWorkload, ...] | None = None
    #: nodes autoscaled pools may still add, one entry per node: they never take work,
    #: but a request only they could hold waits (`awaiting-nodes`) instead of being rejected
    growth: tuple[Node, ...] = ()


@dataclass(frozen=True)
class Decision:
    kind: DecisionKind
    request_id: str
    #: a stable machine-readable reason, e.g. "fits", "quota-exhausted", "no-capacity"
    code: str
    #: one sentence a researcher understands
    message: str
    placement: Placement | None = None
    #: PREEMPT: the attempt to stop
    attempt_id: str = ""
    #: ADMIT: the pool it lands in
    pool: str = ""
    #: the request's queue position (1-based) in scheduling order, 0 if not pending
    position: int = 0
    #: ADMIT: whether the admission borrows beyond the team's nominal quota
    borrowing: bool = False
    #: requests near their class's maximum queue time
    escalated: bool = False
    facts: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Policy:
    """Knobs of the scheduling core."""

    packer: str = "default"
    usage_half_life_s: int = 7 * 24 * 3600
    #: the half-life of a pool's shape history (`scheduling.workload.ShapeHistory`), the
    #: packer's target workload; measured in docs/packer.md ("Per-tick procedure")
    shape_half_life_s: int = 7 * 24 * 3600
    #: at most this many attempts preempted per tick
    max_preemptions_per_tick: int = 2
    #: escalate a request after this fraction of its class's maximum queue time
    escalate_after: float = 0.8
    #: at most this many blocked requests hold nodes back (a reservation) per tick
    max_reservations: int = 16
    #: a blocked request asking for fewer than `reserve_min_devices` devices gets a
    #: reservation only after waiting this long
    reserve_after_s: int = 1800
    #: a blocked request of at least this many devices (all pods) gets a reservation at once
    reserve_min_devices: int = 2
    #: an entitled request preempts only after waiting this long (0 = at once)
    preempt_after_s: int = 300
    #: an attempt that would lose more than this many GPU-seconds of work since its last
    #: checkpoint (or start) is no preemption candidate; 0 = no limit
    max_victim_loss_gpu_s: int = 7200
    #: and no more than this many GPU-seconds per GPU of the request that preempts it
    #: (an 8-GPU request may cost 8 times what a 1-GPU one may); 0 = the cap above alone
    victim_loss_per_gpu_s: int = 120
    #: the starvation bound: a request within its quota that has waited this fraction of
    #: its class's `max_queue_s` may preempt attempts of the same or a lower band of any
    #: team (tier 4 in `scheduling.preemption`); 0 = never
    starvation_after: float = 0.99
    #: past its starvation bound a request that has not run yet may preempt victims that
    #: together lose up to this multiple of the GPU-time it has waited, even above
    #: `max_victim_loss_gpu_s` (work that never checkpoints); 0 = the fixed cap only
    starving_loss_ratio: float = 1.0
    #: a whole-node shape learned from the pool's history but not pending now keeps at
    #: most this many of its hosts (`scheduling.scarce.kept_nodes`); 0 = as many as one
    #: pending (`SCARCE_PCT` % of the pool's nodes)
    learned_kept_nodes: int = 1
    #: a pool whose queue holds more requests than `max_reservations` and asks at least
    #: this multiple of its GPUs is overloaded: a request past its starvation bound there
    #: waits for a reservation instead of preempting (`scheduling.cycle`'s `_overloaded`);
    #: 0 = only the count of starving requests decides
    overload_queue_ratio: float = 0.5
