"""The decision log, the audit log and policy versions, filtered and paged."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Q, QuerySet

from portal import access
from portal.access import AnyUser
from portal.models import (
    AuditEvent,
    Decision,
    Node,
    PolicyVersion,
    Pool,
    Quota,
    Team,
    WorkloadClass,
)


def policy_versions() -> QuerySet[PolicyVersion]:
    """Applied policy changes, newest first (admins and auditors: the caller checks)."""
    return PolicyVersion.objects.order_by("-number")


def decision_list(
    user: AnyUser,
    *,
    team: Team | None = None,
    request_id: int | None = None,
    node: str = "",
    kind: str = "",
) -> QuerySet[Decision]:
    """Decisions the user may see (their teams'; everything for admins), newest first."""
    qs = Decision.objects.select_related("team", "pool")
    if not access.sees_all(user):
        qs = qs.filter(team__in=access.teams_for(user))
    if team is not None:
        qs = qs.filter(team=team)
    if request_id is not None:
        qs = qs.filter(request_id=request_id)
    if node:
        qs = qs.filter(node__contains=node)
    if kind:
        qs = qs.filter(kind=kind)
    # Ids grow with time: "-id" is newest first and lets deep pages walk the primary key.
    return qs.order_by("-id")


def audit_list(
    *,
    team: Team | None = None,
    action: str = "",
    actor: str = "",
    q: str = "",
    since: datetime | None = None,
    until: datetime | None = None,
) -> QuerySet[AuditEvent]:
    """The audit log, newest first (admin-only; leads see their team's through `team`).

    `q` is free text: it matches who, the action (its code or its words), the team, the
    reason, the values before and after, and the names of pools, nodes, classes and users.
    `since`/`until` bound the time (until is exclusive).
    """
    qs = AuditEvent.objects.select_related("team")
    if team is not None:
        qs = qs.filter(team=team)
    if action:
        qs = qs.filter(action=action)
    if actor:
        qs = qs.filter(actor_name=actor)
    if since is not None:
        qs = qs.filter(created_at__gte=since)
    if until is not None:
        qs = qs.filter(created_at__lt=until)
    if q:
        qs = qs.filter(_audit_text(q))
    return qs.order_by("-created_at", "-id")


def team_changes(team: Team) -> QuerySet[AuditEvent]:
    """What people changed in a team (quotas, members, cancels, serving scale), newest
    first; not each submission: those have their own lists, and a busy team's would push
    the rest out of sight within minutes."""
    return audit_list(team=team).exclude(action="request.submit")


def _audit_text(q: str) -> Q:
    """Events whose words mention `q`: a few queries for the named objects, none per event."""
    from django.contrib.auth import get_user_model

    from portal.selectors.audit_words import ACTIONS

    match = (
        Q(actor_name__icontains=q)
        | Q(action__icontains=q)
        | Q(action__in=[a for a, words in ACTIONS.items() if q.lower() in words])
        | Q(team__name__icontains=q)
        | Q(reason__icontains=q)
        | Q(before__icontains=q)
        | Q(after__icontains=q)
    )
    pools = list(Pool.objects.filter(name__icontains=q).values_list("pk", flat=True))
    named = {
        "pool": pools,
        "node": list(
            Node.objects.filter(Q(name__icontains=q) | Q(pool__in=pools)).values_list(
                "pk", flat=True
            )
        ),
        "quota": list(Quota.objects.filter(pool__in=pools).values_list("pk", flat=True)),
        "workloadclass": list(
            WorkloadClass.objects.filter(name__icontains=q).values_list("pk", flat=True)
        ),
        "user": list(
            get_user_model().objects.filter(username__icontains=q).values_list("pk", flat=True)
        ),
    }
    for object_type, ids in named.items():
        if ids:
            match |= Q(object_type=object_type, object_id__in=[str(i) for i in ids])
    return match
