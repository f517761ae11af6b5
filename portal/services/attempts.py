"""The launch path: an admitted attempt becomes a workload (launch spec, backend call), is observed,
stopped, ended and requeued. The tick, drains, rollouts, rescaling and member removal all call here."""

from __future__ import annotations

import logging
import random
import re
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from portal.backends import get_backend
from portal.backends.base import (
    STORED_LOG_LINES,
    SUSPENDED_BY_OTHERS,
    GrantSpec,
    LaunchRefused,
    LaunchSpec,
    Outcome,
    PodLaunch,
    ServingSpec,
    WorkloadStatus,
)
from portal.lib import words
from portal.lib.failures import error_line
from portal.models import (
    Allocation,
    Attempt,
    Decision,
    GpuRequest,
    NotificationPreference,
    Pool,
    Team,
    UsageRecord,
    WorkloadClass,
)
from portal.services import notify, provisioning
from portal.services.checkpoints import attempt_checkpoint_record
from scheduling import backoff

log = logging.getLogger(__name__)

STOP_GRACE_SECONDS = 30
#: stop_reason prefix of a gang stopped because one of its pods ended ("gang:failed")
GANG_STOP = "gang:"
#: stop_reason of a serving workload stopped to place a new replica count (portal/services/serving.py)
RESCALE = "rescale"


def end_decision(
    req: GpuRequest,
    *,
    code: str,
    message: str,
    attempt: Attempt | None = None,
    facts: dict[str, Any] | None = None,
    tick: int = 0,
) -> Decision:
    """The decision log's END row of a request, or of one of its attempts: built here only."""
    return Decision.objects.create(
        tick=tick,
        request=req,
        attempt=attempt,
        team=req.team,
        pool_id=attempt.pool_id if attempt else None,
        node=",".join(attempt.nodes) if attempt else "",
        kind=Decision.Kind.END,
        code=code,
        message=(f"attempt {attempt.number}: {message}" if attempt else message)[:500],
        facts=facts or {},
    )


def attempt_stop(attempt: Attempt, *, reason: str) -> None:
    """Ask the backend to stop an attempt; its devices stay held until the pod is gone."""
    if attempt.state == Attempt.State.STOPPING:
        return
    attempt.state = Attempt.State.STOPPING
    attempt.stop_reason = reason
    attempt.save(update_fields=["state", "stop_reason"])
    name, namespace, pods = attempt.workload_name, attempt.namespace, max(1, len(attempt.nodes))
    transaction.on_commit(lambda: backend_call("stop", name, namespace, STOP_GRACE_SECONDS, pods))


def backend_call(method: str, *args: Any) -> None:
    # Runs after commit; a failure is re-driven by the reconciler, never lost.
    try:
        getattr(get_backend(), method)(*args)
    except Exception:  # noqa: BLE001
        log.exception("backend %s%r failed; the reconciler will retry", method, args)


#: what `launch_spec` reads of each allocation, in this order
LAUNCH_ALLOCATION_FIELDS = (
    "device__node__name",
    "device__index",
    "milli",
    "gpu_memory_mib",
    "mig_profile",
    "mig_start",
)


def launch_spec(
    attempt: Attempt,
    allocations: list[tuple[str, int, int, int, str, int]] | None = None,
    resume: bool | None = None,
    provisioning_request: str | None = None,
) -> LaunchSpec:
    """Build the workload from stored rows only: nothing here comes from request data at launch.

    `allocations`: the attempt's `LAUNCH_ALLOCATION_FIELDS`, in node name, device index
    and slot order, and `resume` (`_resumes`), when the caller read them already
    (`attempts_launch`), and `provisioning_request` (`consume.consumed`).
    """
    req = attempt.request
    if provisioning_request is None:
        provisioning_request = provisioning.consumed([attempt]).get(attempt.pk, "")
    if resume is None:
        resume = _resumes(attempt, _lost_numbers([attempt]).get(req.pk, []))
    if allocations is None:
        allocations = list(
            attempt.allocations.order_by("device__node__name", "device__index", "slot").values_list(
                *LAUNCH_ALLOCATION_FIELDS
            )
        )
    # Grants per node: a gang's pods each hold devices on their own node.
    per_node: dict[str, dict[tuple[int, int], GrantSpec]] = {}
    for node, index, milli, memory, mig_profile, mig_start in allocations:
        grants = per_node.setdefault(node, {})
        if (index, mig_start) not in grants:
            grants[(index, mig_start)] = GrantSpec(index, milli, memory, mig_profile, mig_start)
    # Rank order is the packer's order of nodes (rank 0 hosts the rendezvous).
    nodes = list(attempt.nodes) or sorted(per_node)
    pods = tuple(
        PodLaunch(rank, node, tuple(per_node.get(node, {}).values()))
        for rank, node in enumerate(nodes)
    )
    exit_code = 0
    words = [str(c) for c in req.command]
    if len(words) >= 2 and words[-2] == "exit" and words[-1].isdigit():
        exit_code = int(words[-1])
    duration = req.estimated_runtime_s * settings.SIMULATED_SECONDS_PER_HOUR // 3600
    return LaunchSpec(
        name=attempt.workload_name,
        namespace=attempt.namespace,
        request_id=req.pk,
        attempt_id=attempt.pk,
        attempt_number=attempt.number,
        team=req.team.name,
        workload_class=req.workload_class.name,
        priority_class=req.workload_class.priority_class_name,
        pool=attempt.pool.name,
        node=pods[0].node if pods else "",
        image=req.image,
        command=tuple(words),
        env=tuple(sorted(req.env.items())),
        profile_kind=req.profile_kind,
        grants=pods[0].grants if pods else (),
        cpu_milli=req.cpu_milli,
        memory_mib=req.memory_mib,
        sharing_engine=attempt.pool.sharing_engine,
        tolerations=tuple(
            (t["key"], t.get("value", ""), t.get("effect", "NoSchedule"))
            for t in attempt.pool.taints
        ),
        max_runtime_s=req.max_runtime_s,
        simulated_duration_s=max(2, duration),
        simulated_exit_code=exit_code,
        pods=pods if len(pods) > 1 else (),
        checkpoint_interval_s=req.checkpoint_interval_s,
        resume=resume,
        serving=_serving(req),
        provisioning_request=provisioning_request,
    )


def _serving(req: GpuRequest) -> ServingSpec | None:
    if req.kind != GpuRequest.Kind.SERVING:
        return None
    objective = req.workload_class.latency_objective_ms or 0
    return ServingSpec(req.model_name, req.model_revision, req.runtime, objective / 1000)


def _lost_numbers(attempts: list[Attempt]) -> dict[int, list[int]]:
    """The numbers of the preempted or node-lost attempts of the checkpointing requests among
    `attempts`, by request id: one query whatever their number."""
    ids = [a.request_id for a in attempts if a.request.checkpoint_interval_s > 0]
    lost: dict[int, list[int]] = {}
    if ids:
        for request_id, number in Attempt.objects.filter(
            request_id__in=ids, state__in=[Attempt.State.PREEMPTED, Attempt.State.NODE_LOST]
        ).values_list("request_id", "number"):
            lost.setdefault(request_id, []).append(number)
    return lost


def _resumes(attempt: Attempt, lost_numbers: list[int]) -> bool:
    """The checkpoints of an earlier preempted or node-lost attempt are there to be resumed from."""
    return attempt.request.checkpoint_interval_s > 0 and any(
        n < attempt.number for n in lost_numbers
    )


def attempt_launch(attempt_id: int, *, now: datetime | None = None) -> str:
    """Create an admitted attempt's workload. Runs after commit; returns what happened.

    Every try is counted and pushes the next allowed relaunch out (exponential
    backoff), so the reconciler's relaunches are bounded. A backend that refuses
    the spec (`LaunchRefused`) will refuse it again: the attempt ends with the
    reason and its devices go back at once.
    """
    now = now or timezone.now()
    attempt = Attempt.objects.select_related(
        "request__team", "request__workload_class", "pool"
    ).get(pk=attempt_id)
    if attempt.state != Attempt.State.ADMITTED:
        return "skipped"
    tries = attempt.launch_tries + 1
    delay = backoff.requeue_delay_s(
        tries, settings.LAUNCH_RETRY_BASE_SECONDS, settings.LAUNCH_RETRY_MAX_SECONDS, 0.0
    )
    Attempt.objects.filter(pk=attempt.pk).update(
        launch_tries=tries, next_launch_at=now + timedelta(seconds=delay)
    )
    try:
        spec = launch_spec(attempt)
        get_backend().launch(spec)
    except LaunchRefused as exc:
        attempt_end_unlaunched(
            attempt_id,
            code="launch-refused",
            reason=f"the cluster refused to launch it: {exc}",
            requeue=False,
            now=now,
        )
        return "refused"
    except Exception:  # noqa: BLE001
        log.exception(
            "launch of attempt %s failed (try %s); the reconciler will retry", attempt_id, tries
        )
        return "error"
    return "launched"


def attempts_launch(attempt_ids: list[int], *, now: datetime | None = None) -> dict[int, str]:
    """`attempt_launch` for many attempts (a tick's admissions), in a few statements.

    The same counting and backoff per attempt; a backend that launches in bulk
    (`launch_many`) gets every spec at once, and if that fails each is tried on its
    own, as `attempt_launch` would. Returns what happened, by attempt id.
    """
    now = now or timezone.now()
    attempts = list(
        Attempt.objects.select_related("request")
        .filter(pk__in=attempt_ids, state=Attempt.State.ADMITTED)
        .order_by("pk")
    )
    # Teams, classes and pools are few: read once, not joined into every attempt's row.
    teams = Team.objects.in_bulk({a.request.team_id for a in attempts})
    classes = WorkloadClass.objects.in_bulk({a.request.workload_class_id for a in attempts})
    pools = Pool.objects.in_bulk({a.pool_id for a in attempts})
    outcome = {pk: "skipped" for pk in attempt_ids}
    by_tries: dict[int, list[int]] = {}
    for attempt in attempts:
        attempt.pool = pools[attempt.pool_id]
        attempt.request.team = teams[attempt.request.team_id]
        attempt.request.workload_class = classes[attempt.request.workload_class_id]
        by_tries.setdefault(attempt.launch_tries + 1, []).append(attempt.pk)
    for tries, pks in by_tries.items():
        delay = backoff.requeue_delay_s(
            tries, settings.LAUNCH_RETRY_BASE_SECONDS, settings.LAUNCH_RETRY_MAX_SECONDS, 0.0
        )
        Attempt.objects.filter(pk__in=pks).update(
            launch_tries=tries, next_launch_at=now + timedelta(seconds=delay)
        )
    allocations: dict[int, list[tuple[str, int, int, int, str, int]]] = {a.pk: [] for a in attempts}
    for attempt_id, *fields in (
        Allocation.objects.filter(attempt_id__in=list(allocations))
        .order_by("attempt_id", "device__node__name", "device__index", "slot")
        .values_list("attempt_id", *LAUNCH_ALLOCATION_FIELDS)
    ):
        allocations[attempt_id].append(tuple(fields))
    lost = _lost_numbers(attempts)
    consumes = provisioning.consumed(attempts)
    specs = {
        a.pk: launch_spec(
            a,
            allocations[a.pk],
            _resumes(a, lost.get(a.request_id, [])),
            consumes.get(a.pk, ""),
        )
        for a in attempts
    }
    backend = get_backend()
    launch_many = getattr(backend, "launch_many", None)
    if launch_many is not None and specs:
        try:
            launch_many(list(specs.values()))
            return outcome | {pk: "launched" for pk in specs}
        except Exception:  # noqa: BLE001
            log.exception("bulk launch of %s attempts failed; launching one by one", len(specs))
    for pk, spec in specs.items():
        try:
            backend.launch(spec)
            outcome[pk] = "launched"
        except LaunchRefused as exc:
            attempt_end_unlaunched(
                pk,
                code="launch-refused",
                reason=f"the cluster refused to launch it: {exc}",
                requeue=False,
                now=now,
            )
            outcome[pk] = "refused"
        except Exception:  # noqa: BLE001
            log.exception("launch of attempt %s failed; the reconciler will retry", pk)
            outcome[pk] = "error"
    return outcome


def attempt_end_unlaunched(
    attempt_id: int, *, code: str, reason: str, requeue: bool, now: datetime | None = None
) -> bool:
    """End an admitted attempt whose workload never ran: devices back, not charged.

    `requeue`: the request goes back to the queue (bounded by REQUEUE_LIMIT), as
    after a launch that kept failing; otherwise it fails with the reason, as when
    the backend refuses the spec itself. True if this call ended the attempt.
    """
    now = now or timezone.now()
    with transaction.atomic():
        attempt = Attempt.objects.select_for_update().filter(pk=attempt_id).first()
        if attempt is None or attempt.state != Attempt.State.ADMITTED:
            return False
        req = (
            GpuRequest.objects.select_for_update().select_related("team").get(pk=attempt.request_id)
        )
        attempt.state, attempt.ended_at, attempt.end_reason = (
            Attempt.State.FAILED,
            now,
            reason[:300],
        )
        attempt.save(update_fields=["state", "ended_at", "end_reason"])
        release_attempt(attempt, now=now, charged=False)
        end_decision(
            req,
            attempt=attempt,
            code=code,
            message=reason,
            facts={"launch_tries": attempt.launch_tries},
        )
        if req.state in GpuRequest.TERMINAL_STATES:
            return True
        if requeue:
            _requeue(req, now=now, why=reason)
        else:
            req.state, req.end_reason = GpuRequest.State.FAILED, reason[:300]
            req.status_code, req.status_message = code, reason[:500]
            req.queue_position = None
            req.save()
            notify.notify_later(req.pk, NotificationPreference.Event.FAILURE)
    return True


def release_attempt(attempt: Attempt, *, now: datetime, charged: bool) -> bool:
    """Give an attempt's devices and quota back. True the one time it happens."""
    if Attempt.objects.filter(pk=attempt.pk, released_at__isnull=True).update(released_at=now) != 1:
        return False
    attempt.released_at = now
    Allocation.objects.filter(attempt=attempt, active=True).update(active=False)
    usage = UsageRecord.objects.filter(attempt=attempt, ended_at__isnull=True).first()
    if usage is not None:
        seconds = max(0, int((now - usage.started_at).total_seconds()))
        usage.ended_at = now
        usage.gpu_milli_seconds = seconds * usage.gpus_milli
        usage.lost_gpu_milli_seconds = lost_gpu_milli_seconds(attempt, usage, now)
        usage.charged = charged
        usage.save(
            update_fields=["ended_at", "gpu_milli_seconds", "lost_gpu_milli_seconds", "charged"]
        )
    return True


#: endings whose work since the last checkpoint is thrown away and redone by a retry
LOST_WORK_STATES = (Attempt.State.PREEMPTED, Attempt.State.NODE_LOST)


def lost_gpu_milli_seconds(attempt: Attempt, usage: UsageRecord, now: datetime) -> int:
    """GPU milli-seconds a preempted or node-lost attempt threw away: since its last
    checkpoint, or since it was admitted when it never checkpointed."""
    if attempt.state not in LOST_WORK_STATES:
        return 0
    since = usage.started_at
    if attempt.last_checkpoint_at is not None and attempt.last_checkpoint_at > since:
        since = attempt.last_checkpoint_at
    return max(0, int((now - since).total_seconds())) * usage.gpus_milli


def lost_work(attempt: Attempt, now: datetime) -> tuple[str, dict[str, Any]]:
    """The work a victim loses if stopped now, as a clause and as facts.

    Counted as the core counts it (scheduling.preemption): since the last
    checkpoint the workload reported, else since the attempt started.
    """
    begun = attempt.started_at or attempt.admitted_at
    since = attempt.last_checkpoint_at or begun
    seconds = max(0, int((now - since).total_seconds()))
    gpu_hours = seconds * attempt.gpus_milli / 1000 / 3600
    facts: dict[str, Any] = {
        "lost_seconds": seconds,
        "lost_gpu_hours": round(gpu_hours, 3),
        "last_checkpoint_at": since.isoformat() if attempt.last_checkpoint_at else None,
    }
    if attempt.last_checkpoint_at is None:
        clause = (
            f"it has not checkpointed, so it loses all {words.duration(seconds)} of its work "
            f"({gpu_hours:.2f} GPU-hours)"
        )
    else:
        clause = (
            f"it loses {words.duration(seconds)} of work since its last checkpoint at "
            f"{since:%H:%M} UTC ({gpu_hours:.2f} GPU-hours)"
        )
    return clause, facts


def requeue_delay_s(attempt_number: int) -> float:
    """base·2^(n-1) plus up to 10% jitter, capped (scheduling.backoff has the rule)."""
    base = settings.REQUEUE_BASE_SECONDS
    jitter = random.uniform(0, base * 2 ** min(max(0, attempt_number - 1), 30) / 10)
    return backoff.requeue_delay_s(attempt_number, base, settings.REQUEUE_MAX_SECONDS, jitter)


def _requeue(req: GpuRequest, *, now: datetime, why: str, counted: bool = True) -> None:
    """Back to the queue with backoff, or failed past REQUEUE_LIMIT (then the owner is told).

    Not `counted` (a serving workload stopped to place a new replica count, the owner's
    choice): back at once, no backoff, no step towards the limit."""
    if not counted:
        req.state, req.requeue_at = GpuRequest.State.PENDING, None
        req.status_code, req.status_message = "requeued", f"requeued: {why}"
        req.save()
        Decision.objects.create(
            request=req,
            team=req.team,
            kind=Decision.Kind.REQUEUE,
            code="requeued",
            message=req.status_message,
        )
        return
    req.requeue_count += 1
    if req.requeue_count > settings.REQUEUE_LIMIT:
        req.state = GpuRequest.State.FAILED
        req.end_reason = f"{why}; gave up after {settings.REQUEUE_LIMIT} requeues"
        req.status_code, req.status_message = "requeue-limit", req.end_reason
        kind, code = Decision.Kind.END, "requeue-limit"
    else:
        delay = requeue_delay_s(req.requeue_count)
        req.state = GpuRequest.State.PENDING
        req.requeue_at = now + timedelta(seconds=delay)
        req.status_code = "requeued"
        req.status_message = f"requeued: {why}; back in the queue in {int(delay)} s"
        # Its wait starts over, held by backoff (portal/tick/waits.py).
        req.wait_reason, req.wait_since = "backoff", now
        kind, code = Decision.Kind.REQUEUE, "requeued"
    req.save()
    Decision.objects.create(
        request=req, team=req.team, kind=kind, code=code, message=req.status_message
    )
    if req.state == GpuRequest.State.FAILED:
        notify.notify_later(req.pk, NotificationPreference.Event.FAILURE)


# How each backend outcome ends an attempt: (attempt state, request state or None to requeue, charged).
_ENDINGS: dict[Outcome, tuple[str, str | None, bool]] = {
    Outcome.SUCCEEDED: (Attempt.State.SUCCEEDED, GpuRequest.State.SUCCEEDED, True),
    Outcome.FAILED: (Attempt.State.FAILED, GpuRequest.State.FAILED, True),
    Outcome.OOM: (Attempt.State.FAILED, GpuRequest.State.FAILED, True),
    Outcome.IMAGE_PULL: (Attempt.State.FAILED, GpuRequest.State.FAILED, False),
    Outcome.PREEMPTED: (Attempt.State.PREEMPTED, None, False),
    Outcome.NODE_LOST: (Attempt.State.NODE_LOST, None, False),
    Outcome.DEVICE_ERROR: (Attempt.State.FAILED, None, False),
}

_REASONS = {
    Outcome.SUCCEEDED: "finished successfully",
    Outcome.FAILED: "the workload failed",
    Outcome.OOM: "the workload ran out of memory",
    Outcome.IMAGE_PULL: "the container image could not be pulled",
    Outcome.PREEMPTED: "preempted to make room for work with a stronger claim",
    Outcome.NODE_LOST: "the node it ran on was lost",
    Outcome.DEVICE_ERROR: "the device plugin refused the pod",
}


#: GpuRequest.status_code and decision code of an attempt whose Job another controller suspended
SUSPENDED_CODE = "suspended_by_others"


def _held_back(attempt: Attempt, req: GpuRequest, message: str) -> None:
    """Say so, once, on the request and in the decision log instead of waiting silently;
    its devices stay booked for it until it runs or someone stops it."""
    req.status_code, req.status_message = SUSPENDED_CODE, message[:500]
    req.save(update_fields=["status_code", "status_message", "updated_at"])
    Decision.objects.create(
        request=req,
        attempt=attempt,
        team=req.team,
        pool_id=attempt.pool_id,
        node=",".join(attempt.nodes),
        kind=Decision.Kind.WAIT,
        code=SUSPENDED_CODE,
        message=message[:500],
    )


def attempt_observe(
    *, attempt_id: int, status: WorkloadStatus, now: datetime | None = None, log_tail: str = ""
) -> str:
    """Move an attempt (and its request) forward from what the backend reports. Returns the new state.

    `log_tail`: the workload's last log lines, read by the caller (outside this
    transaction) when the status says it ended; kept on the attempt if it ends now.
    """
    now = now or timezone.now()
    with transaction.atomic():
        attempt = (
            Attempt.objects.select_for_update().select_related("request__team").get(pk=attempt_id)
        )
        if attempt.state not in Attempt.ACTIVE_STATES:
            return str(attempt.state)
        req = GpuRequest.objects.select_for_update().get(pk=attempt.request_id)
        # Before any ending below: the lost work counts from this checkpoint.
        if status.last_checkpoint_at is not None and attempt_checkpoint_record(
            attempt.pk, status.last_checkpoint_at
        ):
            attempt.refresh_from_db(fields=["last_checkpoint_at", "checkpoints"])
        outcome = status.outcome
        gang = len(attempt.nodes) > 1
        if gang and attempt.state == Attempt.State.STOPPING:
            # A gang being stopped ends once none of its pods runs any more, whatever
            # each one's ending: until then its devices stay held.
            if status.active_pods == 0:
                return _end_stopped(attempt, req, now=now, log_tail=log_tail)
            return str(attempt.state)
        if attempt.state == Attempt.State.STOPPING and outcome in (
            Outcome.MISSING,
            Outcome.PREEMPTED,
        ):
            return _end_stopped(attempt, req, now=now, log_tail=log_tail)
        if outcome == Outcome.MISSING and attempt.state == Attempt.State.RUNNING:
            outcome = Outcome.NODE_LOST
        if gang and outcome in _ENDINGS and outcome != Outcome.SUCCEEDED:
            # One pod of a gang ended: stop the others, and end the attempt with this
            # pod's outcome once all are gone (a gang runs whole or not at all).
            attempt.end_reason = (status.message or status.reason)[:300]
            attempt.exit_code = status.exit_code
            attempt.log_tail = log_tail or attempt.log_tail
            attempt.save(update_fields=["end_reason", "exit_code", "log_tail"])
            attempt_stop(attempt, reason=f"{GANG_STOP}{outcome.value}")
            return str(attempt.state)
        if outcome == Outcome.RUNNING and attempt.state == Attempt.State.ADMITTED:
            attempt.state, attempt.started_at = Attempt.State.RUNNING, now
            attempt.save(update_fields=["state", "started_at"])
            if req.state == GpuRequest.State.ADMITTED:
                req.state = GpuRequest.State.RUNNING
                req.status_code, req.status_message = (
                    "running",
                    f"running on {', '.join(attempt.nodes)}",
                )
                req.save()
                notify.notify_later(req.pk, NotificationPreference.Event.START)
            return str(attempt.state)
        if (
            outcome == Outcome.PENDING
            and status.reason == SUSPENDED_BY_OTHERS
            and req.status_code != SUSPENDED_CODE
        ):
            _held_back(attempt, req, status.message)
        if outcome not in _ENDINGS:
            return str(attempt.state)
        return _end_attempt(
            attempt, req, outcome=outcome, status=status, now=now, log_tail=log_tail
        )


def ending_words(outcome: Outcome, status: WorkloadStatus, log_tail: str = "") -> str:
    """Why an attempt ended, in one sentence: what happened, and for a failure the line of the
    log that names the error (a traceback's last line, a CUDA error), with the exit code; the
    cluster's reason where the log names none."""
    found = error_line(log_tail) if outcome in _LOG_SAYS_WHY else None
    if found:
        code = f" (exit code {status.exit_code})" if status.exit_code not in (None, 0) else ""
        # a gang's ending says which pod ("pod 1: exited with code 3"): keep that much
        pod = _GANG_POD.match(status.message)
        where = f" in {pod.group(1)}" if pod else ""
        return f"{_REASONS[outcome]}{where}: {found}{code}"
    detail = status.message
    if status.reason and status.reason not in detail and outcome != Outcome.SUCCEEDED:
        detail = f"{status.reason}: {detail}" if detail else status.reason
    if status.exit_code not in (None, 0) and f"code {status.exit_code}" not in detail:
        detail = f"exit code {status.exit_code}" + (f", {detail}" if detail else "")
    return _REASONS[outcome] + (f" ({detail})" if detail else "")


#: the start of a gang's ending message (portal/backends/base.py gang_status)
_GANG_POD = re.compile(r"^(pod \d+): ")

#: endings whose log may name the error
_LOG_SAYS_WHY = (Outcome.FAILED, Outcome.OOM, Outcome.DEVICE_ERROR)


def _notify_ending(req: GpuRequest, outcome: Outcome, requeued: bool) -> None:
    """Tell the owner how the attempt ended (a requeue past the limit was told by _requeue)."""
    Event = NotificationPreference.Event
    if not requeued:
        event = Event.END if req.state == GpuRequest.State.SUCCEEDED else Event.FAILURE
        notify.notify_later(req.pk, event)
    elif req.state == GpuRequest.State.PENDING and outcome in (
        Outcome.PREEMPTED,
        Outcome.NODE_LOST,
    ):
        notify.notify_later(req.pk, Event.PREEMPTION)


def _end_attempt(
    attempt: Attempt,
    req: GpuRequest,
    *,
    outcome: Outcome,
    status: WorkloadStatus,
    now: datetime,
    log_tail: str = "",
) -> str:
    attempt_state, request_state, charged = _ENDINGS[outcome]
    if log_tail:
        attempt.log_tail = _last_lines(log_tail)
    reason = ending_words(outcome, status, attempt.log_tail)
    attempt.state, attempt.ended_at, attempt.exit_code = attempt_state, now, status.exit_code
    attempt.end_reason = reason[:300]
    attempt.save(update_fields=["state", "ended_at", "exit_code", "end_reason", "log_tail"])
    release_attempt(attempt, now=now, charged=charged)
    end_decision(
        req,
        attempt=attempt,
        code=outcome.value,
        message=reason,
        facts={"exit_code": status.exit_code, "reason": status.reason},
    )
    if req.state in GpuRequest.TERMINAL_STATES:
        return str(attempt.state)
    if request_state is None:
        _requeue(req, now=now, why=reason)
    else:
        req.state, req.end_reason = request_state, reason[:300]
        req.status_code, req.status_message = outcome.value, reason[:500]
        req.save()
    _notify_ending(req, outcome, requeued=request_state is None)
    return str(attempt.state)


def _last_lines(text: str) -> str:
    return "\n".join(text.rstrip("\n").splitlines()[-STORED_LOG_LINES:])[-20_000:]


def _end_stopped(attempt: Attempt, req: GpuRequest, *, now: datetime, log_tail: str = "") -> str:
    reason = attempt.stop_reason or "stopped"
    if reason.startswith(GANG_STOP):
        # Every pod of the gang is gone now: end it as its first ended pod ended.
        outcome = Outcome(reason.removeprefix(GANG_STOP))
        status = WorkloadStatus(
            attempt.workload_name,
            attempt.namespace,
            outcome,
            message=attempt.end_reason,
            exit_code=attempt.exit_code,
        )
        # The log kept when the first pod ended is the one that says why; the pods the
        # portal stopped since only say they were stopped.
        return _end_attempt(
            attempt,
            req,
            outcome=outcome,
            status=status,
            now=now,
            log_tail=attempt.log_tail or log_tail,
        )
    cancelled = reason == "cancelled"
    attempt.state = Attempt.State.CANCELLED if cancelled else Attempt.State.PREEMPTED
    attempt.ended_at, attempt.end_reason = now, reason
    if log_tail:
        attempt.log_tail = _last_lines(log_tail)
    attempt.save(update_fields=["state", "ended_at", "end_reason", "log_tail"])
    # Cancelled work is the user's choice and is charged; preempted and drained work is not.
    release_attempt(attempt, now=now, charged=cancelled)
    if not cancelled and req.state not in GpuRequest.TERMINAL_STATES:
        why = (
            "preempted to make room for work with a stronger claim"
            if reason == "preempted"
            else f"stopped ({reason})"
        )
        if reason == RESCALE:
            _requeue(req, now=now, why="placing the new replica count", counted=False)
            return str(attempt.state)
        _requeue(req, now=now, why=why)
        if req.state == GpuRequest.State.PENDING:
            notify.notify_later(req.pk, NotificationPreference.Event.PREEMPTION)
    return str(attempt.state)
