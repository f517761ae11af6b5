"""Submitting and cancelling GPU requests: the checks a request passes before it is stored."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Count, Max, Q
from django.utils import timezone

from portal import access
from portal.lib import contract, shapes, wake, words
from portal.models import (
    Attempt,
    DeviceProfile,
    GpuRequest,
    Membership,
    Node,
    PolicyProfile,
    Pool,
    ShapeHistory,
    Team,
    WorkloadClass,
)
from portal.services import serving_spec
from portal.services.attempts import attempt_stop, end_decision
from portal.services.audit import audit
from scheduling import workload
from scheduling.members import NOT_A_MEMBER

MAX_GPUS_PER_NODE = shapes.MAX_GPUS_PER_NODE


def validate_env(env: Any) -> dict[str, str]:
    """The launch contract's env rules (portal.lib.contract), as a ValidationError naming `env`."""
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
    if access.is_admin(user):
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
    return int(priority)


def _check_team_live(team: Team) -> None:
    if team.retired_at is not None:
        raise ValidationError({"team": f"Team {team.name} is retired; it takes no new requests."})


def check_class(
    team: Team, workload_class: WorkloadClass, kind: str = "batch", pool: Pool | None = None
) -> None:
    """The class takes this request: not retired, granted to the team, bound to its kind and
    pool."""
    if workload_class.retired_at is not None:
        raise ValidationError(
            {"workload_class": f"The {workload_class.name} class is retired; choose another."}
        )
    refusal = workload_class.refusal(team=team, kind=kind, pool=pool)
    if refusal is not None:
        field, message = refusal
        raise ValidationError({field: message})


def gpu_request_submit(
    *,
    user: User,
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
    _check_team_live(team)
    check_class(team, workload_class, kind, pool)
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
    resources_check(serving, cpu_milli=cpu_milli, memory_mib=memory_mib)
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
        # again under the lock: a retire that committed since the first check wins
        _check_team_live(team)
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


def resources_check(pools: list[Pool], *, cpu_milli: int, memory_mib: int) -> None:
    """Refuse CPU or memory that no node of `pools` could give a pod, naming the resource.

    The core would otherwise take it and reject it a tick later as a GPU shape that fits
    nowhere. A pool without nodes yet (autoscaled from zero) could get any size: no check."""
    largest: dict[int, dict[str, int]] = {
        row["pool"]: row
        for row in Node.objects.filter(pool__in=pools)
        .values("pool")
        .annotate(cpu=Max("cpu_milli"), memory=Max("memory_mib"))
    }
    if not pools or any(p.pk not in largest for p in pools):
        return
    where = f"pool {pools[0].name}" if len(pools) == 1 else "any pool that offers this profile"
    cpu = max(row["cpu"] for row in largest.values())
    if isinstance(cpu_milli, int) and cpu_milli > cpu:
        raise ValidationError(
            {
                "cpu_milli": f"No node in {where} has more than {words.cpus(cpu)}: "
                f"ask for at most {cpu} (millicores)."
            }
        )
    mem = max(row["memory"] for row in largest.values())
    if isinstance(memory_mib, int) and memory_mib > mem:
        raise ValidationError(
            {
                "memory_mib": f"No node in {where} has more than {words.memory(mem)} of memory: "
                f"ask for at most {mem} MiB."
            }
        )


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


def _check_pending_caps(*, user: User, team: Team) -> None:
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


def gpu_request_cancel(*, user: User, gpu_request: GpuRequest, reason: str = "") -> GpuRequest:
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
        end_decision(req, code="cancelled", message=req.end_reason)
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
    actor: User | None,
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
    end_decision(gpu_request, code="not-a-member", message=reason, tick=tick)
    audit(
        actor=actor,
        action="request.cancel",
        obj=gpu_request,
        team=gpu_request.team,
        before={"state": "pending"},
        after={"state": "cancelled", "reason": reason},
    )
    return True
