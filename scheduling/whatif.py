"""What-if: a site's own history replayed under its current and a proposed setting.

The portal (portal/tick/whatif.py) reads the last N days of requests (real arrivals, shapes,
durations) and the site as the tick sees it (`Site`: nodes, pools, classes, teams,
quotas, the active profile's `Policy`); `apply_settings` makes the proposed site from
`KEY=VALUE` changes; `replay` runs the jobs through `schedule()` in the replay
simulator (scheduling/simulate.py: departures, requeues with backoff, checkpoints,
ticks), and `summarize` measures, overall and per team and class:
wait p50/p95/max, utilization, preemptions, GPU-hours lost, and each team's share
against its entitlement.

Keys (`apply_settings`), GPUs as decimals (0.5 = 500 milli):

- `quota.<team>.<pool>` or `quota.<team>.<pool>.nominal` = GPUs;
  `quota.<team>.<pool>.borrowing` / `.lending` = GPUs or `none` (no limit);
- `class.<name>.band` / `.min_runtime_s` / `.max_queue_s` = integer;
  `class.<name>.preemption` = never | when-borrowing | always;
- `policy.<knob>` = a `Policy` field (the profile's knobs: `preempt_after_s`, ...);
- `pool.<name>.nodes` = how many nodes (more: copies of its first node);
  `pool.<name>.inference_floor` = GPUs.
"""

from __future__ import annotations

import math
import multiprocessing
import random
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, fields, replace
from typing import Any

from scheduling.cycle import remembering
from scheduling.simulate import Job, Outcome, Simulation, drive
from scheduling.types import (
    WHOLE_GPU_MILLI,
    Node,
    Policy,
    Pool,
    PoolWorkload,
    PreemptionPolicy,
    Quota,
    Team,
    WorkloadClass,
)

#: after the window ends, how long the replay goes on for the work still queued
DRAIN_MS = 24 * 3600 * 1000


class SettingError(ValueError):
    """A `KEY=VALUE` that names nothing, or a value of the wrong kind; `key` says which."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


@dataclass(frozen=True)
class Site:
    nodes: tuple[Node, ...]
    pools: tuple[Pool, ...]
    classes: tuple[WorkloadClass, ...]
    teams: tuple[Team, ...]
    quotas: tuple[Quota, ...]
    policy: Policy
    workloads: tuple[PoolWorkload, ...] | None = None

    @property
    def capacity_milli(self) -> int:
        return sum(WHOLE_GPU_MILLI * len(n.devices) for n in self.nodes)


# -- proposed settings -----------------------------------------------------------------


def _milli(key: str, value: str, none_ok: bool = False) -> int | None:
    if none_ok and value.strip().lower() in ("none", "unlimited", ""):
        return None
    try:
        gpus = float(value)
    except ValueError:
        raise SettingError(key, f"expected a number of GPUs, got {value!r}") from None
    if gpus < 0 or math.isnan(gpus) or math.isinf(gpus):
        raise SettingError(key, "must be zero or more GPUs")
    return int(round(gpus * WHOLE_GPU_MILLI))


def _int(key: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise SettingError(key, f"expected an integer, got {value!r}") from None


def _cast(key: str, current: Any, value: str) -> Any:
    if isinstance(current, bool):
        if value.lower() not in ("true", "false", "1", "0"):
            raise SettingError(key, f"expected true or false, got {value!r}")
        return value.lower() in ("true", "1")
    if isinstance(current, int):
        return _int(key, value)
    if isinstance(current, float):
        try:
            return float(value)
        except ValueError:
            raise SettingError(key, f"expected a number, got {value!r}") from None
    if isinstance(current, str):
        return value
    raise SettingError(key, "cannot be set here")


def apply_settings(site: Site, settings: Mapping[str, str]) -> Site:
    """The site with `settings` applied (see the module's docstring for the keys)."""
    for key, value in settings.items():
        site = _apply_one(site, key, value)
    return site


def _apply_one(site: Site, key: str, value: str) -> Site:
    head, _, rest = key.partition(".")
    if head == "quota":
        return _set_quota(site, key, rest, value)
    if head == "class":
        return _set_class(site, key, rest, value)
    if head == "policy":
        knobs = {f.name for f in fields(Policy)}
        if rest not in knobs:
            raise SettingError(key, f"no such policy knob (one of {', '.join(sorted(knobs))})")
        return replace(
            site,
            policy=replace(site.policy, **{rest: _cast(key, getattr(site.policy, rest), value)}),
        )
    if head == "pool":
        return _set_pool(site, key, rest, value)
    raise SettingError(key, "unknown setting (quota., class., policy. or pool.)")


def _set_quota(site: Site, key: str, rest: str, value: str) -> Site:
    parts = rest.split(".")
    if len(parts) == 2:
        parts.append("nominal")
    if len(parts) != 3 or parts[2] not in ("nominal", "borrowing", "lending"):
        raise SettingError(key, "expected quota.<team>.<pool>[.nominal|.borrowing|.lending]")
    team, pool, what = parts
    if team not in {t.name for t in site.teams}:
        raise SettingError(key, f"no team {team!r}")
    if pool not in {p.name for p in site.pools}:
        raise SettingError(key, f"no pool {pool!r}")
    milli = _milli(key, value, none_ok=what != "nominal")
    quotas = list(site.quotas)
    idx = next((i for i, q in enumerate(quotas) if (q.team, q.pool) == (team, pool)), None)
    q = quotas[idx] if idx is not None else Quota(team, pool, 0)
    if what == "nominal":
        q = replace(q, nominal_milli=milli or 0)
    elif what == "borrowing":
        q = replace(q, borrowing_limit_milli=milli)
    else:
        q = replace(q, lending_limit_milli=milli)
    if idx is None:
        quotas.append(q)
    else:
        quotas[idx] = q
    return replace(site, quotas=tuple(quotas))


def _set_class(site: Site, key: str, rest: str, value: str) -> Site:
    name, _, what = rest.partition(".")
    classes = {c.name: c for c in site.classes}
    if name not in classes:
        raise SettingError(key, f"no workload class {name!r}")
    cls = classes[name]
    if what == "preemption":
        try:
            new = replace(cls, preemption=PreemptionPolicy(value))
        except ValueError:
            raise SettingError(key, "expected never, when-borrowing or always") from None
    elif what == "band":
        new = replace(cls, band=_int(key, value))
    elif what == "min_runtime_s":
        new = replace(cls, min_runtime_s=_int(key, value))
    elif what == "max_queue_s":
        new = replace(cls, max_queue_s=_int(key, value))
    else:
        raise SettingError(key, "expected class.<name>.band|preemption|min_runtime_s|max_queue_s")
    return replace(site, classes=tuple(new if c.name == name else c for c in site.classes))


def _set_pool(site: Site, key: str, rest: str, value: str) -> Site:
    name, _, what = rest.partition(".")
    if name not in {p.name for p in site.pools}:
        raise SettingError(key, f"no pool {name!r}")
    if what == "inference_floor":
        milli = _milli(key, value) or 0
        pools = tuple(
            replace(p, inference_floor_milli=milli) if p.name == name else p for p in site.pools
        )
        return replace(site, pools=pools)
    if what != "nodes":
        raise SettingError(key, "expected pool.<name>.nodes or pool.<name>.inference_floor")
    want = _int(key, value)
    if want < 0:
        raise SettingError(key, "must be zero or more nodes")
    own = [n for n in site.nodes if n.pool == name]
    others = [n for n in site.nodes if n.pool != name]
    if want > len(own) and not own:
        raise SettingError(key, f"pool {name!r} has no node to copy")
    kept = own[:want] + [
        replace(own[0], name=f"{own[0].name}-whatif-{i + 1}") for i in range(want - len(own))
    ]
    return replace(site, nodes=tuple(others + kept))


# -- replay and measurement ------------------------------------------------------------


def replay(
    site: Site,
    jobs: Sequence[Job],
    *,
    end_ms: int,
    tick_ms: int = 10_000,
    seed: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> Outcome:
    """Replay `jobs` on `site` through `schedule()`; work still queued `DRAIN_MS` after
    `end_ms` is left waiting (it counts as waiting until then)."""
    ordered = sorted(jobs, key=lambda j: (j.arrival_ms, j.id))
    sim = Simulation(
        nodes=site.nodes,
        jobs={j.id: j for j in ordered},
        teams=site.teams,
        quotas=site.quotas,
        policy=site.policy,
        rng=random.Random(seed + 1),
        pools=site.pools,
        classes=site.classes,
        workloads=site.workloads,
        rejects_ok=True,
        node_pool={n.name: n.pool for n in site.nodes},
    )
    # Each tick's schedule() starts from scratch; much of what it computes comes back
    # tick after tick, so the replay keeps it (`cycle.remembering`; the same decisions).
    with remembering():
        return drive(sim, ordered, tick_ms, until_ms=end_ms + DRAIN_MS, progress=progress)


def _pct(values: Sequence[float], pct: int) -> float:
    if not values:
        return 0.0
    return values[min(len(values) - 1, max(0, math.ceil(pct / 100 * len(values)) - 1))]


def _waits(values: Iterable[float]) -> dict[str, Any]:
    ordered = sorted(values)
    return {
        "requests": len(ordered),
        "wait_p50_s": round(_pct(ordered, 50), 1),
        "wait_p95_s": round(_pct(ordered, 95), 1),
        "wait_max_s": round(ordered[-1], 1) if ordered else 0.0,
    }


def summarize(
    site: Site, jobs: Sequence[Job], out: Outcome, start_ms: int, end_ms: int
) -> dict[str, Any]:
    """Overall and per team (and class) figures of one replay over [start_ms, end_ms]."""
    horizon = end_ms + DRAIN_MS
    span = max(1, end_ms - start_ms)
    capacity = max(1, site.capacity_milli)
    rejected = set(out.rejected)
    waits: dict[tuple[str, str], list[float]] = defaultdict(list)
    for j in jobs:
        if j.id in rejected:
            continue
        started = out.first_start_ms.get(j.id, horizon)
        waits[(j.team, j.cls)].append(max(0, started - j.arrival_ms) / 1000)
    received: dict[str, float] = defaultdict(float)
    for team, milli, start, end, _useful in out.intervals:
        received[team] += milli * max(0, min(end, end_ms) - max(start, start_ms))
    nominal: dict[str, int] = defaultdict(int)
    for q in site.quotas:
        nominal[q.team] += q.nominal_milli
    total_nominal = sum(nominal.values()) or 1

    overall = _waits(w for ws in waits.values() for w in ws)
    overall.update(
        {
            "utilization_pct": round(100 * sum(received.values()) / (capacity * span), 2),
            "preemptions": out.preemptions,
            "gpu_hours_lost": round(out.lost_milli_ms / 1000 / 3_600_000, 2),
            "never_started": sum(
                1 for j in jobs if j.id not in out.first_start_ms and j.id not in rejected
            ),
            "rejected": len(rejected),
            "capacity_gpus": capacity / WHOLE_GPU_MILLI,
        }
    )
    teams: dict[str, Any] = {}
    names = sorted({t.name for t in site.teams} | {team for team, _ in waits})
    for team in names:
        mine = {cls: ws for (t, cls), ws in waits.items() if t == team}
        row = _waits(w for ws in mine.values() for w in ws)
        row.update(
            {
                "utilization_pct": round(100 * received[team] / (capacity * span), 2),
                "preemptions": out.preempted_by_team.get(team, 0),
                "gpu_hours_lost": round(out.lost_by_team.get(team, 0) / 1000 / 3_600_000, 2),
                # share of the GPU-time delivered in the window, and of the nominal quota
                "share_pct": round(100 * received[team] / (sum(received.values()) or 1), 2),
                "entitlement_pct": round(100 * nominal[team] / total_nominal, 2),
                "classes": {cls: _waits(ws) for cls, ws in sorted(mine.items())},
            }
        )
        teams[team] = row
    return {"overall": overall, "teams": teams}


def _side(
    site: Site,
    *,
    jobs: Sequence[Job],
    start_ms: int,
    end_ms: int,
    tick_ms: int,
    seed: int,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    out = replay(site, jobs, end_ms=end_ms, tick_ms=tick_ms, seed=seed, progress=progress)
    return summarize(site, jobs, out, start_ms, end_ms)


def _forked() -> ProcessPoolExecutor | None:
    """A one-process pool forked from this one, or None where that is not allowed (a
    daemon process may not have children) or possible."""
    if multiprocessing.current_process().daemon:
        return None
    if "fork" not in multiprocessing.get_all_start_methods():
        return None
    return ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("fork"))


def compare(
    current: Site,
    proposed: Site,
    jobs: Sequence[Job],
    *,
    start_ms: int,
    end_ms: int,
    tick_ms: int = 10_000,
    seed: int = 1,
    progress: Callable[[int, int], None] | None = None,
    parallel: bool = False,
) -> dict[str, Any]:
    """Both replays, as `{"current": {...}, "proposed": {...}, "teams": {team: {"current":
    {...}, "proposed": {...}}}}`.

    `parallel`: replay the current settings in a forked process while this one replays
    the proposed ones (they are independent; progress then follows the proposed one).
    Where no child may be forked, one after the other."""
    kw: dict[str, Any] = {
        "jobs": jobs,
        "start_ms": start_ms,
        "end_ms": end_ms,
        "tick_ms": tick_ms,
        "seed": seed,
    }
    pool = _forked() if parallel else None
    if pool is not None:
        with pool:
            pending = pool.submit(_side, current, **kw)
            b = _side(proposed, progress=progress, **kw)
            a = pending.result()
    else:
        total = 2 * len(jobs)

        def step(offset: int) -> Callable[[int, int], None] | None:
            if progress is None:
                return None
            return lambda done, _n: progress(offset + done, total)

        a = _side(current, progress=step(0), **kw)
        b = _side(proposed, progress=step(len(jobs)), **kw)
    if progress is not None:
        progress(1, 1)
    teams = sorted(set(a["teams"]) | set(b["teams"]))
    return {
        "current": a["overall"],
        "proposed": b["overall"],
        "teams": {
            t: {"current": a["teams"].get(t, {}), "proposed": b["teams"].get(t, {})} for t in teams
        },
    }
