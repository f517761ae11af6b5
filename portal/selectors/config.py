"""A new site's first steps: what an admin has still to set up before the first request."""

from __future__ import annotations

from dataclasses import dataclass

from portal.models import GpuRequest, Pool, Quota, WorkloadClass


@dataclass(frozen=True)
class Step:
    title: str
    done: bool
    how: str


def pools_live() -> bool:
    """Whether any pool takes work: none, and the site has not started."""
    return Pool.objects.filter(retired_at=None).exists()


def first_run_steps() -> list[Step]:
    """The checklist an admin sees until the site has pools, classes, quotas and a request."""
    return [
        Step(
            "Pools",
            pools_live(),
            "add pools whose node selectors match your GPU nodes (Discovery proposes them)",
        ),
        Step(
            "Workload classes",
            WorkloadClass.objects.filter(retired_at=None).exists(),
            "add classes with their priority bands and queue times",
        ),
        Step(
            "Teams and quotas",
            Quota.objects.filter(nominal_milli__gt=0, pool__retired_at=None).exists(),
            "create teams and give each a quota in a pool",
        ),
        Step("A first request", GpuRequest.objects.exists(), "submit one as a team member"),
    ]


def first_run_pending() -> list[Step] | None:
    """The checklist while any step is open and nothing has been requested yet; else None."""
    steps = first_run_steps()
    if steps[-1].done or all(s.done for s in steps):
        return None
    return steps
