"""Device packer: fit in every dimension, MIG, multi-GPU, gangs, policies, properties."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.packer import DEFAULT_POLICY, POLICIES, ClusterState, target_workload
from scheduling.types import (
    Device,
    MigInstance,
    Node,
    Partitioning,
    Placement,
    ProfileKind,
    Shape,
    Taint,
)

TS = Partitioning.TIME_SLICING


def node(
    name: str,
    gpus: int = 1,
    model: str = "T4",
    *,
    cpu: int = 32000,
    mem: int = 65536,
    partitioning: Partitioning = Partitioning.EXCLUSIVE,
    replicas: int = 1,
    memory_mib: int = 16384,
    mig: tuple[MigInstance, ...] = (),
    unhealthy: tuple[int, ...] = (),
    **kw: object,
) -> Node:
    devices = tuple(
        Device(i, model, memory_mib, partitioning, replicas, mig, healthy=i not in unhealthy)
        for i in range(gpus)
    )
    return Node(name, "p", cpu, mem, devices, **kw)  # type: ignore[arg-type]


def whole(count: int = 1, **kw: object) -> Shape:
    return Shape(ProfileKind.WHOLE, count, **kw)  # type: ignore[arg-type]


def shared(milli: int, mem: int = 0, **kw: object) -> Shape:
    return Shape(ProfileKind.SHARED, 1, milli, mem, **kw)  # type: ignore[arg-type]


def migp(profile: str, count: int = 1) -> Shape:
    return Shape(ProfileKind.MIG, count, mig_profile=profile)


def place(state: ClusterState, shape: Shape) -> Placement | None:
    p = state.find(shape)
    if p is not None:
        state.take(p)
    return p


# ---------------------------------------------------------------------- fit


@pytest.mark.parametrize(
    ("n", "shape", "fits"),
    [
        (node("a"), whole(), True),
        (node("a"), whole(2), False),
        (node("a", 2), whole(2), True),
        (node("a", cpu=1000), whole(cpu_milli=2000), False),
        (node("a", mem=1000), whole(memory_mib=2000), False),
        (node("a"), whole(gpu_models=frozenset({"V100M16", "V100M32"})), False),
        (node("a", model="V100M32"), whole(gpu_models=frozenset({"V100M16", "V100M32"})), True),
        (node("a", ready=False), whole(), False),
        (node("a", cordoned=True), whole(), False),
        (node("a", unhealthy=(0,)), whole(), False),
        (node("a", 2, unhealthy=(0,)), whole(), True),
        (node("a", taints=(Taint("gpu", "x"),)), whole(), False),
        (node("a", taints=(Taint("gpu", "x"),)), whole(tolerations=(Taint("gpu"),)), True),
        (node("a", taints=(Taint("gpu", "x", "PreferNoSchedule"),)), whole(), True),
        (node("a"), shared(500), False),  # exclusive devices are not shared
        (node("a", partitioning=TS), shared(500), True),
        (node("a", partitioning=TS), shared(500, mem=20000), False),
        (node("a", partitioning=Partitioning.MIG), whole(), False),
        (node("a", model="A100-SXM4-40GB", partitioning=Partitioning.MIG), migp("3g.20gb"), True),
        (node("a", model="A100-SXM4-40GB", partitioning=Partitioning.MIG), migp("3g.40gb"), False),
        (node("a", gpus=0, cpu=4000), whole(0, cpu_milli=4000), True),
    ],
)
def test_fit(n: Node, shape: Shape, fits: bool) -> None:
    for policy in POLICIES:
        assert (ClusterState([n], policy).find(shape) is not None) is fits, policy


def test_unhealthy_device_is_skipped() -> None:
    state = ClusterState([node("a", 2, unhealthy=(0,))])
    p = state.find(whole())
    assert p is not None and p.pods[0].grants[0].device == 1


def test_shared_share_memory_and_replicas() -> None:
    state = ClusterState([node("a", partitioning=TS)])
    assert place(state, shared(600)) and place(state, shared(400))
    assert state.find(shared(1)) is None and state.find(whole()) is None
    capped = ClusterState([node("a", partitioning=TS, replicas=2)])
    assert place(capped, shared(100)) and place(capped, shared(100))
    assert capped.find(shared(100)) is None  # two replicas, both handed out
    mem = ClusterState([node("a", partitioning=TS)])
    assert place(mem, shared(100, mem=10000))
    assert mem.find(shared(100, mem=8000)) is None
    assert mem.find(shared(100, mem=6000)) is not None


def test_take_give_round_trip() -> None:
    state = ClusterState([node("a", 2, partitioning=TS)])
    before = state.free_capacity("a")
    p = place(state, shared(300))
    assert p is not None and state.free_capacity("a") != before
    state.give(p)
    assert state.free_capacity("a") == before


# ---------------------------------------------------------------------- MIG


def a100(name: str = "a", mig: tuple[MigInstance, ...] = (), gpus: int = 1) -> Node:
    return node(
        name,
        gpus,
        "NVIDIA-A100-SXM4-40GB",
        partitioning=Partitioning.MIG,
        memory_mib=40960,
        mig=mig,
    )


@pytest.mark.parametrize(
    ("profiles", "last_fits"),
    [
        (["4g.20gb", "3g.20gb"], True),
        (["3g.20gb", "3g.20gb"], True),
        (["3g.20gb", "3g.20gb", "1g.5gb"], False),
        (["4g.20gb", "4g.20gb"], False),
        (["1g.5gb"] * 7, True),
        (["1g.5gb"] * 8, False),
        (["7g.40gb", "1g.5gb"], False),
    ],
)
def test_dynamic_mig_geometry(profiles: list[str], last_fits: bool) -> None:
    state = ClusterState([a100()])
    for profile in profiles[:-1]:
        assert place(state, migp(profile)) is not None, profile
    assert (place(state, migp(profiles[-1])) is not None) is last_fits


def test_dynamic_mig_instances_do_not_overlap_and_give_back() -> None:
    state = ClusterState([a100()])
    p1 = place(state, migp("3g.20gb"))
    p2 = place(state, migp("3g.20gb"))
    assert p1 and p2
    starts = {p1.pods[0].grants[0].mig.start, p2.pods[0].grants[0].mig.start}  # type: ignore[union-attr]
    assert starts == {0, 4}
    state.give(p1)
    assert place(state, migp("3g.20gb")) is not None


def test_fixed_mig_layout_hands_out_existing_instances() -> None:
    layout = (
        MigInstance("1g.5gb", 0, 1),
        MigInstance("1g.5gb", 1, 1),
        MigInstance("2g.10gb", 2, 2),
        MigInstance("3g.20gb", 4, 4),
    )
    state = ClusterState([a100(mig=layout)])
    assert state.find(migp("4g.20gb")) is None  # not in the layout
    got = [place(state, migp("1g.5gb")) for _ in range(3)]
    assert got[0] and got[1] and got[2] is None
    assert {p.pods[0].grants[0].mig for p in got[:2] if p} == set(layout[:2])
    p = place(state, migp("3g.20gb"))
    assert p is not None and p.pods[0].grants[0].mig == layout[3]
    state.give(p)
    assert state.find(migp("3g.20gb")) is not None


def test_mig_count_several_instances() -> None:
    state = ClusterState([a100()])
    p = place(state, migp("1g.5gb", 3))
    assert p is not None and len({g.mig.start for g in p.pods[0].grants if g.mig}) == 3


# ---------------------------------------------------------------------- multi-GPU and gangs


def test_multi_gpu_prefers_best_interconnect() -> None:
    nodes = [
        node("a", 8, interconnect="pcie"),
        node("b", 8, interconnect="nvswitch"),
        node("c", 8, interconnect="nvlink"),
    ]
    for policy in POLICIES:
        state = ClusterState(nodes, policy)
        p = state.find(whole(4))
        assert p is not None and p.nodes == ("b",), policy
        assert len({g.device for g in p.pods[0].grants}) == 4


def test_multi_gpu_stays_on_one_node() -> None:
    state = ClusterState([node("a", 2), node("b", 2)])
    assert state.find(whole(3)) is None
    assert state.find(whole(2)) is not None


def test_gang_all_or_nothing() -> None:
    state = ClusterState([node("a", 2), node("b", 2), node("c", 2)])
    assert place(state, whole(1)) is not None
    before = {n: state.free_capacity(n) for n in "abc"}
    assert state.find(whole(2, pods=3)) is None
    assert {n: state.free_capacity(n) for n in "abc"} == before
    p = state.find(whole(1, pods=3))
    assert p is not None and sorted(p.nodes) == ["a", "b", "c"]
    assert {n: state.free_capacity(n) for n in "abc"} == before  # find commits nothing


def test_accept_filter() -> None:
    state = ClusterState([node("a"), node("b")])
    p = state.find(whole(), accept=lambda n: n.name == "b")
    assert p is not None and p.nodes == ("b",)
    assert state.find(whole(), accept=lambda n: False) is None


def test_pools_filter_skips_other_pools_without_asking_accept() -> None:
    # Nodes of two pools, interleaved by name: `pools` answers as `accept` alone does,
    # and `accept` is never asked about a node of another pool (a tick's named pool).
    nodes = [
        Node(f"n{i:02d}", ("p", "q")[i % 2], 32000, 65536, (Device(0, "T4", 16384),))
        for i in range(20)
    ]
    state = ClusterState(nodes)
    asked: list[str] = []

    def in_q(n: Node) -> bool:
        asked.append(n.pool)
        return n.pool == "q" and n.name != "n01"

    for shape in (whole(), Shape(ProfileKind.WHOLE, 1, pods=2)):
        asked.clear()
        alone = state.find(shape, accept=lambda n: n.pool == "q" and n.name != "n01")
        assert alone is not None and alone == state.find(shape, accept=in_q, pools=("q",))
        assert set(asked) == {"q"}
    assert state.find(whole(), pools=("p",)).nodes == ("n00",)  # type: ignore[union-attr]
    assert state.find(whole(), pools=("r",)) is None
    # `avoid`: nodes `accept` refuses too, skipped without asking it
    spare = frozenset(f"n{i:02d}" for i in range(0, 20, 2) if i < 12)
    seen: list[str] = []

    def not_spare(n: Node) -> bool:
        seen.append(n.name)
        return n.name not in spare

    found = state.find(whole(), accept=not_spare, pools=("p",), avoid=spare)
    alone = state.find(whole(), accept=lambda n: n.pool == "p" and n.name not in spare)
    assert found is not None and found == alone
    assert found.nodes == ("n12",) and not spare & set(seen)


def test_a_filtered_search_answers_as_the_full_scan_while_groups_come_and_go() -> None:
    # A search with `accept` reads only the groups that can hold the shape, kept as groups
    # are made and emptied (`_fitting`, restarted when mostly gone ones pile up); the
    # search without it scans every group. Both must answer the same, step by step.
    rng = random.Random(7)
    nodes = [node(f"n{i}", 4, partitioning=TS, replicas=4) for i in range(6)]
    state = ClusterState(nodes, DEFAULT_POLICY, shape_weights=[(shared(250), 1)])
    shapes = [shared(250), shared(500), whole(1), whole(2), whole(4), shared(250, pods=2)]
    held: list[Placement] = []
    for _ in range(3000):
        shape = rng.choice(shapes)
        full = state.find(shape)
        assert state.find(shape, accept=lambda n: True) == full
        if full is not None and (rng.random() < 0.6 or not held):
            state.take(full)
            held.append(full)
        elif held:
            state.give(held.pop(rng.randrange(len(held))))
    assert len(state._made) < 3000  # restarted from the live groups on the way


def test_a_kept_state_answers_as_a_new_one_across_target_changes() -> None:
    # A state kept across ticks keeps, per shape, the groups that can hold it when the
    # target workload changes (`retarget`), and scores them anew. Its filtered search
    # must answer as a state built with the new target and the same placements taken.
    rng = random.Random(11)
    nodes = [node(f"n{i}", 4, partitioning=TS, replicas=4) for i in range(6)]
    shapes = [shared(250), shared(500), whole(1), whole(2), whole(4)]
    menus = [
        [(shared(250), 1)],
        [(whole(2), 3), (shared(500), 1)],
        [(whole(4), 1), (shared(250), 5)],
        [(whole(1), 2)],
    ]

    def targets() -> dict[str, list[tuple[Shape, int]]]:
        return {"p": rng.choice(menus)}

    now = targets()
    kept = ClusterState(nodes, DEFAULT_POLICY, pool_shape_weights=now)
    held: list[Placement] = []
    changes = 0
    for _ in range(400):
        if rng.random() < 0.2:
            new = targets()
            changes += new != now
            now = new
            assert kept.retarget(now)
        fresh = ClusterState(nodes, DEFAULT_POLICY, pool_shape_weights=now)
        fresh.take_many(held)
        shape = rng.choice(shapes)
        found = kept.find(shape, accept=lambda n: True, pools=("p",))
        assert found == fresh.find(shape, accept=lambda n: True, pools=("p",))
        if found is not None and (rng.random() < 0.6 or not held):
            kept.take(found)
            held.append(found)
        elif held:
            kept.give(held.pop(rng.randrange(len(held))))
    assert changes > 20 and len(held) > 3


def test_pools_of_the_same_hardware_share_scores_only_with_the_same_target() -> None:
    # A state remembers a group's score per node kind (the node but for its name and
    # pool) and target workload: two pools of the same nodes with other targets must
    # still answer each as a state of their own nodes alone does.
    rng = random.Random(3)
    targets = {"p": [(shared(250), 1)], "q": [(whole(2), 3), (shared(500), 1)]}

    def pool_nodes(pool: str) -> list[Node]:
        return [
            Node(
                f"{pool}{i}",
                pool,
                32000,
                65536,
                tuple(Device(d, "T4", 16384, TS, 4) for d in range(4)),
            )
            for i in range(4)
        ]

    both = ClusterState(pool_nodes("p") + pool_nodes("q"), pool_shape_weights=targets)
    alone = {p: ClusterState(pool_nodes(p), pool_shape_weights=targets) for p in targets}
    shapes = [shared(250), shared(500), whole(1), whole(2)]
    for _ in range(200):
        pool, shape = rng.choice(("p", "q")), rng.choice(shapes)
        found = both.find(shape, accept=lambda n: True, pools=(pool,))
        assert found == alone[pool].find(shape)
        if found is not None:
            both.take(found)
            alone[pool].take(found)


# ---------------------------------------------------------------------- policies


def test_policy_names() -> None:
    assert DEFAULT_POLICY in POLICIES
    assert ClusterState([], "default").policy == DEFAULT_POLICY
    with pytest.raises(ValueError):
        ClusterState([], "nope")
    with pytest.raises(ValueError):
        ClusterState([], tie_break="nope")


def test_name_tie_break_picks_smallest_name() -> None:
    state = ClusterState([node("b"), node("a"), node("c")], "firstfit")
    p = state.find(whole())
    assert p is not None and p.nodes == ("a",)


def test_random_tie_break_is_seeded() -> None:
    nodes = [node(f"n{i}") for i in range(20)]
    picks = [
        ClusterState(nodes, "bestfit", tie_break="random", seed=s).find(whole()) for s in (1, 1, 2)
    ]
    assert picks[0] == picks[1]
    seen = {ClusterState(nodes, "random", seed=s).find(whole()).nodes for s in range(10)}  # type: ignore[union-attr]
    assert len(seen) > 1


def test_bestfit_and_spread_disagree() -> None:
    nodes = [node("a", 2), node("b", 2)]
    for policy, want in (("bestfit", "a"), ("spread", "b"), ("packing", "a")):
        state = ClusterState(nodes, policy)
        place(state, whole(1, cpu_milli=1000))  # goes to "a" (tie -> smallest name)
        p = state.find(whole(1))
        assert p is not None and p.nodes == (want,), policy


def test_fgd_keeps_whole_gpus_for_a_whole_gpu_workload() -> None:
    # Target workload: whole GPUs. A 500 slice should go on the device already half used.
    nodes = [node("a", 2, partitioning=TS), node("b", 2, partitioning=TS)]
    for policy in ("fgd", "fgd-bestfit", "fgd-exact"):
        state = ClusterState(nodes, policy, shape_weights={whole(1): 1})
        place(state, shared(500))
        p = state.find(shared(500))
        assert p is not None, policy
        first = state.find(shared(500))
        assert first is not None
        assert state.free_capacity(p.nodes[0])[2].count(1000) >= 1
        state.take(p)
        assert sorted(state.free_capacity(p.nodes[0])[2]) in ([0, 1000],), policy


def test_target_workload_coverage() -> None:
    shapes = [whole(1)] * 90 + [whole(2)] * 6 + [shared(300)] * 4
    assert target_workload(shapes) == [(whole(1), 90), (whole(2), 6)]
    assert target_workload(shapes, coverage_pct=100)[-1] == (shared(300), 4)


def test_learnt_target_workload() -> None:
    state = ClusterState([node("a", 2, partitioning=TS)])
    for _ in range(4):
        state.find(shared(250))
    assert state.shape_weights == [(shared(250), 4)]


# ---------------------------------------------------------------------- properties

CLUSTER = [
    node("e0", 2, cpu=8000, mem=16384),
    node("e1", 4, "V100M32", cpu=16000, mem=32768, interconnect="nvlink"),
    node("t0", 2, partitioning=TS, cpu=8000, mem=16384),
    node(
        "t1",
        2,
        "V100M32",
        partitioning=TS,
        replicas=3,
        cpu=8000,
        mem=16384,
        taints=(Taint("k", "v"),),
    ),
    a100("m0", gpus=2),
    a100(
        "m1",
        mig=(
            MigInstance("4g.20gb", 0, 4),
            MigInstance("2g.10gb", 4, 2),
            MigInstance("1g.5gb", 6, 1),
        ),
    ),
    node("x0", 1, cordoned=True),
]
SHAPES = st.one_of(
    st.builds(
        whole,
        st.integers(0, 4),
        cpu_milli=st.sampled_from([0, 1000, 4000]),
        memory_mib=st.sampled_from([0, 4096]),
    ),
    st.builds(shared, st.sampled_from([100, 250, 500, 800]), st.sampled_from([0, 4000])),
    st.builds(
        migp,
        st.sampled_from(["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb", "1g.10gb"]),
        st.integers(1, 2),
    ),
    st.builds(lambda m: whole(1, gpu_models=frozenset({m})), st.sampled_from(["T4", "V100M32"])),
    st.builds(lambda k: whole(1, tolerations=(Taint("k"),), pods=k), st.integers(1, 3)),
)


def check_invariants(nodes: list[Node], held: list[tuple[Shape, Placement]]) -> None:
    by_name = {n.name: n for n in nodes}
    cpu: dict[str, int] = defaultdict(int)
    mem: dict[str, int] = defaultdict(int)
    milli: dict[tuple[str, int], int] = defaultdict(int)
    slices: dict[tuple[str, int], int] = defaultdict(int)
    gmem: dict[tuple[str, int], int] = defaultdict(int)
    whole_: dict[tuple[str, int], int] = defaultdict(int)
    mig_mask: dict[tuple[str, int], int] = defaultdict(int)
    for shape, p in held:
        assert len(p.pods) == shape.pods and len(set(p.nodes)) == shape.pods
        for pod in p.pods:
            n = by_name[pod.node]
            assert n.ready and not n.cordoned
            assert all(any(t.key == taint.key for t in shape.tolerations) for taint in n.taints)
            cpu[n.name] += pod.cpu_milli
            mem[n.name] += pod.memory_mib
            assert len(pod.grants) == shape.count
            for g in pod.grants:
                d = n.devices[g.device]
                assert d.healthy
                if shape.gpu_models:
                    assert d.model in shape.gpu_models
                key = (n.name, g.device)
                if shape.kind is ProfileKind.MIG:
                    assert d.partitioning is Partitioning.MIG and g.mig is not None
                    assert g.mig.profile == shape.mig_profile
                    if d.mig_instances:
                        assert g.mig in d.mig_instances
                    m = ((1 << g.mig.size) - 1) << g.mig.start
                    assert not mig_mask[key] & m
                    mig_mask[key] |= m
                elif shape.kind is ProfileKind.SHARED:
                    assert d.partitioning is Partitioning.TIME_SLICING
                    milli[key] += g.milli
                    slices[key] += 1
                    gmem[key] += g.gpu_memory_mib
                else:
                    assert d.partitioning is not Partitioning.MIG
                    whole_[key] += 1
    for name, n in by_name.items():
        assert cpu[name] <= n.cpu_milli and mem[name] <= n.memory_mib
        for d in n.devices:
            key = (name, d.index)
            assert whole_[key] <= 1
            assert not (whole_[key] and milli[key])
            assert milli[key] <= 1000 and gmem[key] <= d.memory_mib
            if d.replicas > 1:
                assert slices[key] <= d.replicas


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from([p for p in POLICIES]),
    st.lists(st.tuples(SHAPES, st.integers(0, 9)), min_size=1, max_size=40),
)
def test_never_overcommitted(policy: str, ops: list[tuple[Shape, int]]) -> None:
    state = ClusterState(CLUSTER, policy, seed=7)
    twin = ClusterState(CLUSTER, policy, seed=7)
    held: list[tuple[Shape, Placement]] = []
    for shape, r in ops:
        if r < 3 and held:
            _, p = held.pop(r % len(held))
            state.give(p)
            twin.give(p)
            continue
        p = state.find(shape)
        assert p == twin.find(shape)  # deterministic
        if p is not None:
            state.take(p)
            twin.take(p)
            held.append((shape, p))
        check_invariants(CLUSTER, held)
    for _, p in held:
        state.give(p)
    fresh = ClusterState(CLUSTER, policy)
    assert [state.free_capacity(n.name) for n in CLUSTER] == [
        fresh.free_capacity(n.name) for n in CLUSTER
    ]


def test_fgd_bestfit_weighs_gpu_left_double_bestfit() -> None:
    # CPU-only target workload: every node's F is w × idle GPU, so a CPU-only request has
    # ΔF = 0 everywhere and the BestFit term decides. After placing 2 cores, "a" has 10 cores
    # and 1 GPU left, "b" 28 cores and no GPU: bestfit (16 per milli-GPU) scores 26000 vs
    # 28000, fgd-bestfit (32 per milli-GPU) 42000 vs 28000.
    nodes = [node("a", 1, cpu=12000), node("b", 0, cpu=30000)]
    cpu_only = whole(0, cpu_milli=2000)
    for policy, want in (("bestfit", "a"), ("fgd-bestfit", "b")):
        state = ClusterState(nodes, policy, shape_weights={cpu_only: 1})
        p = state.find(cpu_only)
        assert p is not None and p.nodes == (want,), policy


def test_idle_milli_is_the_sum_of_what_free_capacity_says_through_takes_and_gives() -> None:
    rng = random.Random(5)
    nodes = [node(f"n{i}", 4, partitioning=TS, replicas=4) for i in range(4)]
    state = ClusterState(nodes, DEFAULT_POLICY)
    held: list[Placement] = []
    for _ in range(200):
        found = state.find(rng.choice([shared(250), shared(500), whole(1), whole(2)]))
        if found is not None and rng.random() < 0.6:
            state.take(found)
            held.append(found)
        elif held:
            state.give(held.pop(rng.randrange(len(held))))
        for n in nodes:
            assert state.idle_milli(n.name) == sum(state.free_capacity(n.name)[2])
    assert held
