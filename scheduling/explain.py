"""Reason codes and the sentences a researcher reads for every decision."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from enum import StrEnum

from scheduling.types import ProfileKind, Shape


class Code(StrEnum):
    """Machine-readable reason of a decision, stable for the portal, metrics and tests."""

    #: ADMIT: fits in the team's unused nominal quota and on a node
    FITS = "fits"
    #: ADMIT: fits on a node by borrowing unused quota of other teams (reclaimable)
    BORROWS = "borrows"
    #: WAIT: the team would pass nominal + borrowing limit in every pool it may use
    BORROWING_LIMIT = "borrowing-limit"
    #: WAIT: the team would have to borrow and the cohort has nothing left to lend
    COHORT_EXHAUSTED = "cohort-exhausted"
    #: WAIT: non-preemptible training would eat into the pool's inference floor
    INFERENCE_FLOOR = "inference-floor"
    #: WAIT: quota allows it but no node has the shape free (and nothing may be preempted)
    NO_CAPACITY = "no-capacity"
    #: WAIT: attempts were just preempted to make room for this request
    PREEMPTING = "preempting"
    #: WAIT: attempts preempted earlier still hold the room this request will get
    AWAITING_STOP = "awaiting-stop"
    #: WAIT: requeued after a preemption or a lost node; held until its backoff ends
    BACKOFF = "backoff"
    #: WAIT: no node there now could hold the shape; nodes an autoscaled pool may add could
    AWAITING_NODES = "awaiting-nodes"
    #: WAIT: the named pool is in maintenance
    POOL_MAINTENANCE = "pool-maintenance"
    #: REJECT: the request names a workload class the portal does not define
    UNKNOWN_CLASS = "unknown-class"
    #: REJECT: the request names a pool that does not exist
    UNKNOWN_POOL = "unknown-pool"
    #: REJECT: no node of any pool it may use could hold the shape even when empty
    NEVER_FITS = "never-fits"
    #: PREEMPT: the victim's team runs on capacity it borrowed and the owner wants it back
    RECLAIM = "reclaim"
    #: PREEMPT: the victim is of a lower class band than the preemptor
    PRIORITY = "priority"
    #: PREEMPT: the victim is training on the pool's inference floor and inference needs it
    FLOOR_RECLAIM = "floor-reclaim"
    #: PREEMPT: the preemptor has reached its starvation bound (`Policy.starvation_after`
    #: of its class's maximum queue time); the victim is of the same or a lower band
    STARVATION = "starvation"
    #: PREEMPT: the preemptor is starving and fits only the pool's scarce nodes
    #: (`scheduling.scarce`); the victim holds one of them with work that fits elsewhere
    SCARCE_NODE = "scarce-node"


def gpus(milli: int) -> str:
    """Return a GPU amount for people: 16000 -> "16", 1500 -> "1.5", 1000 -> "1"."""
    whole, rest = divmod(milli, 1000)
    if rest == 0:
        return str(whole)
    return f"{milli / 1000:.3f}".rstrip("0").rstrip(".")


def gpu_noun(milli: int, pool: str = "") -> str:
    """Return "16 GPUs in pool a100"-style text."""
    noun = "GPU" if milli == 1000 else "GPUs"
    return f"{gpus(milli)} {noun}" + (f" in pool {pool}" if pool else "")


@functools.lru_cache(maxsize=4096)
def describe(shape: Shape) -> str:
    """Return what a shape asks for: "8 whole GPUs", "1× 0.46 GPU share", "2× MIG 3g.40gb".
    (Remembered: every waiting request's decision says its shape, twice, every tick.)"""
    if shape.kind is ProfileKind.MIG:
        what = f"{shape.count}× MIG {shape.mig_profile}"
    elif shape.kind is ProfileKind.SHARED:
        what = f"{shape.count}× {gpus(shape.milli)} GPU share"
    elif shape.count == 0:
        what = f"{gpus(shape.cpu_milli)} CPUs"
    else:
        what = f"{shape.count} whole GPU" + ("s" if shape.count != 1 else "")
    return what + (f" on each of {shape.pods} nodes" if shape.pods > 1 else "")


def where(pools: Sequence[str]) -> str:
    if len(pools) == 1:
        return f"pool {pools[0]}"
    return "any production pool" if not pools else "pools " + ", ".join(pools)


def quota_sentence(code: str, facts: dict[str, object]) -> str:
    """Return why quota holds a request back, e.g. the borrowing-limit case:

    "team vision uses 16 of 16 guaranteed GPUs in pool a100 and may borrow 0 more".
    """
    team, pool = facts["team"], facts["pool"]
    used = int(str(facts["used_milli"]))
    nominal = int(str(facts["nominal_milli"]))
    head = f"team {team} uses {gpus(used)} of {gpus(nominal)} guaranteed GPUs in pool {pool}"
    if code == Code.BORROWING_LIMIT:
        # `may_borrow_milli` is all the team may still take: below its guarantee, part of
        # that is its own, and "may borrow N more" would read as N beyond the guarantee.
        may = int(str(facts.get("may_borrow_milli") or 0))
        own = max(0, nominal - used)
        if own:
            return f"{head} and may borrow {gpus(max(0, may - own))} beyond them: {gpus(may)} more in all"
        return f"{head} and may borrow {gpus(may)} more"
    if code == Code.COHORT_EXHAUSTED:
        free = int(str(facts.get("cohort_free_milli") or 0))
        return f"{head} and other teams have only {gpus(free)} GPUs left to lend"
    floor = int(str(facts.get("floor_milli") or 0))
    return (
        f"pool {pool} keeps {gpu_noun(floor)} for production inference and this class "
        "cannot be preempted, so it may not use them"
    )


def reclaim_sentence(victims: dict[str, int], reason: str) -> str:
    """Return "4 GPUs lent to nlp will be reclaimed"-style text for a victim set."""
    parts = [f"{gpu_noun(m)} of {team}" for team, m in sorted(victims.items())]
    if reason == Code.RECLAIM:
        lent = [f"{gpu_noun(m)} lent to {team}" for team, m in sorted(victims.items())]
        return ", ".join(lent) + " will be reclaimed"
    if reason == Code.FLOOR_RECLAIM:
        return ", ".join(parts) + " on the inference floor will be preempted"
    if reason == Code.STARVATION:
        return ", ".join(parts) + " will be preempted: it has waited its class's maximum queue time"
    if reason == Code.SCARCE_NODE:
        return (
            ", ".join(parts) + " will be preempted: it holds one of the few nodes that can hold "
            "this request, and could run elsewhere"
        )
    return ", ".join(parts) + " of a lower class will be preempted"
