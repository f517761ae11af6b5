"""Device packer: where a request's devices go.

`ClusterState` is the mutable free-capacity view of a set of nodes. The scheduling core
asks it for a placement (`find`), then commits (`take`) or gives back (`give`) capacity;
nothing else touches its counters.

Devices
-------
A request (`Shape`) asks for `count` units of one profile on each of `pods` nodes:

* `WHOLE` — a device that nobody else uses, on an `EXCLUSIVE` or `TIME_SLICING` device;
* `SHARED` — a slice of a `TIME_SLICING` device: `milli` of its compute share and, when
  `gpu_memory_mib > 0`, that much of its memory (a slice without a cap reserves no memory).
  The slices on a device sum to at most 1000 milli; when `Device.replicas > 1` there are at
  most `replicas` slices (the device plugin's replica count); `replicas <= 1` means the
  share is the only limit. `count > 1` slices go to distinct devices;
* `MIG` — an instance of `mig_profile` on a `MIG` device: a fixed layout
  (`Device.mig_instances`) hands out existing free instances; a dynamic layout (no
  instances listed) creates any instance that the geometry of `scheduling.mig` allows.
  Several instances of one request may share a device.

A device counts as idle GPU in proportion to its free compute: `1000 - used milli`, or for
MIG `(7 - used compute slices) × 1000 // 7`. Unhealthy devices are never handed out.

Fit
---
A node hosts a pod of a shape when, all at once: it is ready and not cordoned; it tolerates
every `NoSchedule`/`NoExecute` taint; it has the CPU and host memory left; and it has
`count` units of the profile on healthy devices of an allowed model (`gpu_models`; a request
with `count == 0` uses no device and ignores `gpu_models`). Gang requests (`pods > 1`) go
to distinct nodes, all or nothing.

Policies (`POLICIES`; every policy ranks candidate nodes by a score tuple, lower first)
-----------------------------------------------------------------------------------------
* `fgd` — fragmentation gradient descent (Weng et al., ATC'23) as its artifact scores it:
  1. the node with the best coarse score `int(100 · sigmoid(-ΔF / 1000))` (ΔF in milli-GPU
  per target request; about 40 milli-GPU per point); devices inside it by exact ΔF.
* `fgd-exact` — exact ΔF only.
* `fgd-bestfit` (the default) — 1. the coarse FGD score; 2. when no target shape constrains
  the GPU model, a BestFit score `cpu_left + 32 × gpu_left` (GPU weighted double
  `bestfit`'s 16; consolidates near-equal ΔF); otherwise nothing more, so
  the tie-break decides as in FGD (BestFit favours small nodes, often the scarce models that
  constrained requests need); 3. exact ΔF for the device choice.
* `bestfit` — least `cpu_left + 16 × gpu_left` after placement (FGD's BestFit baseline:
  0.5 × CPU/128 cores + 0.5 × GPU/8 GPUs), then the fullest fitting device.
* `dotprod` — Tetris: largest dot product of request and free capacity (CPU, GPU), each
  normalised by the node's capacity; then the fullest fitting device.
* `packing` — 1. a shared slice on an already shared device, 2. devices on a node already
  in use, 3. an idle node; then the least GPU left on the node, the fullest device.
* `clustering` — keep alike requests together: 1. a shared slice on a device whose used
  share is a multiple of the slice (it likely holds the same slices), whole devices on a
  node with fully used devices; 2. a node in use; 3. an idle node; then as `packing`.
* `spread` — for inference replicas: the least allocated node (GPU, then CPU), the most
  free device. A shape may ask for it alone (`Shape.placement`, serving replicas) whatever
  the state's policy.
* `random` — any node that fits (always a random tie-break).
* `firstfit` — the first node that fits in tie-break order.

For `count > 1` the fastest interconnect comes before the policy score
(nvswitch, nvlink, pcie).

Tie-break (`tie_break`)
-----------------------
* `"name"` (default) — the lexicographically smallest node name, as the FGD artifact does;
* `"random"` — uniformly among all tied nodes, from `random.Random(seed)`.
Inside a node, devices are chosen by the policy score and then by lowest device index.

Fragmentation and the target workload
-------------------------------------
For a node n and a target shape m, `f_n(m)` is the idle GPU on n that m cannot use: all of
it when n cannot host m at all (a CPU-only m, the wrong model or taints, too little CPU,
memory or devices), otherwise the idle GPU of the devices that cannot host one unit of m.
`F_n = Σ_m w_m · f_n(m)` with integer weights `w_m` (popularity counts). The target
workload is the `shape_weights` constructor option (see `target_workload`), and
`pool_shape_weights` gives pools their own (the scheduling core passes each pool's shape
history, `scheduling.workload`); with neither it is learnt from the shapes passed to
`find`, refreshed when their count doubles and then every 1024 requests.

Incremental scoring
-------------------
Nodes in identical states (same static description but the name, same free CPU, memory and
devices — devices in sorted order when they are interchangeable) form a group; a group's
score for a shape is computed once and cached, and only the group a node leaves or joins
changes when capacity is taken or given. `F` is memoised on the node state with CPU and
memory reduced to the thresholds of the target shapes.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import itertools
import math
import operator
import random
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from scheduling import fit, mig
from scheduling.types import (
    WHOLE_GPU_MILLI,
    Device,
    DeviceGrant,
    MigInstance,
    Node,
    Partitioning,
    Placement,
    PodPlacement,
    ProfileKind,
    Shape,
    mig_compute_slices,
)

DEFAULT_POLICY = "fgd-bestfit"
POLICIES = (
    "fgd-bestfit",
    "fgd",
    "fgd-exact",
    "bestfit",
    "dotprod",
    "packing",
    "clustering",
    "spread",
    "random",
    "firstfit",
)
TIE_BREAKS = ("name", "random")

#: share of requests the learnt target workload covers, in percent (FGD uses 95)
TARGET_COVERAGE_PCT = 95

#: `bestfit` weighs a milli-GPU left like 16 milli-CPU (FGD's BestFit: 128 cores ~ 8 GPUs)
BESTFIT_GPU_WEIGHT = 16
#: `fgd-bestfit` breaks near-equal FGD scores with GPU left weighted double that: measured on
#: the openb trace (seeds 42-51), GPU-heavier consolidation helps the CPU- and sharing-heavy
#: mixes (cpu100 +0.12, gpushare100 +0.19), `default` +0.01, worst loss cpu250 -0.09; see
#: docs/packer.md (24 and 40 were each worse somewhere)
FGD_BESTFIT_GPU_WEIGHT = 32

_INTERCONNECT_RANK = {"nvswitch": 0, "nvlink": 1, "pcie": 2}

# Device state, a plain tuple so that node states hash and sort cheaply:
# (idle milli, free GPU memory MiB, shared slices in use, MIG memory-slot mask,
#  MIG compute slices in use, MIG "+me" instances, fixed-layout MIG instances still free)
DevState = tuple[int, int, int, int, int, int, tuple[MigInstance, ...]]
Score = tuple[int, ...]
# One unit handed out: (canonical device position, milli, GPU memory MiB, MIG instance)
Pick = tuple[int, int, int, MigInstance | None]
Choice = tuple[Pick, ...]
Result = tuple[Score, Choice] | None

_MISS: object = object()
_first = operator.itemgetter(0)


def target_workload(
    shapes: Iterable[Shape], coverage_pct: int = TARGET_COVERAGE_PCT
) -> list[tuple[Shape, int]]:
    """The most popular shapes covering `coverage_pct` % of `shapes`, with their counts.

    Ties in popularity are ordered by the shape's repr so the result is deterministic.
    """
    counts = Counter(shapes)
    total = sum(counts.values())
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], repr(kv[0])))
    out: list[tuple[Shape, int]] = []
    covered = 0
    for shape, n in ranked:
        if covered * 100 >= total * coverage_pct:
            break
        out.append((shape, n))
        covered += n
    return out


_node_key = operator.attrgetter(*(f.name for f in dataclasses.fields(Node) if f.name != "name"))
_kind_key = operator.attrgetter(
    *(f.name for f in dataclasses.fields(Node) if f.name not in ("name", "pool"))
)
#: each distinct node but for its name and pool, numbered (`_Class.kind`)
_NODE_KINDS: dict[tuple[object, ...], int] = {}
_KIND_NUMBERS = itertools.count()


_K = TypeVar("_K")


def _node_kind(node: Node) -> int:
    """A number equal for nodes equal but for their name and pool (never reused)."""
    return _numbered(_NODE_KINDS, _kind_key(node), _KIND_NUMBERS)


def _numbered(table: dict[_K, int], key: _K, numbers: Iterator[int]) -> int:
    """`key`'s number in `table`, a new one from `numbers` when it has none. Numbers keep
    counting up when a full table is cleared: a key never gets a number another had."""
    number = table.get(key)
    if number is None:
        if len(table) >= _NODE_SEEN_MAX:
            table.clear()
        number = table[key] = next(numbers)
    return number


#: each distinct node but for its name, numbered
_NODE_TOKENS: dict[tuple[object, ...], int] = {}
#: id(node) -> (node, its number): a replay hands the same Node objects to every tick, and
#: hashing a node's devices, labels and taints each tick was most of a tick's setup. The
#: node is kept with its number, so an id is never mistaken for another node's.
_NODE_SEEN: dict[int, tuple[Node, int]] = {}
_NODE_SEEN_MAX = 10_000
_NODE_NUMBERS = itertools.count()


def node_class(node: Node) -> int:
    """A number equal for nodes equal but for their name (never reused for another)."""
    return _node_token(node)


def _node_token(node: Node) -> int:
    """The number of the node's class key: equal for nodes equal but for their name."""
    seen = _NODE_SEEN.get(id(node))
    if seen is not None and seen[0] is node:
        return seen[1]
    token = _numbered(_NODE_TOKENS, _node_key(node), _NODE_NUMBERS)
    if len(_NODE_SEEN) >= _NODE_SEEN_MAX:
        _NODE_SEEN.clear()  # the portal builds new nodes each tick: forget old ones
    _NODE_SEEN[id(node)] = (node, token)
    return token


#: (node class, shape, now) -> `fit.eligible_devices`: the same few node classes and shapes
#: come back tick after tick, and a tick asks for each node of a pool
_NODE_ELIGIBLE: dict[tuple[int, Shape, bool], tuple[bool, ...] | None] = {}
_NODE_ELIGIBLE_MAX = 100_000


def eligible(node: Node, shape: Shape, now: bool = True) -> tuple[bool, ...] | None:
    """`fit.eligible_devices(node, shape, now=now)`, which looks at all of the node but its
    name, remembered per node class."""
    key = (node_class(node), shape, now)
    flags = _NODE_ELIGIBLE.get(key, _MISS)
    if flags is _MISS:
        if len(_NODE_ELIGIBLE) >= _NODE_ELIGIBLE_MAX:
            _NODE_ELIGIBLE.clear()
        flags = _NODE_ELIGIBLE[key] = fit.eligible_devices(node, shape, now=now)
    return flags  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class _Static:
    """What a node class is whatever the state: computed once per class number, not once
    per tick (a replay builds a ClusterState for each of tens of thousands of ticks)."""

    proto: Node
    specs: tuple[Device, ...]
    uniform: bool
    interconnect: int
    gpu_milli: int
    families: tuple[mig.MigFamily | None, ...]
    fresh: tuple[DevState, ...]


#: class number (`_node_token`) -> its `_Static`; numbers are never reused
_CLASS_STATIC: dict[int, _Static] = {}


def _class_static(token: int, node: Node) -> _Static:
    static = _CLASS_STATIC.get(token)
    if static is not None:
        return static
    specs = tuple(node.devices)
    first = specs[0] if specs else None
    uniform = (
        all(dataclasses.replace(d, index=0) == dataclasses.replace(first, index=0) for d in specs)
        if first
        else True
    )
    static = _Static(
        proto=dataclasses.replace(node, name=""),
        specs=specs,
        uniform=uniform,
        interconnect=_INTERCONNECT_RANK.get(node.interconnect, 3),
        gpu_milli=WHOLE_GPU_MILLI * sum(1 for d in specs if d.healthy),
        families=tuple(
            mig.family_for(d.model, d.memory_mib) if d.partitioning is Partitioning.MIG else None
            for d in specs
        ),
        fresh=tuple(_fresh(d) for d in specs),
    )
    if len(_CLASS_STATIC) >= _NODE_SEEN_MAX:
        _CLASS_STATIC.clear()
    _CLASS_STATIC[token] = static
    return static


#: target workload (shapes and weights) -> its number; numbers are never reused
_TARGET_IDS: dict[tuple[tuple[Shape, int], ...], int] = {}
_TARGET_NUMBERS = itertools.count(1)
#: inside `remembering()`: (node class, target, policy, free CPU, free memory, device
#: states, shape) -> the group's `Result`; bounded, and cleared when full
_EVALUATED: dict[tuple[object, ...], object] | None = None
_EVALUATED_MAX = 200_000
#: inside `remembering()`: (node class, shape) -> `fit.eligible_devices`
_ELIGIBLE: dict[tuple[int, Shape], tuple[bool, ...] | None] | None = None
#: inside `remembering()`: (node class, device states) -> per target shape, the idle GPU
#: the shape cannot use there when the node's CPU and memory hold it (`_frag_compute`);
#: it does not depend on the target's weights, which change with every arrival
_UNIT_FRAG: dict[tuple[int, tuple[DevState, ...]], dict[Shape, int]] | None = None


@contextlib.contextmanager
def remembering() -> Iterator[None]:
    """Remember group evaluations across ClusterStates while inside (a replay's ticks each
    build a new one and meet the same free capacities again and again); outside, each
    ClusterState remembers only its own, and nothing is kept between ticks."""
    global _EVALUATED, _ELIGIBLE, _UNIT_FRAG
    outer = (_EVALUATED, _ELIGIBLE, _UNIT_FRAG)
    _EVALUATED = {} if outer[0] is None else outer[0]
    _ELIGIBLE = {} if outer[1] is None else outer[1]
    _UNIT_FRAG = {} if outer[2] is None else outer[2]
    try:
        yield
    finally:
        _EVALUATED, _ELIGIBLE, _UNIT_FRAG = outer


def _target_ident(items: tuple[tuple[Shape, int], ...]) -> int:
    return _numbered(_TARGET_IDS, items, _TARGET_NUMBERS)


def _fresh(spec: Device) -> DevState:
    fixed = (
        tuple(sorted(spec.mig_instances, key=lambda i: (i.start, i.profile)))
        if spec.mig_instances
        else ()
    )
    return (WHOLE_GPU_MILLI, spec.memory_mib, 0, 0, 0, 0, fixed)


def _mig_idle(compute_used: int, slices: int = mig.COMPUTE_SLICES) -> int:
    return (slices - compute_used) * WHOLE_GPU_MILLI // slices


@dataclass(slots=True, eq=False)
class _Targets:
    """One target workload: shapes with integer weights (see `set_shape_weights`)."""

    items: list[tuple[Shape, int, int]] = field(default_factory=list)
    total: int = 1
    #: some target shape constrains the GPU model (`fgd-bestfit` then breaks ties by name)
    constrained: bool = False
    #: how much of a score tuple ranks nodes (None: all of it)
    node_len: int | None = None
    #: equal for equal shapes and weights (`_target_ident`); 0 = not numbered yet
    ident: int = 0
    #: `items` as F reads them: (CPU milli, memory MiB, weight, shape, shape id)
    rows: list[tuple[int, int, int, Shape, int]] = field(default_factory=list)


@dataclass(slots=True, eq=False)
class _Class:
    """Nodes that are equal but for their name and free capacity."""

    id: int
    proto: Node
    specs: tuple[Device, ...]
    #: all devices equal but for their index: states may be sorted
    uniform: bool
    schedulable: bool
    interconnect: int
    cpu_milli: int
    gpu_milli: int
    #: per shape id: device positions eligible for the shape, or None if the node is out
    eligible: dict[int, tuple[bool, ...] | None] = field(default_factory=dict)
    #: per device: the MIG profile table (None: not MIG or unknown family)
    families: tuple[mig.MigFamily | None, ...] = ()
    #: the target workload of the node's pool
    target: _Targets = field(default_factory=_Targets)
    #: the state of each device when nothing holds it
    fresh: tuple[DevState, ...] = ()
    #: `_node_token`: equal for the classes of equal nodes in every ClusterState
    token: int = -1
    #: `_node_kind`: equal for the classes of nodes equal but for their pool
    kind: int = -1


@dataclass(slots=True, eq=False)
class _Group:
    key: tuple[object, ...]
    cls: _Class
    cpu: int
    mem: int
    devs: tuple[DevState, ...]
    #: node names, sorted
    names: list[str] = field(default_factory=list)
    cache: dict[int, Result] = field(default_factory=dict)
    #: (CPU, memory, device states), hashed once: the evaluation memo's key
    state: Hashed = field(init=False)
    #: devices wholly idle: a whole-device shape of more cannot fit, whatever else holds
    whole: int = field(init=False)
    #: GPU milli idle, all devices together
    idle: int = field(init=False)
    #: when it was made, among its state's groups (`_fitting` reads several pools' in order)
    seq: int = 0

    def __post_init__(self) -> None:
        self.state = Hashed((self.cpu, self.mem, self.devs))
        self.idle = sum([d[0] for d in self.devs])
        self.whole = sum(
            1 for d in self.devs if d[0] == WHOLE_GPU_MILLI and d[2] == 0 and d[3] == 0
        )


@dataclass(slots=True)
class _Read:
    """How far `_fitting` read the groups made for one (shape, pools), and under which
    target workloads it scored them."""

    epoch: int
    #: `ClusterState._made`'s length when read (a search of every pool)
    made: int = 0
    #: per pool, `ClusterState._made_in`'s length when read
    at: dict[str, int] = field(default_factory=dict)


_made_order = operator.attrgetter("seq")


class Hashed:
    """A tuple with its hash computed once: the key of a memo asked again and again about
    the same large value (a tuple's hash is computed at every lookup)."""

    __slots__ = ("value", "_hash")

    def __init__(self, value: tuple[object, ...]) -> None:
        self.value = value
        self._hash = hash(value)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return (
            self is other
            or isinstance(other, Hashed)
            and self._hash == other._hash
            and self.value == other.value
        )


@dataclass(slots=True, eq=False)
class _NodeFree:
    node: Node
    cls: _Class
    cpu_milli: int
    memory_mib: int
    devs: list[DevState]
    group: _Group | None = None


class ClusterState:
    """Free capacity of a set of nodes; placements are found here and committed here."""

    def __init__(
        self,
        nodes: Iterable[Node],
        policy: str = DEFAULT_POLICY,
        *,
        seed: int = 0,
        tie_break: str = "name",
        shape_weights: Mapping[Shape, int] | Iterable[tuple[Shape, int]] | None = None,
        pool_shape_weights: Mapping[str, Mapping[Shape, int] | Iterable[tuple[Shape, int]]]
        | None = None,
    ) -> None:
        if policy == "default":
            policy = DEFAULT_POLICY
        if policy not in POLICIES:
            raise ValueError(
                f"unknown packing policy {policy!r}; choose one of {', '.join(POLICIES)}"
            )
        if tie_break not in TIE_BREAKS:
            raise ValueError(
                f"unknown tie-break {tie_break!r}; choose one of {', '.join(TIE_BREAKS)}"
            )
        self.policy = policy
        self.tie_break = "random" if policy == "random" else tie_break
        self._rng = random.Random(seed)
        self._classes: dict[int, _Class] = {}
        self._nodes: dict[str, _NodeFree] = {}
        self._groups: dict[tuple[object, ...], _Group] = {}
        #: every group in the order made, and per shape id and pools searched: how far that
        #: list was read and the groups read (alive or not) that can hold the shape there,
        #: with their result
        #: (`_fitting`): a search looks at those few, not at every group
        self._made: list[_Group] = []
        #: per pool, its groups in the order made: a search of some pools reads only theirs
        self._made_in: dict[str, list[_Group]] = {}
        self._made_count = 0
        #: how far it was read (`_made`'s index or, for some pools, `_made_in`'s per pool)
        #: and the epoch it was scored in, then the groups read
        self._fits: dict[
            tuple[int, tuple[str, ...] | None],
            tuple[_Read, dict[_Group, tuple[Score, Choice]]],
        ] = {}
        #: bumped when the target workloads change: the groups in `_fits` can still hold
        #: their shape (what a group can hold does not depend on the target), only their
        #: scores are stale
        self._epoch = 0
        self._shape_ids: dict[Shape, int] = {}
        self._frag_memo: dict[tuple[object, ...], int] = {}
        #: `_evaluate` outside `remembering()`: per node kind (pools of the same hardware
        #: share it), target workload, free capacity and shape id
        self._evaluated: dict[tuple[object, ...], Result] = {}
        self._unit_frag = {} if _UNIT_FRAG is None else _UNIT_FRAG
        self._default = _Targets()
        self._pool_targets: dict[str, _Targets] = {}
        self._cpu_thresholds: list[int] = []
        self._mem_thresholds: list[int] = []
        self._learn = shape_weights is None and pool_shape_weights is None
        self._seen: Counter[Shape] = Counter()
        self._seen_total = 0
        self._next_refresh = 1
        for pool, weights in (pool_shape_weights or {}).items():
            self._pool_targets[pool] = _Targets()
            self._fill_targets(self._pool_targets[pool], weights)
        if shape_weights is not None:
            self.set_shape_weights(shape_weights)
        elif self._learn:
            self.set_shape_weights([(Shape(), 1)])
        else:
            self.set_shape_weights([])
        for node in nodes:
            cls = self._class_of(node)
            free = _NodeFree(node, cls, node.cpu_milli, node.memory_mib, list(cls.fresh))
            self._nodes[node.name] = free
            self._regroup(free)

    # ------------------------------------------------------------------ public API

    @property
    def nodes(self) -> Sequence[Node]:
        return [n.node for n in self._nodes.values()]

    def schedulable(self, node: Node) -> bool:
        return fit.schedulable(node)

    def set_shape_weights(self, weights: Mapping[Shape, int] | Iterable[tuple[Shape, int]]) -> None:
        """Set the target workload: shapes and integer popularity weights (fragmentation
        policies). It applies to the nodes of pools without one of their own
        (`pool_shape_weights`)."""
        self._fill_targets(self._default, weights)

    def _fill_targets(
        self, t: _Targets, weights: Mapping[Shape, int] | Iterable[tuple[Shape, int]]
    ) -> None:
        items = list(weights.items()) if isinstance(weights, Mapping) else list(weights)
        t.items = [(s, int(w), self._shape_id(s)) for s, w in items if w > 0]
        t.rows = [(s.cpu_milli, s.memory_mib, w, s, sid) for s, w, sid in t.items]
        t.total = max(1, sum(w for _, w, _ in t.items))
        t.ident = 0  # numbered when first needed (`_evaluate`)
        t.constrained = any(m.gpu_models and m.count > 0 for m, _, _ in t.items)
        t.node_len = (
            1 if self.policy == "fgd" or (self.policy == "fgd-bestfit" and t.constrained) else None
        )
        # F is memoised on CPU and memory reduced to the thresholds of every target
        every = [self._default, *self._pool_targets.values()]
        self._cpu_thresholds = sorted({s.cpu_milli for x in every for s, _, _ in x.items})
        self._mem_thresholds = sorted({s.memory_mib for x in every for s, _, _ in x.items})
        self._frag_memo.clear()
        self._evaluated.clear()
        if self.policy.startswith("fgd"):
            for g in self._groups.values():
                g.cache.clear()
            self._epoch += 1

    def retarget(
        self, pool_shape_weights: Mapping[str, Mapping[Shape, int] | Iterable[tuple[Shape, int]]]
    ) -> bool:
        """Give a state kept across ticks the pools' target workloads of this tick: it then
        chooses as a new state built with `pool_shape_weights` would. False, changing
        nothing, when the pools are not the ones it was built with, or when ties are broken
        at random (the draw follows the order groups were made in, which a kept state does
        not share with a new one): build a new state."""
        if (
            self._learn
            or self.tie_break == "random"
            or pool_shape_weights.keys() != self._pool_targets.keys()
        ):
            return False
        changed = False
        for pool, weights in pool_shape_weights.items():
            t = self._pool_targets[pool]
            items = list(weights.items()) if isinstance(weights, Mapping) else list(weights)
            if [(s, int(w)) for s, w in items if w > 0] == [(s, w) for s, w, _ in t.items]:
                continue  # the same target: what was evaluated under it still holds
            self._fill_targets(t, items)
            changed = True
        if changed:
            # a shape's own `placement` may score by the target under any policy
            self._frag_memo.clear()
            for g in self._groups.values():
                g.cache.clear()
            self._epoch += 1  # `_fits` holds the groups' results too
        return True

    @property
    def shape_weights(self) -> list[tuple[Shape, int]]:
        return [(s, w) for s, w, _ in self._default.items]

    def find(
        self,
        shape: Shape,
        accept: Callable[[Node], bool] | None = None,
        pools: tuple[str, ...] | None = None,
        avoid: frozenset[str] = frozenset(),
    ) -> Placement | None:
        """Return a placement for `shape` on nodes that `accept` allows, or None. Commits nothing.

        `pools`: only nodes of these pools, and `avoid`: never these nodes, where `accept`
        says so too: they only save asking `accept` about each node of the other pools (a
        group's nodes share a pool) and about the nodes avoided (a set lookup instead)."""
        if self._learn:
            self._observe(shape)
        sid = self._shape_id(shape)
        if shape.pods <= 1:
            pod = self._best_pod(shape, sid, accept, (), pools, avoid)
            return None if pod is None else Placement(pods=(pod,))
        placed: list[PodPlacement] = []
        taken: set[str] = set()
        # A gang's pods go to distinct nodes: a node placed on is left out of the next pods'
        # search, so its new free capacity is never read. Taking each pod (and giving it
        # back) changes only the order groups were made in, which random ties draw from.
        hold = self.tie_break == "random"
        try:
            for _ in range(shape.pods):
                pod = self._best_pod(shape, sid, accept, taken, pools, avoid)
                if pod is None:
                    return None
                placed.append(pod)
                taken.add(pod.node)
                if hold:
                    self._apply_pod(pod, -1)
        finally:
            if hold:
                for pod in placed:
                    self._apply_pod(pod, +1)
        return Placement(pods=tuple(placed))

    def take(self, placement: Placement) -> None:
        """Commit a placement's capacity."""
        for pod in placement.pods:
            self._apply_pod(pod, -1)

    def take_many(self, placements: Iterable[Placement]) -> None:
        """Commit many placements (a tick's running attempts): each node regroups once."""
        touched: dict[str, _NodeFree] = {}
        for placement in placements:
            for pod in placement.pods:
                free = self._apply_pod(pod, -1, regroup=False)
                if free is not None:
                    touched[pod.node] = free
        for free in touched.values():
            self._regroup(free)

    def give(self, placement: Placement) -> None:
        """Return a placement's capacity."""
        for pod in placement.pods:
            self._apply_pod(pod, +1)

    def free_capacity(self, name: str) -> tuple[int, int, tuple[int, ...]]:
        """(free CPU milli, free memory MiB, idle milli per device) of one node."""
        free = self._nodes[name]
        return free.cpu_milli, free.memory_mib, tuple(d[0] for d in free.devs)

    def idle_milli(self, name: str) -> int:
        """GPU milli idle on one node, all devices together."""
        free = self._nodes[name]
        group = free.group
        # a node is out of its group only inside a batch of changes (`_apply_pod`)
        return group.idle if group is not None else sum([d[0] for d in free.devs])

    # ------------------------------------------------------------------ bookkeeping

    def _shape_id(self, shape: Shape) -> int:
        sid = self._shape_ids.get(shape)
        if sid is None:
            sid = self._shape_ids[shape] = len(self._shape_ids)
        return sid

    def _observe(self, shape: Shape) -> None:
        self._seen[dataclasses.replace(shape, pods=1, placement="")] += 1
        self._seen_total += 1
        if self._seen_total >= self._next_refresh:
            self._next_refresh = (
                self._next_refresh * 2 if self._next_refresh < 1024 else self._next_refresh + 1024
            )
            self.set_shape_weights(target_workload(self._seen.elements()))

    def _class_of(self, node: Node) -> _Class:
        key = _node_token(node)
        cls = self._classes.get(key)
        if cls is None:
            static = _class_static(key, node)
            cls = _Class(
                id=len(self._classes),
                proto=static.proto,
                specs=static.specs,
                uniform=static.uniform,
                schedulable=self.schedulable(node),
                interconnect=static.interconnect,
                cpu_milli=node.cpu_milli,
                gpu_milli=static.gpu_milli,
                families=static.families,
                fresh=static.fresh,
                token=key,
                target=self._pool_targets.get(node.pool, self._default),
                kind=_node_kind(node),
            )
            self._classes[key] = cls
        return cls

    def _regroup(self, free: _NodeFree) -> None:
        old = free.group
        name = free.node.name
        if old is not None:
            i = bisect.bisect_left(old.names, name)
            del old.names[i]
            if not old.names:
                del self._groups[old.key]
        canon = tuple(sorted(free.devs)) if free.cls.uniform else tuple(free.devs)
        key = (free.cls.id, free.cpu_milli, free.memory_mib, canon)
        group = self._groups.get(key)
        if group is None:
            self._made_count += 1
            group = self._groups[key] = _Group(
                key, free.cls, free.cpu_milli, free.memory_mib, canon, seq=self._made_count
            )
            made = self._made
            made.append(group)
            self._made_in.setdefault(free.cls.proto.pool, []).append(group)
            if len(made) > 2 * len(self._groups) + 1024:
                # mostly groups gone since: start the lists again from the live ones
                self._made = list(self._groups.values())
                self._made_in = {}
                for g in self._made:
                    self._made_in.setdefault(g.cls.proto.pool, []).append(g)
                self._fits.clear()
        bisect.insort(group.names, name)
        free.group = group

    def _apply_pod(self, pod: PodPlacement, sign: int, regroup: bool = True) -> _NodeFree | None:
        free = self._nodes.get(pod.node)
        if free is None:
            return None
        free.cpu_milli += sign * pod.cpu_milli
        free.memory_mib += sign * pod.memory_mib
        for g in pod.grants:
            if not 0 <= g.device < len(free.devs):
                continue
            spec = free.cls.specs[g.device]
            free.devs[g.device] = _apply_grant(spec, free.devs[g.device], g, sign)
        if regroup:
            self._regroup(free)
        return free

    # ------------------------------------------------------------------ choosing

    def _best_pod(
        self,
        shape: Shape,
        sid: int,
        accept: Callable[[Node], bool] | None,
        exclude: Iterable[str] | set[str],
        pools: tuple[str, ...] | None = None,
        avoid: frozenset[str] = frozenset(),
    ) -> PodPlacement | None:
        if accept is None and not exclude and pools is None and not avoid:
            return self._best_pod_fast(shape, sid)
        excluded = set(exclude)
        scored: list[tuple[Score, _Group, Choice]] = []
        fits = self._fitting(shape, sid, pools)
        gone: list[_Group] = []
        # the groups that can hold the shape, in the order of `_groups` (the order ties
        # are drawn from); a group is gone once its last node left it
        for g, r in fits.items():
            if g.names:
                scored.append((r[0], g, r[1]))
            else:
                gone.append(g)
        for g in gone:
            del fits[g]
        if not scored:
            return None
        # Most asks are answered by the best-scored groups: find those first and sort the
        # rest only when none of them has a node to give.
        best = min(scored, key=_first)[0]
        found = self._pick([t for t in scored if t[0] == best], shape, accept, excluded, avoid)
        if found is not None:
            return found
        rest = sorted([t for t in scored if t[0] != best], key=_first)
        i = 0
        while i < len(rest):
            j = i
            while j < len(rest) and rest[j][0] == rest[i][0]:
                j += 1
            found = self._pick(rest[i:j], shape, accept, excluded, avoid)
            if found is not None:
                return found
            i = j
        return None

    def _pick(
        self,
        tied: list[tuple[Score, _Group, Choice]],
        shape: Shape,
        accept: Callable[[Node], bool] | None,
        excluded: set[str],
        avoid: frozenset[str],
    ) -> PodPlacement | None:
        """A node of groups tied on score (in the order made) that may take the pod."""
        if self.tie_break == "random":
            options = [
                (name, g, choice)
                for _, g, choice in tied
                for name in g.names
                if name not in excluded
                and name not in avoid
                and (accept is None or accept(self._nodes[name].node))
            ]
            if not options:
                return None
            name, g, choice = options[self._rng.randrange(len(options))]
            return self._pod_placement(self._nodes[name], g, choice, shape)
        # The first name any tied group accepts: names are sorted within a group, so each
        # group is asked only up to its first accepted name, or up to the best name found
        # so far.
        first: tuple[str, _Group, Choice] | None = None
        for _, g, choice in tied:
            for name in g.names:
                if first is not None and name >= first[0]:
                    break
                if name in excluded or name in avoid:
                    continue
                if accept is None or accept(self._nodes[name].node):
                    first = (name, g, choice)
                    break
        if first is None:
            return None
        return self._pod_placement(self._nodes[first[0]], first[1], first[2], shape)

    def _fitting(
        self, shape: Shape, sid: int, pools: tuple[str, ...] | None
    ) -> dict[_Group, tuple[Score, Choice]]:
        """The groups of the pools (None: all) that can hold the shape (some may be gone:
        `_best_pod`), in the order made. A group's free capacity never changes (a node that
        changes moves to another group), so each is evaluated for a shape once."""
        entry = self._fits.get((sid, pools))
        if entry is None:
            entry = self._fits[(sid, pools)] = (_Read(self._epoch), {})
        read, fits = entry
        evaluate = self._evaluate
        if read.epoch != self._epoch:
            # Another target workload: the same groups hold the shape, scored anew (in the
            # same order: ties go to the group made first).
            for g in list(fits):
                r = g.cache.get(sid, _MISS) if g.names else None
                if r is _MISS:
                    r = g.cache[sid] = evaluate(g, shape, sid)
                if r is None:
                    del fits[g]
                else:
                    fits[g] = r  # type: ignore[assignment]
            read.epoch = self._epoch
        if pools is None:
            made = self._made
            fresh = made[read.made :]
            read.made = len(made)
        else:
            # Only the pools' own groups: every admission makes a group or two, and a
            # search of one pool went through all the others' too.
            fresh = []
            at = read.at
            for p in pools:
                mine = self._made_in.get(p)
                if mine is not None and at.get(p, 0) < len(mine):
                    fresh += mine[at.get(p, 0) :]
                    at[p] = len(mine)
            if len(pools) > 1:
                fresh.sort(key=_made_order)  # in the order made, as ties are drawn
        for g in fresh:
            if not g.names:
                continue
            r = g.cache.get(sid, _MISS)
            if r is _MISS:
                r = g.cache[sid] = evaluate(g, shape, sid)
            if r is not None:
                fits[g] = r  # type: ignore[assignment]
        return fits

    def _best_pod_fast(self, shape: Shape, sid: int) -> PodPlacement | None:
        best: Score | None = None
        tied: list[tuple[_Group, Choice]] = []
        evaluate = self._evaluate
        for g in list(self._groups.values()):
            r = g.cache.get(sid, _MISS)
            if r is _MISS:
                r = g.cache[sid] = evaluate(g, shape, sid)
            if r is None:
                continue
            s = r[0]  # type: ignore[index]
            if best is None or s < best:
                best = s
                tied = [(g, r[1])]  # type: ignore[index]
            elif s == best:
                tied.append((g, r[1]))  # type: ignore[index]
        if not tied:
            return None
        if self.tie_break == "random":
            total = sum(len(g.names) for g, _ in tied)
            k = self._rng.randrange(total)
            for g, choice in tied:
                if k < len(g.names):
                    return self._pod_placement(self._nodes[g.names[k]], g, choice, shape)
                k -= len(g.names)
        g, choice = min(tied, key=lambda t: t[0].names[0])
        return self._pod_placement(self._nodes[g.names[0]], g, choice, shape)

    def _result(self, g: _Group, shape: Shape, sid: int) -> Result:
        r = g.cache.get(sid, _MISS)
        if r is _MISS:
            r = g.cache[sid] = self._evaluate(g, shape, sid)
        return r  # type: ignore[return-value]

    def _pod_placement(
        self, free: _NodeFree, g: _Group, choice: Choice, shape: Shape
    ) -> PodPlacement:
        """Map the canonical choice of a group onto the devices of one node in it.

        A canonical position maps to the lowest-index device of the node in that state
        that no other position took; picks on one position share its device.
        """
        index_of: dict[int, int] = {}
        grants: list[DeviceGrant] = []
        name = free.node.name
        for pos, milli, mem, inst in choice:
            index = index_of.get(pos)
            if index is None:
                if free.cls.uniform:
                    taken = set(index_of.values())
                    want = g.devs[pos]
                    index = next(i for i, d in enumerate(free.devs) if d == want and i not in taken)
                else:
                    index = pos
                index_of[pos] = index
            grants.append(DeviceGrant(name, free.node.devices[index].index, milli, mem, inst))
        return PodPlacement(name, tuple(grants), shape.cpu_milli, shape.memory_mib)

    # ------------------------------------------------------------------ evaluating

    def _eligible(self, cls: _Class, shape: Shape, sid: int) -> tuple[bool, ...] | None:
        if sid in cls.eligible:
            return cls.eligible[sid]
        # `scheduling.fit` is the one fit rule; the class's schedulability stands in for
        # the node's (the prototype carries the same ready and cordoned flags).
        memo = _ELIGIBLE
        if memo is None:
            out = fit.eligible_devices(cls.proto, shape, cls.families) if cls.schedulable else None
        else:
            key = (cls.token, shape)
            if key in memo:
                out = memo[key]
            else:
                if len(memo) >= _EVALUATED_MAX:
                    memo.clear()
                out = memo[key] = (
                    fit.eligible_devices(cls.proto, shape, cls.families)
                    if cls.schedulable
                    else None
                )
        cls.eligible[sid] = out
        return out

    def _evaluate(self, g: _Group, shape: Shape, sid: int) -> Result:
        """`_evaluate_fresh`, remembered (inside `remembering()` across ClusterStates): it
        depends only on the node class (of a pool: its pool only through the target
        workload), its target workload, the policy, the group's free capacity and the
        shape."""
        memo = _EVALUATED
        cls = g.cls
        # most groups cannot hold the shape at all: say so before hashing the memo's key
        if (
            g.cpu < shape.cpu_milli
            or g.mem < shape.memory_mib
            or (shape.kind is ProfileKind.WHOLE and g.whole < shape.count)
            or self._eligible(cls, shape, sid) is None
        ):
            return None
        target = cls.target
        if not target.ident:
            target.ident = _target_ident(tuple((s, w) for s, w, _ in target.items))
        if memo is None:
            # Within one state: the same free capacity on the same hardware in another
            # pool with the same target workload scores the same.
            mine = (cls.kind, target.ident, g.state, sid)
            r = self._evaluated.get(mine, _MISS)
            if r is _MISS:
                if len(self._evaluated) >= _EVALUATED_MAX:
                    self._evaluated.clear()  # a state kept across many ticks
                r = self._evaluated[mine] = self._evaluate_fresh(g, shape, sid)
            return r  # type: ignore[return-value]
        key = (cls.token, target.ident, self.policy, g.state, shape)
        r = memo.get(key, _MISS)
        if r is _MISS:
            if len(memo) >= _EVALUATED_MAX:
                memo.clear()
            r = memo[key] = self._evaluate_fresh(g, shape, sid)
        return r  # type: ignore[return-value]

    def _evaluate_fresh(self, g: _Group, shape: Shape, sid: int) -> Result:
        cls = g.cls
        ok = self._eligible(cls, shape, sid)
        if ok is None or g.cpu < shape.cpu_milli or g.mem < shape.memory_mib:
            return None
        cpu_a = g.cpu - shape.cpu_milli
        mem_a = g.mem - shape.memory_mib
        pre: Score = (cls.interconnect,) if shape.count > 1 else ()
        node_len = None if shape.placement else cls.target.node_len
        if shape.count <= 0:
            return pre + self._score(g, shape, cpu_a, mem_a, g.devs, ())[:node_len], ()
        devs = list(g.devs)
        if shape.kind is ProfileKind.WHOLE:
            picks: list[Pick] = []
            for i, d in enumerate(devs):
                if ok[i] and d[0] == WHOLE_GPU_MILLI and d[2] == 0 and d[3] == 0:
                    picks.append((i, WHOLE_GPU_MILLI, cls.specs[i].memory_mib, None))
                    devs[i] = (0, 0, 0, 0, 0, 0, d[6])
                    if len(picks) == shape.count:
                        break
            if len(picks) < shape.count:
                return None
            after = tuple(sorted(devs)) if cls.uniform else tuple(devs)
            return pre + self._score(g, shape, cpu_a, mem_a, after, tuple(picks))[:node_len], tuple(
                picks
            )
        chosen: list[Pick] = []
        best: Score = ()
        for _ in range(shape.count):
            options = self._unit_options(cls, devs, shape, ok, {p[0] for p in chosen})
            step: tuple[Score, Pick, DevState] | None = None
            for pos, state, pick in options:
                trial = list(devs)
                trial[pos] = state
                after = tuple(sorted(trial)) if cls.uniform else tuple(trial)
                s = self._score(g, shape, cpu_a, mem_a, after, (*chosen, pick))
                if step is None or s < step[0]:
                    step = (s, pick, state)
            if step is None:
                return None
            best, pick, state = step
            devs[pick[0]] = state
            chosen.append(pick)
        return pre + best[:node_len], tuple(chosen)

    def _unit_options(
        self, cls: _Class, devs: list[DevState], shape: Shape, ok: tuple[bool, ...], used: set[int]
    ) -> list[tuple[int, DevState, Pick]]:
        """Ways to hand out one more unit of a SHARED or MIG shape: (position, new state, pick)."""
        out: list[tuple[int, DevState, Pick]] = []
        seen: set[tuple[object, ...]] = set()
        for i, d in enumerate(devs):
            if not ok[i]:
                continue
            spec = cls.specs[i]
            if shape.kind is ProfileKind.SHARED:
                if i in used or d[0] < shape.milli or d[1] < shape.gpu_memory_mib:
                    continue
                if spec.replicas > 1 and d[2] >= spec.replicas:
                    continue
                if cls.uniform and d in seen:
                    continue
                seen.add(d)
                state = (
                    d[0] - shape.milli,
                    d[1] - shape.gpu_memory_mib,
                    d[2] + 1,
                    d[3],
                    d[4],
                    d[5],
                    d[6],
                )
                out.append((i, state, (i, shape.milli, shape.gpu_memory_mib, None)))
                continue
            prof = _mig_profile(spec, cls.families[i], shape.mig_profile)
            if prof is None:
                continue
            if spec.mig_instances:
                for inst in d[6]:
                    if inst.profile != shape.mig_profile or (cls.uniform and (d, inst) in seen):
                        continue
                    seen.add((d, inst))
                    out.append((i, _mig_take(d, prof, inst, fixed=True), _mig_pick(i, prof, inst)))
                continue
            me = 1 if mig.media_profile(prof.name) else 0
            for start in mig.free_starts(prof, d[3], d[4], d[5] if me else 0):
                inst = MigInstance(prof.name, start, prof.slots)
                if cls.uniform and (d, start) in seen:
                    continue
                seen.add((d, start))
                out.append((i, _mig_take(d, prof, inst, fixed=False), _mig_pick(i, prof, inst)))
        return out

    # ------------------------------------------------------------------ scores

    def _score(
        self,
        g: _Group,
        shape: Shape,
        cpu_a: int,
        mem_a: int,
        after: tuple[DevState, ...],
        picks: Choice,
    ) -> Score:
        policy = shape.placement or self.policy
        cls = g.cls
        if policy.startswith("fgd"):
            delta = self._frag(cls, cpu_a, mem_a, after) - self._frag(cls, g.cpu, g.mem, g.devs)
            if policy == "fgd-exact":
                return (delta,)
            coarse = self._coarse(delta, cls.target.total)
            if policy == "fgd" or cls.target.constrained:
                return (coarse, delta)
            return (coarse, *self._bestfit(g, cpu_a, after, picks, FGD_BESTFIT_GPU_WEIGHT), delta)
        if policy == "bestfit":
            return self._bestfit(g, cpu_a, after, picks, BESTFIT_GPU_WEIGHT)
        if policy in ("random", "firstfit"):
            return ()
        idle_b = _idle(cls, g.devs)
        idle_a = _idle(cls, after)
        dev_left = _dev_left(g, picks)
        if policy == "dotprod":
            dot = 0
            if cls.cpu_milli:
                dot += shape.cpu_milli * g.cpu * 10**9 // (cls.cpu_milli * cls.cpu_milli)
            if cls.gpu_milli:
                dot += (idle_b - idle_a) * idle_b * 10**9 // (cls.gpu_milli * cls.gpu_milli)
            return (-dot, dev_left)
        if policy == "spread":
            used_gpu = (cls.gpu_milli - idle_a) * 10**6 // cls.gpu_milli if cls.gpu_milli else 0
            used_cpu = (cls.cpu_milli - cpu_a) * 10**6 // cls.cpu_milli if cls.cpu_milli else 0
            return (used_gpu, used_cpu, -dev_left)
        tier = 1 if idle_b < cls.gpu_milli or g.cpu < cls.cpu_milli else 2
        if policy == "packing":
            if shape.kind is not ProfileKind.WHOLE and any(
                g.devs[p[0]][0] < WHOLE_GPU_MILLI for p in picks
            ):
                tier = 0
            return (tier, idle_a, dev_left)
        # clustering
        if shape.kind is ProfileKind.SHARED:
            for p in picks:
                used = WHOLE_GPU_MILLI - g.devs[p[0]][0]
                if used > 0 and shape.milli > 0 and used % shape.milli == 0:
                    tier = 0
        elif shape.count > 0 and any(d[0] == 0 for d in g.devs):
            tier = 0
        return (tier, idle_a, dev_left)

    def _coarse(self, delta: int, weight_total: int) -> int:
        """The FGD artifact's node score, negated: -int(100 · sigmoid(-ΔF / 1000)), ΔF in milli-GPU."""
        x = delta / (WHOLE_GPU_MILLI * weight_total)
        if x > 700:
            return 0
        return -int(100 / (1 + math.exp(x)))

    def _bestfit(
        self, g: _Group, cpu_a: int, after: tuple[DevState, ...], picks: Choice, gpu_weight: int
    ) -> Score:
        """`cpu_left + gpu_weight × gpu_left` after placement, then the fullest device."""
        return (cpu_a + gpu_weight * _idle(g.cls, after), _dev_left(g, picks))

    def _frag(self, cls: _Class, cpu: int, mem: int, devs: tuple[DevState, ...]) -> int:
        key = (
            cls.id,
            bisect.bisect_right(self._cpu_thresholds, cpu),
            bisect.bisect_right(self._mem_thresholds, mem),
            devs,
        )
        f = self._frag_memo.get(key)
        if f is None:
            f = self._frag_memo[key] = self._frag_compute(cls, cpu, mem, devs)
        return f

    def _frag_compute(self, cls: _Class, cpu: int, mem: int, devs: tuple[DevState, ...]) -> int:
        idles = [d[0] if spec.healthy else 0 for spec, d in zip(cls.specs, devs, strict=True)]
        total = sum(idles)
        if total == 0:
            return 0
        frag = 0
        memo = self._unit_frag
        key = (cls.token, devs)
        units = memo.get(key)
        if units is None:
            if len(memo) >= _EVALUATED_MAX:
                memo.clear()
            units = memo[key] = {}
        # (the target shapes that need more CPU or memory than is left lose every idle GPU)
        blocked = 0
        for cpu_m, mem_m, w, m, mid in cls.target.rows:
            if cpu < cpu_m or mem < mem_m:
                blocked += w
                continue
            f = units.get(m)
            if f is None:
                f = units[m] = self._unit_frag_compute(cls, m, mid, devs, idles, total)
            frag += w * f
        return frag + blocked * total

    def _unit_frag_compute(
        self,
        cls: _Class,
        m: Shape,
        mid: int,
        devs: tuple[DevState, ...],
        idles: list[int],
        total: int,
    ) -> int:
        """The idle GPU of `devs` that target shape `m` cannot use (CPU and memory aside)."""
        ok = self._eligible(cls, m, mid)
        if m.count <= 0 or ok is None:
            return total
        usable = 0
        lost = 0
        for i, d in enumerate(devs):
            if ok[i] and _unit_fits(cls, i, d, m):
                usable += 1
            else:
                lost += idles[i]
        return lost if usable >= m.count else total


def _idle(cls: _Class, devs: tuple[DevState, ...]) -> int:
    return sum(d[0] for spec, d in zip(cls.specs, devs, strict=True) if spec.healthy)


def _dev_left(g: _Group, picks: Choice) -> int:
    """Idle milli left on the devices a choice touches (small: the fullest devices)."""
    return sum(g.devs[p[0]][0] - p[1] for p in picks)


def _mig_profile(spec: Device, family: mig.MigFamily | None, name: str) -> mig.MigProfile | None:
    return fit.mig_profile(family, name)


def _mig_pick(pos: int, prof: mig.MigProfile, inst: MigInstance) -> Pick:
    return (pos, prof.compute * WHOLE_GPU_MILLI // prof.gpu_compute, prof.memory_mib, inst)


def _mig_take(d: DevState, prof: mig.MigProfile, inst: MigInstance, *, fixed: bool) -> DevState:
    compute = d[4] + prof.compute
    me = d[5] + (1 if mig.media_profile(prof.name) else 0)
    free = tuple(i for i in d[6] if i != inst) if fixed else d[6]
    return (
        _mig_idle(compute, prof.gpu_compute),
        d[1] - prof.memory_mib,
        d[2],
        d[3] | prof.mask(inst.start),
        compute,
        me,
        free,
    )


def _unit_fits(cls: _Class, i: int, d: DevState, m: Shape) -> bool:
    """Whether one unit of target shape `m` fits on device `i` in state `d` (eligibility aside)."""
    if m.kind is ProfileKind.WHOLE:
        return d[0] == WHOLE_GPU_MILLI and d[2] == 0 and d[3] == 0
    spec = cls.specs[i]
    if m.kind is ProfileKind.SHARED:
        return (
            d[0] >= m.milli
            and d[1] >= m.gpu_memory_mib
            and (spec.replicas <= 1 or d[2] < spec.replicas)
        )
    prof = _mig_profile(spec, cls.families[i], m.mig_profile)
    if prof is None:
        return False
    if spec.mig_instances:
        return any(inst.profile == m.mig_profile for inst in d[6])
    return bool(mig.free_starts(prof, d[3], d[4], d[5] if mig.media_profile(prof.name) else 0))


def _apply_grant(spec: Device, d: DevState, g: DeviceGrant, sign: int) -> DevState:
    """A device's state after taking (`sign=-1`) or giving back (`+1`) one grant."""
    if g.mig is not None:
        inst = g.mig
        compute = mig_compute_slices(inst.profile)
        mask = ((1 << inst.size) - 1) << inst.start
        me = 1 if mig.media_profile(inst.profile) else 0
        family = mig.family_for(spec.model, spec.memory_mib)
        slices = family.compute_slices if family is not None else mig.COMPUTE_SLICES
        mem = g.gpu_memory_mib
        if sign < 0:
            free = tuple(i for i in d[6] if i != inst)
            c = d[4] + compute
            return (_mig_idle(c, slices), d[1] - mem, d[2], d[3] | mask, c, d[5] + me, free)
        free = d[6]
        if inst in spec.mig_instances and inst not in free:
            free = tuple(sorted((*free, inst), key=lambda i: (i.start, i.profile)))
        c = d[4] - compute
        return (_mig_idle(c, slices), d[1] + mem, d[2], d[3] & ~mask, c, d[5] - me, free)
    shared = g.milli < WHOLE_GPU_MILLI
    mem = g.gpu_memory_mib if shared else spec.memory_mib
    slices = d[2] - sign if shared else d[2]
    return (d[0] + sign * g.milli, d[1] + sign * mem, slices, d[3], d[4], d[5], d[6])
