"""Teams, memberships and quotas: who may use which pool, and how much."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from portal import access
from portal.models import GpuRequest, Membership, Pool, Quota, Team
from portal.services.audit import audit, field_values, update_audited
from portal.services.requests import gpu_request_cancel, gpu_request_cancel_not_member

QUOTA_FIELDS = ["nominal_milli", "borrowing_limit_milli", "lending_limit_milli", "granted_milli"]


def quota_set(
    *,
    actor: User | None,
    team: Team,
    pool: Pool,
    nominal_milli: int,
    borrowing_limit_milli: int | None = None,
    lending_limit_milli: int | None = None,
    granted_milli: int | None = None,
    reason: str = "",
) -> Quota:
    """Set a team's quota in a pool. Lowering it never stops running work; it only blocks new admissions.

    `actor` None is the system (`manage.py config apply`), which sets what an admin may."""
    is_admin = actor is None or access.is_admin(actor)
    team_live(team)
    with transaction.atomic():
        quota, _ = Quota.objects.select_for_update().get_or_create(team=team, pool=pool)
        before = field_values(quota, QUOTA_FIELDS)
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
            after=field_values(quota, QUOTA_FIELDS),
            reason=reason,
        )
    return quota


def team_create(
    *,
    actor: User | None,
    name: str,
    namespace: str = "",
    display_name: str = "",
    weight: int = 1,
    max_pending: int = 0,
    groups: dict[str, str] | None = None,
    config_managed: bool = False,
) -> Team:
    with transaction.atomic():
        team = Team(
            name=name,
            namespace=namespace or f"qm-{name}",
            display_name=display_name or name,
            weight=weight,
            max_pending=max_pending,
            groups=groups or {},
            config_managed=config_managed,
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


def team_live(team: Team) -> None:
    """Refuse a retired team, naming the field: it takes no new requests or quota."""
    if team.retired_at is not None:
        raise ValidationError({"team": f"Team {team.name} is retired; choose another team."})


@dataclass(frozen=True)
class TeamRetireImpact:
    """What retiring a team does to its work (as `pools.RetireImpact`, without a move)."""

    running: int
    pending: int


def team_retire_impact(team: Team) -> TeamRetireImpact:
    return TeamRetireImpact(
        running=GpuRequest.objects.filter(team=team, state__in=GpuRequest.ACTIVE_STATES).count(),
        pending=GpuRequest.objects.filter(team=team, state=GpuRequest.State.PENDING).count(),
    )


def team_retire_sentence(team: Team, impact: TeamRetireImpact) -> str:
    return (
        f"{impact.running} running request(s) of team {team.name} run to the end; "
        f"{impact.pending} waiting request(s) are cancelled."
    )


def team_retire(*, actor: User | None, team: Team, confirm: bool) -> tuple[TeamRetireImpact, int]:
    """Retire a team (admins): no new requests; its waiting requests are cancelled; running
    work runs to its end; its quotas leave the cohort (the snapshot skips them). Nothing is
    deleted, so the audit and decision logs keep it. Refused without `confirm` when work is in
    it. Returns the impact and how many waiting requests were cancelled."""
    impact = team_retire_impact(team)
    if (impact.running or impact.pending) and not confirm:
        raise ValidationError({"confirm": team_retire_sentence(team, impact)})
    with transaction.atomic():
        # the team row lock orders this against submits, which take it too
        row = Team.objects.select_for_update().get(pk=team.pk)
        if row.retired_at is not None:
            raise ValidationError({"team": f"Team {row.name} is retired already."})
        # locked so that a tick admitting one of them waits, then finds it cancelled
        pending = list(
            GpuRequest.objects.select_for_update()
            .filter(team=row, state=GpuRequest.State.PENDING)
            .order_by("id")
        )
        for req in pending:
            gpu_request_cancel(user=actor, gpu_request=req, reason="its team was retired")  # type: ignore[arg-type]
        row.retired_at = timezone.now()
        row.save(update_fields=["retired_at"])
        audit(
            actor=actor,
            action="team.retire",
            obj=row,
            team=row,
            before={"retired_at": None},
            after={
                "retired_at": row.retired_at,
                "running": impact.running,
                "cancelled": len(pending),
            },
        )
    return impact, len(pending)


TEAM_FIELDS = ["display_name", "namespace", "weight", "max_pending", "groups"]


def team_update(*, actor: User | None, team: Team, **changes: object) -> Team:
    """Change a team's name for people, namespace, fair-share weight or pending limit (admins)."""
    return update_audited(
        actor=actor, obj=team, fields=TEAM_FIELDS, action="team.update", changes=changes
    )


def membership_set(
    *,
    actor: User | None,
    team: Team,
    user: User,
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
        before = (
            None if created else {"user": user.get_username(), **field_values(m, MEMBER_FIELDS)}
        )
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
            after={"user": user.get_username(), **field_values(m, MEMBER_FIELDS)},
            actor_name=actor_name,
        )
    return m


MEMBER_FIELDS = ["role", "gpu_cap_milli", "source"]


def membership_add(
    *, actor: User, team: Team, username: str, role: str = Membership.Role.MEMBER
) -> Membership:
    """Add an existing user to a team (leads add members; admins choose the role)."""
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.filter(username=username, is_active=True).first()
    if user is None:
        raise ValidationError({"username": f"No active user is called {username!r}."})
    if Membership.objects.filter(user=user, team=team).exists():
        raise ValidationError({"username": f"{username} is already in team {team.name}."})
    return membership_set(actor=actor, team=team, user=user, role=role)


def membership_remove(*, actor: User | None, membership: Membership, actor_name: str = "") -> int:
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
                **field_values(m, MEMBER_FIELDS),
            },
            after={"cancelled_requests": cancelled},
            actor_name=actor_name,
        )
        m.delete()
    return cancelled
