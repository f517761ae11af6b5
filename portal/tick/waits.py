"""Where the wait went: each pending request's wait split by reason.

The tick classifies every WAIT decision (`reason_of`) and keeps, per request, the
reason of the open stretch of waiting and when it began (`GpuRequest.wait_reason`,
`wait_since`). When the reason changes, or the request is admitted, the stretch is
folded into that reason's seconds (`wait_<reason>_s`): only requests whose reason
changed are written, in the tick's one bulk update, so a long queue costs no extra
statements. A stretch that began before the first tick saw the request (submitted
between ticks) counts for the first reason the tick gives.

- `unschedulable`: no node there now could ever hold it (its pool is in maintenance,
  or only nodes an autoscaled pool has not yet been asked for could);
- `quota`: held by its team's quota, borrowing limit, the inference floor or its
  member cap;
- `capacity`: its quota allows it; waiting for running work to end (or be preempted);
- `provisioning`: nodes are being added for it (a `NodeProvision` names it);
- `backoff`: requeued after a preemption or a lost node, held until its backoff ends.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count, DurationField, ExpressionWrapper, F, Q, QuerySet, Sum, Value
from django.db.models.fields import DateTimeField

from portal.models import GpuRequest

REASONS = ("unschedulable", "quota", "capacity", "provisioning", "backoff")
FIELDS = tuple(f"wait_{r}_s" for r in REASONS)

_QUOTA = frozenset({"borrowing-limit", "cohort-exhausted", "inference-floor", "member-cap"})
_BACKOFF = frozenset({"backoff", "requeued"})
_UNSCHEDULABLE = frozenset({"pool-maintenance", "awaiting-nodes"})
#: waits that nodes being added would end
_PROVISIONABLE = frozenset({"no-capacity", "awaiting-nodes"})


def reason_of(code: str, provisioning: bool = False) -> str:
    """The wait reason of a WAIT decision's code; `provisioning`: nodes are being added
    for the request."""
    if code in _BACKOFF:
        return "backoff"
    if code in _QUOTA:
        return "quota"
    if provisioning and code in _PROVISIONABLE:
        return "provisioning"
    if code in _UNSCHEDULABLE:
        return "unschedulable"
    return "capacity"


@dataclass(slots=True)
class WaitState:
    """A request's wait as stored: the open stretch and the closed seconds by reason."""

    reason: str
    since: datetime | None
    seconds: tuple[int, ...]  # in the order of REASONS

    def fold(self, now: datetime, created_at: datetime, new_reason: str) -> WaitState:
        """The state after this tick gives `new_reason` ("" when the wait ends)."""
        start = self.since or created_at
        # A stretch no tick has classified yet counts for the first reason given to it.
        reason = self.reason or new_reason
        seconds = list(self.seconds)
        if reason:
            seconds[REASONS.index(reason)] += max(0, int((now - start).total_seconds()))
        return WaitState(new_reason, now, tuple(seconds))

    def values(self) -> tuple[Any, ...]:
        """The stored columns, in the order of `COLUMNS`."""
        return (self.reason, self.since, *self.seconds)


COLUMNS = ("wait_reason", "wait_since", *FIELDS)


def split(req: GpuRequest, now: datetime) -> dict[str, int]:
    """Seconds the request waited by reason, its open stretch counted up to `now` while
    it is pending."""
    out = {r: getattr(req, f"wait_{r}_s") for r in REASONS}
    if req.wait_reason in out and req.wait_since and req.state == GpuRequest.State.PENDING:
        out[req.wait_reason] += max(0, int((now - req.wait_since).total_seconds()))
    return out


def _open(reason: str, now: datetime) -> Sum:
    elapsed = ExpressionWrapper(
        Value(now, output_field=DateTimeField()) - F("wait_since"), output_field=DurationField()
    )
    return Sum(elapsed, filter=Q(wait_reason=reason, wait_since__isnull=False))


def split_by(
    pending: QuerySet[GpuRequest], group: Iterable[str], now: datetime
) -> list[dict[str, Any]]:
    """Wait seconds by reason summed over pending requests, grouped by `group` (one
    grouped query): closed stretches plus the open ones up to `now`."""
    sums = {f"closed_{r}": Sum(f"wait_{r}_s") for r in REASONS}
    opens = {f"open_{r}": _open(r, now) for r in REASONS}
    rows = pending.values(*group).annotate(**sums, **opens).order_by(*group)
    return [_total(r, group) for r in rows]


def _total(row: Mapping[str, Any], group: Iterable[str]) -> dict[str, Any]:
    out: dict[str, Any] = {g: row[g] for g in group}
    for r in REASONS:
        opened = row[f"open_{r}"]
        out[r] = int(row[f"closed_{r}"] or 0) + (
            max(0, int(opened.total_seconds())) if opened is not None else 0
        )
    return out


def _profile(kind: str, mig_profile: str, milli: int) -> str:
    if kind == "mig":
        return f"mig-{mig_profile}"
    if kind == "shared":
        return f"shared-{milli}m"
    return "whole"


def pending_demand(pending: QuerySet[GpuRequest]) -> list[dict[str, Any]]:
    """Pending demand per pool ("any": any pool) and device profile, in one grouped query:
    requests, devices (or slices) and GPUs wanted, and how much of it fits no node that
    exists (`awaiting-nodes`: only nodes an autoscaled pool may add could hold it)."""
    units = F("count") * F("pods")
    unfit = Q(status_code="awaiting-nodes")
    rows = (
        pending.values("pool__name", "profile_kind", "mig_profile", "milli", "gpu_memory_mib")
        .annotate(
            requests=Count("id"),
            units=Sum(units),
            unfit_requests=Count("id", filter=unfit),
            unfit_units=Sum(units, filter=unfit),
        )
        .order_by("pool__name", "profile_kind", "mig_profile", "milli")
    )
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        one = GpuRequest(
            profile_kind=r["profile_kind"],
            mig_profile=r["mig_profile"],
            milli=r["milli"],
            gpu_memory_mib=r["gpu_memory_mib"],
            count=1,
            pods=1,
        ).gpus_milli
        key = (r["pool__name"] or "any", _profile(r["profile_kind"], r["mig_profile"], r["milli"]))
        out = merged.setdefault(
            key,
            {
                "pool": key[0],
                "profile": key[1],
                "requests": 0,
                "units": 0,
                "gpus_milli": 0,
                "unfit_requests": 0,
                "unfit_gpus_milli": 0,
            },
        )
        out["requests"] += r["requests"]
        out["units"] += r["units"] or 0
        out["gpus_milli"] += one * (r["units"] or 0)
        out["unfit_requests"] += r["unfit_requests"]
        out["unfit_gpus_milli"] += one * (r["unfit_units"] or 0)
    return list(merged.values())
