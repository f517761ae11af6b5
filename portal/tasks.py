"""Thin Celery tasks: the database holds the truth, these only wake things up."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, ParamSpec, Protocol, TypeVar, cast

from celery import shared_task as _celery_shared_task
from django.conf import settings

from portal.lib import heartbeat, wake
from portal.services.attempts import attempts_launch

# The worker's heartbeats for its probes (`manage.py probe`): every worker imports this module.
heartbeat.connect_worker_signals()

_P = ParamSpec("_P")
_R = TypeVar("_R", covariant=True)


class Task(Protocol[_P, _R]):
    """What mypy knows of a Celery task (Celery ships no types): the function, and the
    calls that send it to a worker."""

    def __call__(self, *args: _P.args, **kwargs: _P.kwargs) -> _R: ...

    def delay(self, *args: _P.args, **kwargs: _P.kwargs) -> Any: ...

    def apply_async(
        self,
        args: tuple[Any, ...] | None = None,
        kwargs: dict[str, Any] | None = None,
        **options: Any,
    ) -> Any: ...


def shared_task(**options: Any) -> Callable[[Callable[_P, _R]], Task[_P, _R]]:
    """Celery's `shared_task(**options)`, typed."""
    return cast(Callable[[Callable[_P, _R]], Task[_P, _R]], _celery_shared_task(**options))


@shared_task(name=wake.TICK_TASK, ignore_result=True)
def tick() -> dict[str, object]:
    from portal.tick.run import run_tick

    result = run_tick()
    if result.ran:
        from portal.services.autoscale import autoscale_step

        # Demand the tick could not place asks autoscaled pools for nodes (no-op without one).
        autoscale_step()
    return {"ran": result.ran, "admitted": result.admitted, "preempted": result.preempted}


@shared_task(name=wake.LAUNCH_TASK, ignore_result=True)
def launch(attempt_ids: list[int]) -> dict[int, str]:
    """Create the workloads of a tick's admissions (portal.tick.apply.launch_soon)."""

    return attempts_launch(attempt_ids)


@shared_task(name=wake.RECONCILE_TASK, ignore_result=True)
def reconcile() -> dict[str, int]:
    from portal.tick.reconcile import reconcile as reconcile_now

    counts = reconcile_now()
    if any(counts.get(k) for k in ("succeeded", "failed", "preempted", "node_lost", "cancelled")):
        # Devices came back: schedule now rather than at the next beat.
        tick.delay()
    return counts


@shared_task(
    name=wake.NOTIFY_TASK,
    ignore_result=True,
    autoretry_for=(OSError,),
    retry_backoff=True,
    max_retries=3,
)
def notify(request_id: int, event: str) -> dict[str, int]:
    from portal.services.notify import deliver

    return deliver(request_id, event)


@shared_task(name=wake.NOTIFY_LONG_WAITS_TASK, ignore_result=True)
def notify_long_waits() -> int:
    from portal.services.notify import long_waits

    return long_waits()


@shared_task(name=wake.DECISIONS_PRUNE_TASK, ignore_result=True)
def decisions_prune() -> int:
    from portal.services.idempotency import idempotency_keys_prune
    from portal.services.retention import decisions_prune as prune

    # The same daily sweep forgets idempotency keys past their 24 hours.
    idempotency_keys_prune()
    return prune()


@shared_task(name=wake.DEMO_TRICKLE_TASK, ignore_result=True)
def demo_trickle() -> int:
    """Submit a synthetic request now and then so the demo queue visibly moves."""
    if not settings.DEMO_TRICKLE:
        return 0
    from portal.demo.seed import submit_synthetic

    return submit_synthetic(rng=random.Random())


@shared_task(name=wake.SERVING_SAMPLE_TASK, ignore_result=True)
def serving_sample() -> int:
    """Read the serving replicas' /metrics into stored samples (docs/metrics.md)."""
    from portal.services import serving_samples

    stored = serving_samples.sample_serving()
    serving_samples.serving_prune()
    return stored


@shared_task(name=wake.UTILIZATION_TASK, ignore_result=True)
def utilization() -> dict[str, object]:
    """The minute's device samples, their rollups and retention (portal/services/utilization.py)."""
    from portal.services import utilization as history

    return history.utilization_tick()


@shared_task(name=wake.ROLLOUTS_TICK_TASK, ignore_result=True)
def rollouts_tick() -> dict[str, int]:
    """Advance running rollouts and judge finished node validations (docs/lifecycle.md)."""
    from portal.services.rollouts import rollouts_advance

    return rollouts_advance()


@shared_task(name=wake.WHATIF_TASK, ignore_result=True)
def whatif_run(run_id: int) -> str:
    """Replay a drafted policy change on the site's history (portal/tick/whatif_runs.py)."""
    from portal.tick.whatif_runs import whatif_execute

    return str(whatif_execute(run_id).state)
