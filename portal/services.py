"""Every write goes through here: pages, API and tasks share these functions.

Each change writes its AuditEvent in the same transaction. Invalid input raises
`ValidationError` naming the field; nothing half-written stays behind.
"""

from __future__ import annotations

import hmac
import logging
import random
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Count, F, Model, Q
from django.forms.models import model_to_dict
from django.utils import timezone

from portal import consume, contract, lifecycle, notify, serving_spec, shapes, validation, wake
from portal.backends import get_backend
from portal.backends.base import (
    STORED_LOG_LINES,
    GrantSpec,
    LaunchRefused,
    LaunchSpec,
    Outcome,
    PodLaunch,
    ServingSpec,
    WorkloadStatus,
)
from portal.models import (
    Allocation,
    Attempt,
    AuditEvent,
    Decision,
    Device,
    DeviceProfile,
    GpuRequest,
    Membership,
    Node,
    NotificationPreference,
    PolicyProfile,
    PolicyVersion,
    Pool,
    Quota,
    RequestTemplate,
    ShapeHistory,
    Team,
    UsageRecord,
    WorkloadClass,
)
from portal.readiness import attempt_token, ready_token_key
from scheduling import backoff, workload
from scheduling import profile as scheduling_profile
from scheduling.members import NOT_A_MEMBER

log = logging.getLogger(__name__)

User = AbstractBaseUser | AnonymousUser | None

MAX_GPUS_PER_NODE = shapes.MAX_GPUS_PER_NODE
STOP_GRACE_SECONDS = 30
#: stop_reason prefix of a gang stopped because one of its pods ended ("gang:failed")
GANG_STOP = "gang:"
#: stop_reason of a serving workload stopped to place a new replica count (portal/serving.py)
RESCALE = "rescale"


# ---------------------------------------------------------------------------
# Audit


def audit(
    *,
    actor: User,
    action: str,
    obj: Model,
    team: Team | None = None,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    actor_name: str = "",
    reason: str = "",
) -> AuditEvent:
    """Record who changed what; call inside the transaction that made the change.

    With no signed-in actor, `actor_name` says what acted ("sso"; default "system").
    `reason` is the actor's own words on why.
    """
    real = actor if actor is not None and getattr(actor, "is_authenticated", False) else None
    event = AuditEvent.objects.create(
        actor=real,
        actor_name=getattr(real, "username", "") or actor_name or "system",
        action=action,
        object_type=obj._meta.model_name or "",
        object_id=str(obj.pk),
        team=team,
        before=_jsonable(before),
        after=_jsonable(after),
        reason=reason[:500],
    )
    if action in POLICY_ACTIONS:
        policy_version_record(event)
    return event


#: audited changes that change how the scheduler decides: each is a new policy version
POLICY_ACTIONS = frozenset(
    {
        "quota.set",
        "class.update",
        "class.teams",
        "pool.update",
        "profile.create",
        "profile.update",
        "profile.activate",
    }
)


def policy_version_record(event: AuditEvent) -> PolicyVersion:
    """The next policy version, for an audited change (in its transaction). Numbers come
    from the latest row under a lock on it, so two changes never share one."""
    latest = PolicyVersion.objects.select_for_update().order_by("-number").first()
    return PolicyVersion.objects.create(
        number=(latest.number if latest else 0) + 1,
        action=event.action,
        object_type=event.object_type,
        object_id=event.object_id,
        actor_name=event.actor_name,
        before=event.before,
        after=event.after,
    )


def _jsonable(data: dict[str, Any] | None) -> dict[str, Any] | None:
    if data is None:
        return None
    return {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in data.items()}


def _snapshot(obj: Model, fields: list[str]) -> dict[str, Any]:
    return model_to_dict(obj, fields=fields)


# ---------------------------------------------------------------------------
# Requests


def validate_env(env: Any) -> dict[str, str]:
    """The launch contract's env rules (portal.contract), as a ValidationError naming `env`."""
    if not isinstance(env, dict):
        raise ValidationError({"env": "Environment variables must be a mapping of NAME to value."})
    try:
        return contract.check_env(env)
    except contract.ContractError as exc:
        raise ValidationError({exc.field: exc.message}) from None


def validate_image(image: Any) -> str:
    """The launch contract's image rules: a parsed reference the allowlist admits."""
    try:
        contract.check_image(image, settings.K8S_ALLOWED_IMAGES)
    except contract.ContractError as exc:
        raise ValidationError({"image": exc.message}) from None
    return str(image)


def _validate_command(command: Any) -> list[str]:
    if isinstance(command, str):
        command = command.split()
    if not isinstance(command, list) or not all(isinstance(c, str) for c in command):
        raise ValidationError({"command": "The command must be a list of strings."})
    if len(command) > 100 or sum(len(c) for c in command) > 8192:
        raise ValidationError({"command": "The command is too long."})
    return command


def priority_bounds(user: Any, team: Team, role: str | None = None) -> tuple[int, int]:
    """The priority range `user` may choose in `team`: bounded by role (settings.PRIORITY_*)."""
    if getattr(user, "is_staff", False) and getattr(user, "is_active", False):
        high = settings.PRIORITY_MAX_ADMIN
    else:
        if role is None:
            role = (
                Membership.objects.filter(user=user, team=team)
                .values_list("role", flat=True)
                .first()
            )
        high = (
            settings.PRIORITY_MAX_LEAD
            if role == Membership.Role.LEAD
            else settings.PRIORITY_MAX_MEMBER
        )
    return settings.PRIORITY_MIN, high


def check_priority(user: Any, team: Team, priority: Any, role: str | None = None) -> int:
    low, high = priority_bounds(user, team, role)
    if isinstance(priority, bool) or not isinstance(priority, int) or not low <= priority <= high:
        raise ValidationError(
            {"priority": f"Choose a priority between {low} and {high} in team {team.name}."}
        )
    return priority


def check_class(team: Team, workload_class: WorkloadClass) -> None:
    if not workload_class.open_to(team):
        raise ValidationError(
            {
                "workload_class": f"Team {team.name} may not use the {workload_class.name} class; "
                "a platform admin grants it."
            }
        )


def gpu_request_submit(
    *,
    user: AbstractBaseUser,
    team: Team,
    workload_class: WorkloadClass,
    image: str,
    pool: Pool | None = None,
    profile_kind: str = DeviceProfile.Kind.WHOLE,
    mig_profile: str = "",
    milli: int = 1000,
    gpu_memory_mib: int = 0,
    count: int = 1,
    pods: int = 1,
    cpu_milli: int = 1000,
    memory_mib: int = 4096,
    command: Any = (),
    env: Any = None,
    checkpoint_interval_s: int = 0,
    max_runtime_s: int = 0,
    estimated_runtime_s: int = 3600,
    name: str = "",
    priority: int = 0,
    kind: str = "batch",
    model_name: str = "",
    model_revision: str = "",
    runtime: str = "",
) -> GpuRequest:
    """Queue a request for `team`; the tick picks it up on commit.

    `kind` "serving": `pods` replicas of a `runtime` server for `model_name` at
    `model_revision`, running until stopped (`serving_spec.check`)."""
    role = Membership.objects.filter(user=user, team=team).values_list("role", flat=True).first()
    if role is None:
        raise ValidationError({"team": "You are not a member of this team."})
    check_class(team, workload_class)
    priority = check_priority(user, team, priority, role)
    try:
        profile_kind, mig_profile, milli, gpu_memory_mib = shapes.normalize(
            profile_kind, mig_profile, milli, gpu_memory_mib
        )
        shapes.check_counts(count, pods)
    except shapes.ShapeError as exc:
        raise ValidationError({exc.field: exc.message}) from None
    if pool is not None and pool.lifecycle == Pool.Lifecycle.MAINTENANCE:
        raise ValidationError({"pool": f"Pool {pool.name} is in maintenance."})
    serving = [p for p in Pool.offering(pool) if p.offers(profile_kind, mig_profile)]
    if not serving:
        where = f"pool {pool.name}" if pool else "any production pool"
        field = "mig_profile" if profile_kind == DeviceProfile.Kind.MIG else "profile_kind"
        raise ValidationError({field: f"No {where} offers this device profile."})
    serving_fields = serving_spec.check(
        kind=kind,
        model_name=model_name,
        model_revision=model_revision,
        runtime=runtime,
        max_runtime_s=max_runtime_s,
        checkpoint_interval_s=checkpoint_interval_s,
    )
    if kind == GpuRequest.Kind.SERVING:
        # runs until stopped: no runtime estimate for backfilling or start estimates
        estimated_runtime_s = 0
    image = validate_image(image)
    command = _validate_command(list(command) if isinstance(command, tuple) else command)
    env = validate_env(env or {})
    for field_name, value in (
        ("cpu_milli", cpu_milli),
        ("memory_mib", memory_mib),
        ("checkpoint_interval_s", checkpoint_interval_s),
        ("max_runtime_s", max_runtime_s),
        ("estimated_runtime_s", estimated_runtime_s),
    ):
        if not isinstance(value, int) or value < 0 or value > 10**9:
            raise ValidationError({field_name: "Must be a whole number between 0 and 1000000000."})

    with transaction.atomic():
        # The team row lock makes the pending caps exact under concurrent submits.
        team = Team.objects.select_for_update().get(pk=team.pk)
        _check_pending_caps(user=user, team=team)
        req = GpuRequest(
            team=team,
            submitted_by=user,
            name=name[:100],
            workload_class=workload_class,
            pool=pool,
            profile_kind=profile_kind,
            mig_profile=mig_profile,
            milli=milli,
            gpu_memory_mib=gpu_memory_mib,
            count=count,
            pods=pods,
            cpu_milli=cpu_milli,
            memory_mib=memory_mib,
            image=image,
            command=command,
            env=env,
            checkpoint_interval_s=checkpoint_interval_s,
            max_runtime_s=max_runtime_s,
            estimated_runtime_s=estimated_runtime_s,
            priority=priority,
            status_code="queued",
            status_message="queued: waiting for the next scheduling pass",
            **serving_fields,
        )
        # team, user, class and pool are rows fetched above, and every value was checked
        # above (the database enforces the check constraints too): skipping the per-row
        # existence queries and constraint savepoints halves the cost of a submit.
        req.full_clean(
            exclude=["team", "submitted_by", "workload_class", "pool"], validate_constraints=False
        )
        req.save()
        _observe_shape(req, serving)
        audit(
            actor=user,
            action="request.submit",
            obj=req,
            team=team,
            after={"profile": req.profile_label, "count": count},
        )
        _wake_scheduler()
    return req


def _observe_shape(req: GpuRequest, pools: list[Pool]) -> None:
    """Add the request's shape to the shape history of every pool that may serve it.

    One locked row per pool, in pool order (no deadlock between concurrent submits); the
    caller's transaction keeps the read-modify-write of the JSON whole.
    """
    now_ms = int(timezone.now().timestamp() * 1000)
    # The active profile's half-life, as the tick reads the histories with it.
    half_life = PolicyProfile.objects.active_profile().policy().shape_half_life_s
    for pool in sorted(pools, key=lambda p: p.pk):
        row, _ = ShapeHistory.objects.select_for_update().get_or_create(pool=pool)
        history = workload.ShapeHistory.from_dict(row.histogram, half_life_s=half_life)
        history.observe(shapes.request_shape(req, shapes.tolerations([pool])), now_ms)
        row.histogram = history.to_dict()
        row.save(update_fields=["histogram", "updated_at"])


def _check_pending_caps(*, user: AbstractBaseUser, team: Team) -> None:
    # Both counts in one query (one round trip inside the team lock).
    mine, team_q = Q(submitted_by=user), Q(team=team)
    counts = GpuRequest.objects.filter(mine | team_q, state=GpuRequest.State.PENDING).aggregate(
        user=Count("pk", filter=mine), team=Count("pk", filter=team_q)
    )
    if counts["user"] >= settings.MAX_PENDING_PER_USER:
        raise ValidationError(
            {"__all__": f"You already have {settings.MAX_PENDING_PER_USER} pending requests."}
        )
    team_cap = team.max_pending or settings.MAX_PENDING_PER_TEAM
    if counts["team"] >= team_cap:
        raise ValidationError(
            {"__all__": f"Team {team.name} already has {team_cap} pending requests."}
        )


def _wake_scheduler() -> None:
    # Coalesced: at most one tick enqueued per second per process (see wake.wake_tick).
    transaction.on_commit(wake.wake_tick)


def gpu_request_cancel(
    *, user: AbstractBaseUser, gpu_request: GpuRequest, reason: str = ""
) -> GpuRequest:
    """Cancel a pending request, or stop a running one; `reason` goes into the audit log."""
    with transaction.atomic():
        req = GpuRequest.objects.select_for_update().get(pk=gpu_request.pk)
        if req.state in GpuRequest.TERMINAL_STATES:
            raise ValidationError({"state": f"This request has already {req.state}."})
        before = {"state": req.state}
        attempt = req.attempts.filter(state__in=Attempt.ACTIVE_STATES).first()
        if attempt is not None:
            attempt_stop(attempt, reason="cancelled")
        req.state = GpuRequest.State.CANCELLED
        req.end_reason = f"cancelled by {getattr(user, 'username', 'a user')}"
        req.status_code, req.status_message = "cancelled", req.end_reason
        req.queue_position = None
        req.save()
        Decision.objects.create(
            request=req,
            team=req.team,
            kind=Decision.Kind.END,
            code="cancelled",
            message=req.end_reason,
        )
        audit(
            actor=user,
            action="request.cancel",
            obj=req,
            team=req.team,
            before=before,
            after={"state": req.state},
            reason=reason,
        )
    return req


def gpu_request_cancel_not_member(
    gpu_request: GpuRequest,
    *,
    actor: AbstractBaseUser | None,
    now: datetime,
    tick: int = 0,
) -> bool:
    """Cancel a pending request whose submitter is no longer a member of its team, audited.

    Only a pending request: admitted work runs on. Returns whether it was cancelled
    (False when the tick admitted it, or someone cancelled it, first).
    """
    reason = NOT_A_MEMBER
    cancelled = GpuRequest.objects.filter(pk=gpu_request.pk, state=GpuRequest.State.PENDING).update(
        state=GpuRequest.State.CANCELLED,
        end_reason=reason,
        status_code="not-a-member",
        status_message=reason,
        queue_position=None,
        updated_at=now,
    )
    if cancelled != 1:
        return False
    Decision.objects.create(
        tick=tick,
        request=gpu_request,
        team=gpu_request.team,
        kind=Decision.Kind.END,
        code="not-a-member",
        message=reason,
    )
    audit(
        actor=actor,
        action="request.cancel",
        obj=gpu_request,
        team=gpu_request.team,
        before={"state": "pending"},
        after={"state": "cancelled", "reason": reason},
    )
    return True


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


# ---------------------------------------------------------------------------
# Admission, attempts and their ends


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
        provisioning_request = consume.consumed([attempt]).get(attempt.pk, "")
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
        allocations[attempt_id].append(tuple(fields))  # type: ignore[arg-type]
    lost = _lost_numbers(attempts)
    consumes = consume.consumed(attempts)
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
        Decision.objects.create(
            request=req,
            attempt=attempt,
            team=req.team,
            pool_id=attempt.pool_id,
            node=",".join(attempt.nodes),
            kind=Decision.Kind.END,
            code=code,
            message=f"attempt {attempt.number}: {reason}"[:500],
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


# ---------------------------------------------------------------------------
# Checkpoints (docs/checkpoints.md)


class AttemptNotRunning(Exception):
    """A checkpoint reported for an attempt that has ended."""

    def __init__(self, state: str) -> None:
        super().__init__(f"attempt is {state}")
        self.state = state


def attempt_checkpoint_record(attempt_id: int, at: datetime) -> bool:
    """Record a finished checkpoint at `at`; True when it moved `last_checkpoint_at` on.

    Only forward: an older or repeated report changes nothing (reports may arrive
    out of order), and only while the attempt is active (a stopping workload may
    still checkpoint in its grace period).
    """
    moved = (
        Attempt.objects.filter(pk=attempt_id, state__in=Attempt.ACTIVE_STATES)
        .filter(Q(last_checkpoint_at__isnull=True) | Q(last_checkpoint_at__lt=at))
        .update(last_checkpoint_at=at, checkpoints=F("checkpoints") + 1)
    )
    return moved == 1


def attempt_checkpoint_report(
    *, attempt_id: int, token: str, now: datetime | None = None
) -> Attempt:
    """A workload reports a finished checkpoint with its attempt's token.

    Raises PermissionDenied for a wrong token and for an unknown attempt alike (the
    same answer, so that nobody learns which attempt ids exist), AttemptNotRunning
    once the attempt has ended.
    """
    now = now or timezone.now()
    attempt = Attempt.objects.filter(pk=attempt_id).first()
    if attempt is None:
        expected = attempt_token(ready_token_key(), "", "", attempt_id)
    else:
        expected = attempt_token(
            ready_token_key(), attempt.namespace, attempt.workload_name, attempt.pk
        )
    if not hmac.compare_digest(token.encode(), expected.encode()) or attempt is None:
        raise PermissionDenied("bad or missing bearer token")
    if attempt.state not in Attempt.ACTIVE_STATES:
        raise AttemptNotRunning(str(attempt.state))
    if not attempt_checkpoint_record(attempt.pk, now):
        # Ended between the read and the write, or a report already newer: say which.
        attempt.refresh_from_db()
        if attempt.state not in Attempt.ACTIVE_STATES:
            raise AttemptNotRunning(str(attempt.state))
    attempt.refresh_from_db()
    return attempt


def checkpoints_release(*, limit: int = 50) -> int:
    """Delete the checkpoint storage of requests that ended for good; returns how many.

    Run by the reconciler, so a deletion that failed is tried again. Waits until no
    attempt of the request is active (a stopping pod may still write to it).
    """
    backend = get_backend()
    done = 0
    ended = (
        GpuRequest.objects.filter(
            state__in=GpuRequest.TERMINAL_STATES,
            checkpoint_interval_s__gt=0,
            checkpoints_deleted_at__isnull=True,
        )
        .exclude(attempts__state__in=Attempt.ACTIVE_STATES)
        .select_related("team")
        .order_by("id")[:limit]
    )
    for req in ended:
        try:
            backend.checkpoints_delete(req.pk, req.team.namespace)
        except Exception:  # noqa: BLE001
            log.exception("deleting the checkpoints of request %s failed; retrying later", req.pk)
            continue
        GpuRequest.objects.filter(pk=req.pk).update(checkpoints_deleted_at=timezone.now())
        done += 1
    return done


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
        # Its wait starts over, held by backoff (portal/capacity.py).
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
        if outcome not in _ENDINGS:
            return str(attempt.state)
        return _end_attempt(
            attempt, req, outcome=outcome, status=status, now=now, log_tail=log_tail
        )


def ending_words(outcome: Outcome, status: WorkloadStatus, log_tail: str = "") -> str:
    """Why an attempt ended, in words: what happened, the exit code, the cluster's reason,
    and for a failure the last line the workload printed."""
    detail = status.message
    if status.reason and status.reason not in detail and outcome != Outcome.SUCCEEDED:
        detail = f"{status.reason}: {detail}" if detail else status.reason
    if status.exit_code not in (None, 0) and f"code {status.exit_code}" not in detail:
        detail = f"exit code {status.exit_code}" + (f", {detail}" if detail else "")
    words = _REASONS[outcome] + (f" ({detail})" if detail else "")
    last = [line for line in log_tail.strip().splitlines() if line.strip()][-1:]
    if last and outcome in (Outcome.FAILED, Outcome.OOM, Outcome.DEVICE_ERROR):
        words += f"; last log line: {last[0].strip()[:150]}"
    return words


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
    Decision.objects.create(
        request=req,
        attempt=attempt,
        team=req.team,
        pool=attempt.pool,
        node=",".join(attempt.nodes),
        kind=Decision.Kind.END,
        code=outcome.value,
        message=f"attempt {attempt.number}: {reason}"[:500],
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
        return _end_attempt(
            attempt, req, outcome=outcome, status=status, now=now, log_tail=log_tail
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


# ---------------------------------------------------------------------------
# Quotas, classes, pools, nodes


QUOTA_FIELDS = ["nominal_milli", "borrowing_limit_milli", "lending_limit_milli", "granted_milli"]


def quota_set(
    *,
    actor: AbstractBaseUser,
    team: Team,
    pool: Pool,
    nominal_milli: int,
    borrowing_limit_milli: int | None = None,
    lending_limit_milli: int | None = None,
    granted_milli: int | None = None,
    reason: str = "",
) -> Quota:
    """Set a team's quota in a pool. Lowering it never stops running work; it only blocks new admissions."""
    is_admin = bool(getattr(actor, "is_staff", False))
    with transaction.atomic():
        quota, _ = Quota.objects.select_for_update().get_or_create(team=team, pool=pool)
        before = _snapshot(quota, QUOTA_FIELDS)
        if granted_milli is not None:
            if not is_admin:
                raise ValidationError(
                    {"granted_milli": "Only platform admins change what a team is granted."}
                )
            quota.granted_milli = granted_milli
        if not is_admin and nominal_milli > quota.granted_milli:
            raise ValidationError(
                {
                    "nominal_milli": f"At most {quota.granted_milli / 1000:g} GPUs were granted to {team.name} in {pool.name}."
                }
            )
        for field_name, value in (
            ("nominal_milli", nominal_milli),
            ("borrowing_limit_milli", borrowing_limit_milli),
            ("lending_limit_milli", lending_limit_milli),
        ):
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValidationError(
                    {field_name: "Must be a whole number of milli-GPU, 0 or more."}
                )
        quota.nominal_milli = nominal_milli
        quota.borrowing_limit_milli = borrowing_limit_milli
        quota.lending_limit_milli = lending_limit_milli
        quota.full_clean()
        quota.save()
        audit(
            actor=actor,
            action="quota.set",
            obj=quota,
            team=team,
            before=before,
            after=_snapshot(quota, QUOTA_FIELDS),
            reason=reason,
        )
    return quota


CLASS_FIELDS = [
    "band",
    "preemption",
    "min_runtime_s",
    "max_queue_s",
    "latency_objective_ms",
    "inference",
    "priority_class_name",
    "description",
    "restricted",
]


def workload_class_update(
    *,
    actor: AbstractBaseUser,
    workload_class: WorkloadClass,
    teams: Any = None,
    **changes: Any,
) -> WorkloadClass:
    """Change a class; `teams` (the teams a restricted class is open to) is audited apart."""
    with transaction.atomic():
        wc = _update(
            actor=actor,
            obj=workload_class,
            fields=CLASS_FIELDS,
            action="class.update",
            changes=changes,
        )
        if teams is not None:
            before = sorted(wc.teams.values_list("name", flat=True))
            wc.teams.set(list(teams))
            after = sorted(wc.teams.values_list("name", flat=True))
            if before != after:
                audit(
                    actor=actor,
                    action="class.teams",
                    obj=wc,
                    before={"teams": before},
                    after={"teams": after},
                )
    return wc


POOL_FIELDS = [
    "lifecycle",
    "inference_floor_milli",
    "taints",
    "node_selector",
    "time_slicing_replicas",
    "mig_layout",
    "interconnect",
    "architecture",
]


#: an autoscaled pool's settings (docs/capacity.md): audited with the others, not on the
#: settings page's form
POOL_AUTOSCALE_FIELDS = [
    "autoscaled",
    "min_nodes",
    "max_nodes",
    "node_gpus",
    "node_cpu_milli",
    "node_memory_mib",
    "idle_release_s",
]


def pool_update(*, actor: AbstractBaseUser, pool: Pool, **changes: Any) -> Pool:
    return _update(
        actor=actor,
        obj=pool,
        fields=POOL_FIELDS + POOL_AUTOSCALE_FIELDS,
        action="pool.update",
        changes=changes,
    )


def _update(
    *, actor: AbstractBaseUser, obj: Any, fields: list[str], action: str, changes: dict[str, Any]
) -> Any:
    unknown = set(changes) - set(fields)
    if unknown:
        raise ValidationError({sorted(unknown)[0]: "This field cannot be changed here."})
    with transaction.atomic():
        obj = type(obj).objects.select_for_update().get(pk=obj.pk)
        before = _snapshot(obj, fields)
        for key, value in changes.items():
            setattr(obj, key, value)
        obj.full_clean()
        obj.save()
        audit(actor=actor, action=action, obj=obj, before=before, after=_snapshot(obj, fields))
    return obj


def team_create(
    *,
    actor: AbstractBaseUser | None,
    name: str,
    namespace: str = "",
    display_name: str = "",
    weight: int = 1,
) -> Team:
    with transaction.atomic():
        team = Team(
            name=name,
            namespace=namespace or f"qm-{name}",
            display_name=display_name or name,
            weight=weight,
        )
        team.full_clean()
        team.save()
        audit(
            actor=actor,
            action="team.create",
            obj=team,
            team=team,
            after={"name": name, "namespace": team.namespace},
        )
    return team


def membership_set(
    *,
    actor: AbstractBaseUser | None,
    team: Team,
    user: AbstractBaseUser,
    role: str,
    gpu_cap_milli: int | None = None,
    source: str | None = None,
    actor_name: str = "",
) -> Membership:
    """Add `user` to `team` or change their role and cap, audited with before and after.

    `source` marks who manages the membership (Membership.Source); None keeps it.
    """
    if role not in Membership.Role.values:
        raise ValidationError({"role": f"Choose one of {', '.join(Membership.Role.values)}."})
    if gpu_cap_milli is not None and (not isinstance(gpu_cap_milli, int) or gpu_cap_milli < 0):
        raise ValidationError({"gpu_cap_milli": "Must be a whole number of milli-GPU, 0 or more."})
    with transaction.atomic():
        m, created = Membership.objects.select_for_update().get_or_create(
            user=user, team=team, defaults={"role": role}
        )
        before = None if created else {"user": user.get_username(), **_snapshot(m, MEMBER_FIELDS)}
        m.role, m.gpu_cap_milli = role, gpu_cap_milli
        if source is not None:
            m.source = source
        m.save()
        audit(
            actor=actor,
            action="membership.set",
            obj=m,
            team=team,
            before=before,
            after={"user": user.get_username(), **_snapshot(m, MEMBER_FIELDS)},
            actor_name=actor_name,
        )
    return m


MEMBER_FIELDS = ["role", "gpu_cap_milli", "source"]


def membership_add(
    *, actor: AbstractBaseUser, team: Team, username: str, role: str = Membership.Role.MEMBER
) -> Membership:
    """Add an existing user to a team (leads add members; admins choose the role)."""
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.filter(username=username, is_active=True).first()
    if user is None:
        raise ValidationError({"username": f"No active user is called {username!r}."})
    if Membership.objects.filter(user=user, team=team).exists():
        raise ValidationError({"username": f"{username} is already in team {team.name}."})
    return membership_set(actor=actor, team=team, user=user, role=role)


def membership_remove(
    *, actor: AbstractBaseUser | None, membership: Membership, actor_name: str = ""
) -> int:
    """Remove a member from a team and cancel their pending requests in it, audited.

    Admitted and running work runs on (stopping it is a separate, explicit act).
    Returns how many pending requests were cancelled. A request the tick admits
    concurrently is left admitted; one submitted concurrently is cancelled by the
    next tick (`scheduling.members`).
    """
    now = timezone.now()
    with transaction.atomic():
        m = (
            Membership.objects.select_for_update()
            .select_related("team", "user")
            .get(pk=membership.pk)
        )
        pending = GpuRequest.objects.filter(
            team=m.team, submitted_by_id=m.user_id, state=GpuRequest.State.PENDING
        ).select_related("team")
        cancelled = sum(
            gpu_request_cancel_not_member(r, actor=actor, now=now) for r in pending.order_by("id")
        )
        audit(
            actor=actor,
            action="membership.remove",
            obj=m,
            team=m.team,
            before={
                "user": m.user.get_username(),
                **_snapshot(m, MEMBER_FIELDS),
            },
            after={"cancelled_requests": cancelled},
            actor_name=actor_name,
        )
        m.delete()
    return cancelled


# ---------------------------------------------------------------------------
# Single sign-on: the identity provider's groups become memberships and roles


SSO_ACTOR = "sso"


def sso_roles_from_groups(groups: Any) -> tuple[dict[str, str], set[str]]:
    """Map IdP groups through settings.OIDC_GROUP_MAP: ({team name: role}, {platform roles}).

    A user in several groups of one team gets the highest role (lead over member).
    """
    names = {g for g in groups if isinstance(g, str)} if isinstance(groups, list | tuple) else set()
    teams: dict[str, str] = {}
    platform: set[str] = set()
    for group, team, role in settings.OIDC_GROUP_MAP:
        if group not in names:
            continue
        if team == "*":
            platform.add(role)
        elif teams.get(team) != Membership.Role.LEAD:
            teams[team] = role
    return teams, platform


def sso_sync(*, user: AbstractBaseUser, groups: Any) -> dict[str, list[str]]:
    """Bring the user's memberships and platform roles in line with their IdP groups.

    Called at each sign-in. Memberships the map grants are created or changed (and marked
    `source=sso`; a member's cap stays); SSO memberships the groups no longer grant are
    removed through membership_remove, which cancels the member's pending requests there.
    Memberships leads added by hand are left alone. Platform roles (admin = staff,
    auditor = settings.AUDITOR_GROUP) follow the groups only for the roles the map names;
    a superuser is never demoted. Teams the map names but that do not exist are skipped
    and returned under "unknown_teams" (admins create teams; sign-in never does).
    """
    from django.contrib.auth.models import Group

    wanted, platform = sso_roles_from_groups(groups)
    teams = {t.name: t for t in Team.objects.filter(name__in=list(wanted))}
    changes: dict[str, list[str]] = {"set": [], "removed": [], "unknown_teams": []}
    changes["unknown_teams"] = sorted(set(wanted) - set(teams))
    with transaction.atomic():
        current = {
            m.team.name: m for m in Membership.objects.select_related("team").filter(user=user)
        }
        for name, role in sorted(wanted.items()):
            if name not in teams:
                continue
            m = current.get(name)
            if m is not None and m.role == role and m.source == Membership.Source.SSO:
                continue
            membership_set(
                actor=None,
                actor_name=SSO_ACTOR,
                team=teams[name],
                user=user,
                role=role,
                gpu_cap_milli=m.gpu_cap_milli if m is not None else None,
                source=Membership.Source.SSO,
            )
            changes["set"].append(f"{name}:{role}")
        for name, m in sorted(current.items()):
            if m.source == Membership.Source.SSO and name not in wanted:
                membership_remove(actor=None, membership=m, actor_name=SSO_ACTOR)
                changes["removed"].append(name)

        mapped = {role for _, team, role in settings.OIDC_GROUP_MAP if team == "*"}
        before = {"admin": bool(user.is_staff), "auditor": False}  # type: ignore[attr-defined]
        auditors, _ = Group.objects.get_or_create(name=settings.AUDITOR_GROUP)
        before["auditor"] = user.groups.filter(pk=auditors.pk).exists()  # type: ignore[attr-defined]
        after = dict(before)
        if "admin" in mapped and not user.is_superuser:  # type: ignore[attr-defined]
            after["admin"] = "admin" in platform
        if "auditor" in mapped:
            after["auditor"] = "auditor" in platform
        if after != before:
            if after["admin"] != before["admin"]:
                user.is_staff = after["admin"]  # type: ignore[attr-defined]
                user.save(update_fields=["is_staff"])
            if after["auditor"] and not before["auditor"]:
                user.groups.add(auditors)  # type: ignore[attr-defined]
            elif before["auditor"] and not after["auditor"]:
                user.groups.remove(auditors)  # type: ignore[attr-defined]
            user._qm_auditor = after["auditor"]  # type: ignore[attr-defined]
            audit(
                actor=None,
                actor_name=SSO_ACTOR,
                action="user.roles",
                obj=user,  # type: ignore[arg-type]
                before={"user": user.get_username(), **before},
                after={"user": user.get_username(), **after},
            )
    return changes


def node_cordon(*, actor: AbstractBaseUser, node: Node, reason: str = "") -> Node:
    return _node_maintenance(
        actor=actor, node=node, cordoned=True, draining=False, action="node.cordon", reason=reason
    )


def node_return(*, actor: AbstractBaseUser, node: Node, reason: str = "") -> Node:
    with transaction.atomic():
        node = _node_maintenance(
            actor=actor,
            node=node,
            cordoned=False,
            draining=False,
            action="node.return",
            reason=reason,
        )
        if node.maintenance_reason:
            # Cordoned on the cluster too by a validation or rollout (docs/lifecycle.md):
            # uncordon it there, or the next inventory sync would cordon it again.
            node.maintenance_reason = ""
            node.save(update_fields=["maintenance_reason", "updated_at"])
            name = node.name
            transaction.on_commit(lambda: backend_call("node_patch", name, {}, False))
    return node


def node_drain(*, actor: AbstractBaseUser, node: Node, reason: str = "") -> Node:
    """Cordon the node and stop what runs there; stopped work requeues, not charged."""
    with transaction.atomic():
        node = _node_maintenance(
            actor=actor, node=node, cordoned=True, draining=True, action="node.drain", reason=reason
        )
        attempt_ids = Allocation.objects.filter(device__node=node, active=True).values_list(
            "attempt_id", flat=True
        )
        for attempt in Attempt.objects.filter(
            pk__in=set(attempt_ids), state__in=Attempt.ACTIVE_STATES
        ):
            attempt_stop(attempt, reason="drained")
    return node


def _node_maintenance(
    *,
    actor: AbstractBaseUser,
    node: Node,
    cordoned: bool,
    draining: bool,
    action: str,
    reason: str = "",
) -> Node:
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node.pk)
        before = _snapshot(node, ["cordoned", "draining"])
        node.cordoned, node.draining = cordoned, draining
        node.save(update_fields=["cordoned", "draining", "updated_at"])
        audit(
            actor=actor,
            action=action,
            obj=node,
            before=before,
            after=_snapshot(node, ["cordoned", "draining"]),
            reason=reason,
        )
    return node


# ---------------------------------------------------------------------------
# Inventory


def inventory_sync(*, nodes: list[Any] | None = None) -> int:
    """Bring Node and Device rows in line with what the backend reports. Returns nodes seen."""
    inventory = nodes if nodes is not None else get_backend().inventory()
    pools = {p.name: p for p in Pool.objects.all()}
    seen = 0
    with transaction.atomic():
        for inv in inventory:
            pool = pools.get(inv.pool)
            if pool is None:
                continue
            node, _ = Node.objects.update_or_create(
                name=inv.name,
                defaults={
                    "pool": pool,
                    "cpu_milli": inv.cpu_milli,
                    "memory_mib": inv.memory_mib,
                    "labels": inv.labels,
                    "taints": [{"key": k, "value": v, "effect": e} for k, v, e in inv.taints],
                    "ready": inv.ready,
                    "interconnect": inv.interconnect,
                    "software": lifecycle.node_software(inv.labels),
                },
            )
            if inv.cordoned and not node.cordoned:
                Node.objects.filter(pk=node.pk).update(cordoned=True)
            for d in inv.devices:
                Device.objects.update_or_create(
                    node=node,
                    index=d.index,
                    defaults={
                        # Only the node agent knows UUIDs on a real cluster: never blank one out.
                        **({"uuid": d.uuid} if d.uuid else {}),
                        "model": d.model,
                        "memory_mib": d.memory_mib,
                        "partitioning": d.partitioning,
                        "replicas": d.replicas,
                        "mig_instances": [
                            {"profile": m.profile, "start": m.start, "size": m.size}
                            for m in d.mig_instances
                        ],
                        "healthy": d.healthy,
                    },
                )
            seen += 1
    return seen


# ---------------------------------------------------------------------------
# Node agent


CRITICAL_XID_QUARANTINE = "critical Xid"


def node_agent_report(*, report: dict[str, Any], now: datetime | None = None) -> Node:
    """Store a node agent's report: heartbeat, per-device NVML readings, health, quarantine."""
    now = now or timezone.now()
    name = report.get("node")
    if not isinstance(name, str) or not name:
        raise ValidationError({"node": "The report must name its node."})
    devices = report.get("devices")
    if not isinstance(devices, list):
        raise ValidationError({"devices": "The report must list its devices."})
    with transaction.atomic():
        node = Node.objects.select_for_update().filter(name=name).first()
        if node is None:
            raise ValidationError({"node": f"Node {name} is not in the inventory."})
        node.last_heartbeat, node.agent_report = now, report
        node.save(update_fields=["last_heartbeat", "agent_report", "updated_at"])
        by_index = {d.index: d for d in node.devices.all()}
        for raw in devices:
            if not isinstance(raw, dict) or raw.get("index") not in by_index:
                continue
            _device_report(by_index[raw["index"]], raw, now)
    return node


def _device_report(device: Device, raw: dict[str, Any], now: datetime) -> None:
    xids = [x for x in raw.get("xids") or [] if isinstance(x, dict)]
    critical = [x for x in xids if x.get("critical")]
    device.memory_used_mib = max(0, int(raw.get("memory_used_mib") or 0))
    device.utilization_pct = max(0, int(raw.get("utilization_pct") or 0))
    device.processes = [p for p in raw.get("processes") or [] if isinstance(p, dict)][:50]
    device.xids = (device.xids + xids)[-20:]
    device.agent_healthy = bool(raw.get("healthy", True))
    device.reported_at = now
    if raw.get("uuid"):
        device.uuid = str(raw["uuid"])[:100]
    if critical and not device.quarantined:
        device.quarantined = True
        device.health_reason = f"{CRITICAL_XID_QUARANTINE} {critical[-1].get('xid')}"
        Decision.objects.create(
            node=device.node.name,
            kind=Decision.Kind.END,
            code="quarantined",
            message=f"{device}: quarantined after Xid {critical[-1].get('xid')}; an admin must clear it",
            facts={"xids": critical},
        )
    elif not device.agent_healthy:
        device.health_reason = str(
            raw.get("error") or "the node agent reports the device unhealthy"
        )[:200]
    device.save()


def device_clear_quarantine(*, actor: AbstractBaseUser, device: Device) -> Device:
    """An admin returns a quarantined device to service (a healthy report never does)."""
    with transaction.atomic():
        device = Device.objects.select_for_update().select_related("node").get(pk=device.pk)
        if not device.quarantined:
            raise ValidationError({"device": f"{device} is not quarantined."})
        before = _snapshot(device, ["quarantined", "health_reason"])
        device.quarantined, device.health_reason = False, ""
        device.save(update_fields=["quarantined", "health_reason"])
        audit(
            actor=actor,
            action="device.clear-quarantine",
            obj=device,
            before=before,
            after=_snapshot(device, ["quarantined", "health_reason"]),
        )
    return device


# ---------------------------------------------------------------------------
# Scheduling profiles


def _profile_errors(exc: scheduling_profile.ProfileError) -> ValidationError:
    key = "__all__" if exc.key == "profile" else exc.key
    return ValidationError({key: exc.message})


def _check_profile(name: str, version: int, knobs: dict[str, Any]) -> dict[str, Any]:
    """Every knob, checked by the core's own rules (`scheduling.profile`)."""
    try:
        return scheduling_profile.parse({"name": name, "version": version, **knobs}).dump()
    except scheduling_profile.ProfileError as exc:
        raise _profile_errors(exc) from None


def _knobs_of(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k in scheduling_profile.KNOBS}


def policy_profile_create(
    *, actor: AbstractBaseUser | None, name: str, knobs: dict[str, Any] | None = None
) -> PolicyProfile:
    """A new, inactive profile: the shipped default's knobs with `knobs` over them."""
    base = dict(scheduling_profile.load().knobs)
    checked = _check_profile(name, 1, {**base, **(knobs or {})})
    with transaction.atomic():
        if PolicyProfile.objects.filter(name=name).exists():
            raise ValidationError({"name": "A profile with this name exists."})
        row = PolicyProfile.objects.create(
            name=name, version=1, knobs=_knobs_of(checked), updated_by=_real(actor)
        )
        audit(
            actor=actor,
            action="profile.create",
            obj=row,
            after={"name": name, "version": 1, **row.knobs},
        )
    return row


def policy_profile_update(
    *, actor: AbstractBaseUser | None, profile: PolicyProfile, knobs: dict[str, Any]
) -> PolicyProfile:
    """Change some knobs; the version goes up by one when anything changed. Audited with the
    changed knobs, old and new."""
    with transaction.atomic():
        row = PolicyProfile.objects.select_for_update().get(pk=profile.pk)
        checked = _knobs_of(_check_profile(row.name, row.version, {**row.knobs, **knobs}))
        old = row.profile().knobs
        changed = sorted(k for k in checked if checked[k] != old.get(k))
        if not changed:
            return row
        before = {"version": row.version, **{k: old.get(k) for k in changed}}
        row.knobs = checked
        row.version += 1
        row.updated_by = _real(actor)
        row.save()
        audit(
            actor=actor,
            action="profile.update",
            obj=row,
            before=before,
            after={"version": row.version, **{k: checked[k] for k in changed}},
        )
    return row


def policy_profile_activate(
    *, actor: AbstractBaseUser | None, profile: PolicyProfile
) -> PolicyProfile:
    """Make this the profile the tick runs; the one active before stops being active."""
    with transaction.atomic():
        rows = list(PolicyProfile.objects.select_for_update().order_by("pk"))
        row = next((r for r in rows if r.pk == profile.pk), None)
        if row is None:
            raise ValidationError({"__all__": "No such profile."})
        _check_profile(row.name, row.version, row.knobs)
        was = next((r for r in rows if r.active), None)
        if was is not None and was.pk == row.pk:
            return row
        # Off first: the database allows one active row at a time.
        PolicyProfile.objects.filter(active=True).update(active=False)
        PolicyProfile.objects.filter(pk=row.pk).update(
            active=True, updated_by=_real(actor), updated_at=timezone.now()
        )
        row.refresh_from_db()
        audit(
            actor=actor,
            action="profile.activate",
            obj=row,
            before={"active": str(was) if was else None},
            after={"active": str(row)},
        )
    return row


def policy_profile_ensure() -> PolicyProfile:
    """The active profile; when none is (a new or emptied database), the shipped default is
    stored and made active. Idempotent: the tick and the demo call it."""
    row = PolicyProfile.objects.filter(active=True).first()
    if row is not None:
        return row
    shipped = scheduling_profile.load()
    with transaction.atomic():
        row = PolicyProfile.objects.filter(name=shipped.name).first()
        if row is None:
            row = policy_profile_create(actor=None, name=shipped.name, knobs=dict(shipped.knobs))
        return policy_profile_activate(actor=None, profile=row)


def _real(actor: Any) -> Any:
    return actor if actor is not None and getattr(actor, "is_authenticated", False) else None


# ---------------------------------------------------------------------------
# A user's own settings: notification preferences, saved request templates


def notification_preference_set(*, user: AbstractBaseUser, **fields: Any) -> NotificationPreference:
    pref, _ = NotificationPreference.objects.get_or_create(user=user)
    for key, value in fields.items():
        setattr(pref, key, value)
    pref.full_clean()
    pref.save()
    return pref


#: most saved templates per user
MAX_TEMPLATES = 50


def request_template_save(
    *, user: AbstractBaseUser, name: str, fields: dict[str, Any]
) -> RequestTemplate:
    """Save (or replace) the user's template of this name: the submit form's fields as posted."""
    name = name.strip()
    if not name:
        raise ValidationError({"template_name": "Give the template a name."})
    problem = validation.json_problem(fields)
    if problem:
        raise ValidationError({"template_name": problem})
    with transaction.atomic():
        existing = RequestTemplate.objects.select_for_update().filter(user=user, name=name).first()
        if existing is None and RequestTemplate.objects.filter(user=user).count() >= MAX_TEMPLATES:
            raise ValidationError(
                {"template_name": f"At most {MAX_TEMPLATES} templates: delete one first."}
            )
        tpl, _ = RequestTemplate.objects.update_or_create(
            user=user, name=name, defaults={"fields": fields}
        )
    return tpl


def request_template_delete(*, user: AbstractBaseUser, template: RequestTemplate) -> None:
    if template.user_id != user.pk:
        raise PermissionDenied("Not your template.")
    template.delete()
